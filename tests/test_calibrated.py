"""The calibrated cost model reads `slimpack profile` tables and prices pieces from them."""

from __future__ import annotations

import pytest

from slimpack.cost.calibrated import CalibratedCostModel, cpu_hardware, load_profile
from slimpack.cost.model import CostModel
from slimpack.runtime.profiler import ProfileConfig, ProfileRow, profile_model, write_profile_csv
from slimpack.specs import model_preset

TINY = model_preset("tiny")


def _synthetic_rows() -> list[ProfileRow]:
    """Times chosen so interpolation results are exact numbers: layer = 1e-6*t + attention,
    attention = 1e-9*t*(p + t), head = 2e-6*t; backward twice forward."""
    rows = []
    for t in (100, 200, 400):
        for p in (0, 1000):
            attn = 1e-9 * t * (p + t)
            for kind, f in (("layer", 1e-6 * t + attn), ("attention", attn)):
                rows.append(ProfileRow(kind=kind, tokens=t, prefix=p, forward_s=f,
                                       backward_s=2 * f, model="tiny", device="cpu",
                                       dtype="fp32", threads=1))
        rows.append(ProfileRow(kind="head", tokens=t, prefix=0, forward_s=2e-6 * t,
                               backward_s=4e-6 * t, model="tiny", device="cpu", dtype="fp32",
                               threads=1))
    return rows


@pytest.fixture
def cost(tmp_path) -> CalibratedCostModel:
    path = tmp_path / "calib.csv"
    write_profile_csv(_synthetic_rows(), path)
    return CalibratedCostModel.from_csv(path, model=TINY)


def test_satisfies_the_cost_model_protocol(cost):
    assert isinstance(cost, CostModel)
    assert cost.comm.p2p(0, intra_node=True) == pytest.approx(cpu_hardware().intra_node_latency_s)


def test_grid_points_are_reproduced(cost):
    t = cost.layer_times([(200, 1000)])
    assert t.forward_s == pytest.approx(1e-6 * 200 + 1e-9 * 200 * 1200)
    assert t.backward_s == pytest.approx(2 * t.forward_s)


def test_packed_pieces_sum_attention_per_document_over_one_linear_pass(cost):
    # 100 + 100 tokens packed: linear over 200 tokens, attention of two 100-token documents.
    t = cost.layer_times([(100, 0), (100, 0)])
    assert t.forward_s == pytest.approx(1e-6 * 200 + 2 * 1e-9 * 100 * 100)


def test_interpolates_between_and_scales_beyond_the_grid(cost):
    mid = cost.layer_times([(300, 500)]).forward_s
    lo, hi = cost.layer_times([(200, 500)]).forward_s, cost.layer_times([(400, 500)]).forward_s
    assert lo < mid < hi
    assert mid == pytest.approx((lo + hi) / 2)
    big = cost.head_times(800).forward_s
    assert big == pytest.approx(2e-6 * 800)  # head FLOPs are linear in tokens
    assert cost.head_times(400, tp=2).forward_s == pytest.approx(2e-6 * 400 / 2)
    full = cost.layer_times([(200, 0)], recompute="full")
    assert full.backward_s == pytest.approx(3 * full.forward_s)


def test_profile_for_another_model_is_rejected(tmp_path):
    path = tmp_path / "calib.csv"
    write_profile_csv(_synthetic_rows(), path)
    with pytest.raises(ValueError, match="measured for model 'tiny'"):
        CalibratedCostModel.from_csv(path, model=model_preset("small"))


def test_missing_or_malformed_profile_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_profile(tmp_path / "none.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("kind,tokens,prefix,forward_s,backward_s,model,device,dtype,threads\n"
                   "layer,ten,0,1,1,tiny,cpu,fp32,1\n")
    with pytest.raises(ValueError, match="line 2"):
        load_profile(bad)


def test_real_profile_round_trip(tmp_path):
    config = ProfileConfig(tokens=(16, 32), prefixes=(0, 16), repeats=1, warmup=0)
    rows = profile_model(TINY, config)
    assert {r.kind for r in rows} == {"layer", "attention", "head"}
    assert all(r.forward_s > 0 and r.backward_s > 0 for r in rows)
    path = tmp_path / "calib.csv"
    write_profile_csv(rows, path)
    cost = CalibratedCostModel.from_csv(path, model=TINY)
    assert cost.layer_times([(24, 8)]).forward_s > 0


def test_a_profile_prices_the_recipe_it_is_given(cost):
    """The GPU check simulates the runtime's step as executed: no optimizer state, so the
    simulated peak drops by exactly the model states' optimizer share."""
    import dataclasses

    from slimpack.cost.model import training_of
    from slimpack.runtime.capabilities import as_run_training
    from slimpack.runtime.examples import EXAMPLES
    from slimpack.sim import simulate
    from slimpack.sim.memory import stage_state_bytes

    as_run = dataclasses.replace(cost, training=as_run_training("fp32"))
    assert training_of(cost).optimizer == "megatron"
    assert training_of(as_run).optimizer == "none" and training_of(as_run).grad_dtype == "fp32"
    plan = next(iter(EXAMPLES.values()))(pp=1, dp=1, scale=1)
    peaks = [max(simulate(plan, model=TINY, hardware=c.hardware, cost=c).record
                 .peak_memory_bytes) for c in (cost, as_run)]
    states = [max(stage_state_bytes(TINY, tp=1, cp=1, pp=1, dp=1, vocab_parallel_pp=False,
                                    training=training_of(c))) for c in (cost, as_run)]
    assert states[0] > states[1] > 0
    assert peaks[0] - peaks[1] == pytest.approx(states[0] - states[1], rel=1e-9)
    with pytest.raises(ValueError, match="dtype must be bf16 or fp32"):
        as_run_training("fp16")
