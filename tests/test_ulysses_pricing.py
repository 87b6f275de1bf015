"""Ulysses sequence parallelism is priced as DeepSpeed-Ulysses runs (arXiv 2309.14509): linear
layers over 1/sp of the tokens at the group's tp, attention over every token with 1/(tp*sp) of
the heads, all-to-alls in between; never as a tp*sp tensor-parallel group."""

from __future__ import annotations

import pytest

from slimpack.cost import kernels
from slimpack.cost.kernel_model import default_cost_model
from slimpack.cost.model import AnalyticCostModel
from slimpack.sim.costs import unit_layer_seconds
from slimpack.specs import hardware_preset, model_preset

MODEL, HW = model_preset("llama-13b"), hardware_preset("h800-80g")
COST = default_cost_model(MODEL, HW)
PIECES = [(32768, 0), (8192, 0), (1000, 0)]


def test_degree_one_is_plain_tensor_parallelism():
    assert COST.ulysses_layer_times(PIECES, tp=4, sp=1) == COST.layer_times(PIECES, tp=4)


@pytest.mark.parametrize(("tp", "sp"), [(1, 8), (2, 4), (8, 8)])
def test_a_gpu_runs_its_token_share_and_its_head_share(tp, sp):
    tokens = sum(t for t, _ in PIECES)
    got = COST.ulysses_layer_times(PIECES, tp=tp, sp=sp)
    # Token-proportional kernels (GEMMs, elementwise, TP comm over tp only) of tokens/sp...
    token_part = COST._token_times(-(-tokens // sp), tp)
    # ...plus FlashAttention over every piece with num_heads / (tp * sp) heads.
    tiles, queries = kernels.attention_work(PIECES)
    heads = MODEL.num_heads / (tp * sp)
    attn_f = kernels.attention_seconds_of_work(HW, tiles, queries, heads=heads,
                                               head_dim=MODEL.head_dim, backward=False)
    attn_b = kernels.attention_seconds_of_work(HW, tiles, queries, heads=heads,
                                               head_dim=MODEL.head_dim, backward=True)
    assert got.forward_s == pytest.approx(token_part.forward_s + attn_f, rel=1e-12)
    assert got.backward_s == pytest.approx(token_part.backward_s + attn_b, rel=1e-12)
    # Cheaper than the old tp*sp tensor-parallel pricing, which charged all-gathers and
    # reduce-scatters over tp*sp GPUs that Ulysses never runs.
    as_tp = COST.layer_times(PIECES, tp=tp * sp)
    assert got.forward_s + got.backward_s < as_tp.forward_s + as_tp.backward_s


def test_the_simulator_adds_the_all_to_alls_and_keeps_other_cost_models_working():
    per_rank = [PIECES] + [[] for _ in range(7)]
    fwd, bwd, ideal_f, ideal_b, tokens = unit_layer_seconds(
        per_rank, model=MODEL, cost=COST, tp=1, cp=8, cp_kind="ulysses", cp_intra=True)
    layer = COST.ulysses_layer_times(PIECES, tp=1, sp=8)
    assert (ideal_f, ideal_b, tokens) == (layer.forward_s, layer.backward_s, 41_960)
    assert fwd > ideal_f and fwd - ideal_f == pytest.approx(bwd - ideal_b)  # 4 all-to-alls each
    analytic = AnalyticCostModel(model=MODEL, hardware=HW)
    f2, *_ = unit_layer_seconds(per_rank, model=MODEL, cost=analytic, tp=1, cp=8,
                                cp_kind="ulysses", cp_intra=True)
    assert f2 > 0
