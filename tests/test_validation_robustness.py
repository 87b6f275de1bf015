"""The robustness experiment: perturbed kernel-grounded costs, bands of the headline ratios."""

from __future__ import annotations

import pandas as pd
import pytest

from repro.experiments import robustness as rb
from slimpack.cost.kernel_model import KernelCostModel
from slimpack.specs import hardware_preset, model_preset


def test_sixteen_corners_plus_nominal_and_quick_is_a_subset():
    corners = rb.corners()
    assert len(corners) == 17 and corners[0]["gemm_scale"] == 1.0
    assert {c["network_scale"] for c in corners[1:]} == {0.5, 1.5}
    quick = rb.points(quick=True)
    assert all(p in rb.points(quick=False) for p in quick)


def test_perturbations_move_the_cost_model_in_the_stated_direction():
    model, hw = model_preset("llama-7b"), hardware_preset("h800")
    base = KernelCostModel(model=model, hardware=hw)
    slow_gemm = KernelCostModel(model=model, hardware=hw, gemm_scale=0.85)
    slow_bwd = KernelCostModel(model=model, hardware=hw, attention_bwd_scale=0.75)
    pieces = [(32768, 0)]
    assert slow_gemm.linear_times(32768).forward_s == pytest.approx(
        base.linear_times(32768).forward_s / 0.85, rel=0.02)  # launch cost is not scaled
    assert slow_bwd.attention_times(pieces).backward_s == pytest.approx(
        base.attention_times(pieces).backward_s / 0.75)
    assert slow_bwd.attention_times(pieces).forward_s == base.attention_times(pieces).forward_s
    slow_net = KernelCostModel(model=model, hardware=hw, network_scale=0.5)
    assert slow_net.comm.p2p(1e9, intra_node=False) > 1.9 * base.comm.p2p(1e9, intra_node=False)
    with pytest.raises(ValueError, match="gemm_scale"):
        KernelCostModel(model=model, hardware=hw, gemm_scale=0.0)


def test_slimpack_band_from_two_real_corners():
    pts = [p for p in rb.points(quick=True) if p["comparison"] == "slimpack-vs-megatron-256k"][:2]
    rows = [{**row, **p} for p in pts for row in rb.run_point(p)]
    claim = rb.claims(pd.DataFrame(rows))[0]
    assert claim.claim_id == "slimpack-vs-megatron-256k-band"
    assert claim.reproduced > 1.0 and claim.verdict == "reproduced"
    assert "winner changes: no" in claim.text
    # The SlimPack-over-Megatron band is a bracket: full-causal samples do more attention.
    assert [name for name, _ in claim.bracket] == ["megatron", "megatron-causal"]
    assert claim.bracket[1][1] > claim.reproduced
