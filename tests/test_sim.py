"""The simulator against cases with known answers.

Sources: closed-form bubble ratios and activation memory from docs/cost-model.md (the SlimPipe
artifact: slimpipe p=16 n=16 v=5 m=16 -> 1.16%, interleaved p=8 v=5 m=8 -> 14.89%, llama-13b
256K activation 14.78 GiB on rank 0); WLB-LLM's imbalance degree definition.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pytest

from slimpack.cli.main import main as cli_main
from slimpack.cost import GIB, AnalyticCostModel, attention_flops, estimate_memory
from slimpack.cost.comm import CommModel
from slimpack.cost.cp_sharding import shard_pieces
from slimpack.cost.kernel_model import KernelCostModel
from slimpack.cost.model import ZERO_TIMES, PassTimes
from slimpack.plan import Phase, Plan, PlanError, Segment, Slice, Unit
from slimpack.schedules import Op, ScheduleError
from slimpack.sim import (
    DeadlockError,
    UniformCostModel,
    plot_gantt,
    simulate,
    to_chrome_trace,
    uniform_plan,
)
from slimpack.sim.costs import group_costs
from slimpack.sim.engine import run_group
from slimpack.sim.memory import group_memory
from slimpack.specs import ModelSpec, hardware_preset, model_preset

H100 = hardware_preset("h100-80g")


def _layers_model(num_layers: int) -> ModelSpec:
    return ModelSpec(name=f"u{num_layers}", num_layers=num_layers, hidden=64, ffn_hidden=128,
                     num_heads=4, num_kv_heads=4, vocab_size=128)


def _uniform_bubble(schedule: str, p: int, v: int, n: int, m: int, *, fwd: float = 1e-3,
                    bwd: float = 2e-3) -> float:
    model = _layers_model(p * v)
    plan = uniform_plan(schedule=schedule, pp=p, vpp=v, slices=n, microbatches=m)
    cost = UniformCostModel(model=model, forward_s=fwd, backward_s=bwd)
    return simulate(plan, model=model, hardware=H100, cost=cost).record.bubble_fraction


# -- closed forms ------------------------------------------------------------------------------

@pytest.mark.parametrize("p,m", [(4, 8), (8, 8), (8, 32), (2, 1)])
@pytest.mark.parametrize("costs", [(1e-3, 1e-3), (1e-3, 2e-3)])
def test_1f1b_bubble_closed_form(p, m, costs):
    assert _uniform_bubble("1f1b", p, 1, 1, m, fwd=costs[0], bwd=costs[1]) == pytest.approx(
        (p - 1) / (m + p - 1), abs=1e-9)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 3, 4), (8, 5, 16)])
def test_interleaved_bubble_closed_form(p, v, m):
    assert _uniform_bubble("interleaved", p, v, 1, m) == pytest.approx(
        (p - 1) / (v * m + p - 1), abs=1e-9)


@pytest.mark.parametrize("p,v,n,m", [(4, 2, 4, 2), (4, 1, 4, 3), (8, 2, 8, 3)])
def test_slimpipe_bubble_closed_form(p, v, n, m):
    assert _uniform_bubble("slimpipe", p, v, n, m) == pytest.approx(
        (p - 1) / (v * n * m + p - 1), abs=1e-9)


def test_slimpipe_artifact_row():
    # SlimPipe artifact: p=16, n=16, v=5, m=16 -> 1.16% (15/1295 = 1.1583%).
    bubble = _uniform_bubble("slimpipe", 16, 5, 16, 16)
    assert bubble == pytest.approx(15 / 1295, abs=1e-9)
    assert round(100 * bubble, 2) == 1.16


def test_interleaved_artifact_row():
    # SlimPipe artifact: interleaved 1F1B p=8, v=5, m=8 -> 14.89% (7/47).
    bubble = _uniform_bubble("interleaved", 8, 5, 1, 8)
    assert bubble == pytest.approx(7 / 47, abs=1e-9)
    assert round(100 * bubble, 2) == 14.89


def test_cli_uniform_json(capsys):
    rc = cli_main(["simulate", "--uniform", "--schedule", "slimpipe", "--pp", "4", "--vpp", "2",
                   "--slices", "4", "--microbatches", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["bubble_fraction"] == pytest.approx(3 / 19, abs=1e-9)
    # m=2 sequences, 1 ms forward + 2 ms backward per sequence per stage, 4 stages.
    assert out["step_time_s"] == pytest.approx(2 * 3e-3 / (1 - 3 / 19), rel=1e-9)


def test_cli_rejects_1f1b_with_vpp(capsys):
    assert cli_main(["simulate", "--uniform", "--schedule", "1f1b", "--vpp", "2"]) == 2
    assert "interleaved" in capsys.readouterr().err


# -- memory ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule,vpp,slices,seq_len", [
    ("slimpipe", 5, 16, 256 * 1024),  # the artifact's 14.78 GiB case
    ("interleaved", 5, 1, 32 * 1024),
    ("1f1b", 1, 1, 32 * 1024),
])
def test_peak_activation_matches_estimate(schedule, vpp, slices, seq_len):
    model = model_preset("llama-13b")
    plan = uniform_plan(schedule=schedule, pp=8, vpp=vpp, slices=slices, microbatches=16,
                        seq_len=seq_len, tp=8, cp=2, model=model.name)
    record = simulate(plan, model=model, hardware=H100).record
    for rank in (0, 3, 7):
        est = estimate_memory(model, seq_len=seq_len, schedule=schedule, tp=8, cp=2, pp=8,
                              vpp=vpp, slices=slices, rank=rank)
        assert record.extra["peak_activation_bytes"][rank] == pytest.approx(
            est.activation_bytes, rel=0.01)
    if schedule == "slimpipe":
        assert record.extra["peak_activation_bytes"][0] / GIB == pytest.approx(14.78, abs=0.005)


def test_oom_is_flagged():
    # llama-70b, one 128K sequence per micro-batch on tp=1: activations alone are ~ 2.7 TB.
    model = model_preset("llama-70b")
    plan = uniform_plan(schedule="1f1b", pp=4, microbatches=4, seq_len=128 * 1024)
    record = simulate(plan, model=model, hardware=H100).record
    assert record.oom
    assert max(record.peak_memory_bytes) > H100.usable_memory_bytes


# -- variable costs ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionOnlyCost:
    """1 s per TFLOP of causal attention, nothing else: hand-checkable."""

    model: ModelSpec
    hardware: object = H100
    comm: CommModel = dataclasses.field(default_factory=lambda: CommModel(hardware=H100))

    def layer_times(self, pieces: Sequence[tuple[int, int]], *, tp: int = 1,
                    recompute: str = "none") -> PassTimes:
        f = sum(attention_flops(self.model, t, p) for t, p in pieces) / 1e12 / tp
        return PassTimes(forward_s=f, backward_s=2.5 * f)

    def head_times(self, tokens: int, *, tp: int = 1, vocab_shards: int = 1) -> PassTimes:
        return ZERO_TIMES


def test_slice_level_imbalance_hand_case():
    # One sequence of 4 slices of S = 1024 tokens, no balancing. Slice i attends to i*S
    # earlier keys: attention ~ S*i*S + T with T = S(S+1)/2. Last/first forward =
    # (3S^2 + T)/T = 6.994; imbalance = 4(3S^2 + T)/(6S^2 + 4T) = 1.7498 (WLB-LLM's degree).
    model = model_preset("llama-7b")
    plan = uniform_plan(schedule="slimpipe", pp=4, slices=4, microbatches=1, seq_len=4096)
    record = simulate(plan, model=model, hardware=H100, cost=AttentionOnlyCost(model=model)).record
    s, t = 1024, 1024 * 1025 / 2
    fwd = record.unit_forward_s
    assert fwd[3] / fwd[0] == pytest.approx((3 * s * s + t) / t, rel=1e-12)
    assert fwd[3] / fwd[0] == pytest.approx(6.994, abs=1e-3)
    assert record.imbalance_degree == pytest.approx(4 * (3 * s * s + t) / (6 * s * s + 4 * t),
                                                    rel=1e-12)
    assert record.imbalance_degree == pytest.approx(1.7498, abs=1e-4)
    assert list(fwd) == sorted(fwd)  # later slices always cost more
    # Backward units run last slice first: unit 0 is the most expensive.
    assert record.unit_backward_s[0] == pytest.approx(2.5 * fwd[3], rel=1e-12)


def test_analytic_slices_later_cost_more_and_step_exceeds_ideal():
    model = model_preset("llama-7b")
    plan = uniform_plan(schedule="slimpipe", pp=4, slices=4, microbatches=4,
                        seq_len=128 * 1024, tp=8, model=model.name)
    record = simulate(plan, model=model, hardware=H100).record
    fwd = record.unit_forward_s[:4]
    assert fwd[0] < fwd[1] < fwd[2] < fwd[3]
    assert fwd[3] / fwd[0] > 2  # 128K, 32K slices: attention dominates the last slice
    assert record.step_over_ideal > 1.0
    assert 0 < record.bubble_fraction < 1
    assert 0 < record.mfu < 1


# -- context parallelism -----------------------------------------------------------------------

def slice_pieces(sl, cp, sharding):
    return shard_pieces([(seg.num_tokens, seg.start) for seg in sl.segments], cp, sharding)


def test_cp_per_document_vs_per_sequence_pieces():
    sl = Slice(slice_id=0, segments=(Segment(seq_id=0, start=0, end=8),
                                     Segment(seq_id=1, start=0, end=4)))
    # per-sequence: 12 tokens in 4 chunks of 3; rank 0 gets chunks 0 and 3, rank 1 chunks 1, 2.
    assert slice_pieces(sl, 2, "per-sequence") == [[(3, 0), (3, 1)], [(3, 3), (2, 6), (1, 0)]]
    # per-document: seq 0 in chunks of 2, seq 1 in chunks of 1.
    assert slice_pieces(sl, 2, "per-document") == [
        [(2, 0), (2, 6), (1, 0), (1, 3)], [(2, 2), (2, 4), (1, 1), (1, 2)]]
    # remainder round-robin: 5 tokens over 4 chunks -> 2,1,1,1.
    odd = Slice(slice_id=1, segments=(Segment(seq_id=2, start=0, end=5),))
    assert slice_pieces(odd, 2, "per-document") == [[(2, 0), (1, 4)], [(1, 2), (1, 3)]]


def _cp_plan(sharding: str, kind: str) -> Plan:
    base = uniform_plan(schedule="1f1b", pp=2, microbatches=2, seq_len=8192, cp=4)
    g = next(base.groups())
    packed = Slice(slice_id=0, segments=(Segment(seq_id=0, start=0, end=8192),
                                         Segment(seq_id=1, start=0, end=1024)))
    g = dataclasses.replace(g, slices=(packed,), forward_units=(Unit(slice_ids=(0,)),),
                            backward_units=(Unit(slice_ids=(0,)),), cp_sharding=sharding,
                            cp_kind=kind)
    return dataclasses.replace(base, sequence_lengths={0: 8192, 1: 1024},
                               phases=(Phase(groups=(g,)),))


def test_cp_per_document_beats_per_sequence_on_packed_slice():
    model = model_preset("llama-7b")
    cost = AttentionOnlyCost(model=model)
    seq = simulate(_cp_plan("per-sequence", "ring"), model=model, hardware=H100, cost=cost)
    doc = simulate(_cp_plan("per-document", "ring"), model=model, hardware=H100, cost=cost)
    uly = simulate(_cp_plan("per-sequence", "ulysses"), model=model, hardware=H100, cost=cost)
    f_seq, f_doc = seq.record.unit_forward_s[0], doc.record.unit_forward_s[0]
    # per-document zigzag gives every rank an equal share of each document: within 0.1% of
    # the balanced (ideal) time; per-sequence cutting leaves one rank most of the work.
    total = (attention_flops(model, 8192, 0) + attention_flops(model, 1024, 0)) / 1e12 / 4
    assert f_doc == pytest.approx(model.num_layers * total, rel=1e-3)
    assert f_seq > 1.2 * f_doc
    # Ulysses splits heads: balanced compute plus four all-to-alls per layer.
    assert uly.record.unit_forward_s[0] > model.num_layers * total


# -- DP sync, phases ---------------------------------------------------------------------------

def test_dp_sync_overlap_and_cost():
    model = model_preset("llama-7b")
    plan = uniform_plan(schedule="1f1b", pp=4, microbatches=4, seq_len=4096, tp=8, dp=4,
                        model=model.name)
    overlapped = simulate(plan, model=model, hardware=H100).record
    serial = simulate(plan, model=model, hardware=H100, overlap_dp_sync=False).record
    sync = serial.extra["dp_sync_s"]
    assert sync > 0
    # The default (kernel-level) cost model also prices the Adam step after the sync.
    step = serial.extra["optimizer_step_s"]
    assert step > 0
    assert serial.step_time_s == pytest.approx(serial.extra["compute_end_s"] + sync + step,
                                               rel=1e-9)
    assert overlapped.step_time_s < serial.step_time_s
    single = uniform_plan(schedule="1f1b", pp=4, microbatches=4, seq_len=4096, tp=8)
    assert simulate(single, model=model, hardware=H100).record.extra["dp_sync_s"] == 0


def test_phases_run_one_after_another():
    model = _layers_model(4)
    cost = UniformCostModel(model=model, forward_s=1e-3, backward_s=2e-3)
    one = uniform_plan(schedule="1f1b", pp=4, microbatches=4)
    g = next(one.groups())
    two = dataclasses.replace(one, phases=(Phase(groups=(g,)), Phase(groups=(
        dataclasses.replace(g, group_id=1),))))
    # Sequences are shared by both phases' groups here, so skip the plan's coverage check.
    t1 = simulate(one, model=model, hardware=H100, cost=cost).record.step_time_s
    t2 = simulate(two, model=model, hardware=H100, cost=cost, validate=False).record.step_time_s
    assert t2 == pytest.approx(2 * t1, rel=1e-9)


# -- malformed inputs --------------------------------------------------------------------------

def test_missing_unit_is_a_clear_error():
    plan = uniform_plan(schedule="1f1b", pp=2, microbatches=3)
    g = next(plan.groups())
    g = dataclasses.replace(g, forward_units=g.forward_units[:-1])
    bad = dataclasses.replace(plan, phases=(Phase(groups=(g,)),))
    with pytest.raises(PlanError, match="miss slices"):
        simulate(bad, model=_layers_model(2), hardware=H100)


def test_causal_cycle_is_a_clear_error():
    # Forwarding slice 1 of a sequence before slice 0 would need slice 0's KV cache first.
    plan = uniform_plan(schedule="slimpipe", pp=2, slices=2, microbatches=1)
    g = next(plan.groups())
    g = dataclasses.replace(g, forward_units=tuple(reversed(g.forward_units)))
    bad = dataclasses.replace(plan, phases=(Phase(groups=(g,)),))
    with pytest.raises(PlanError, match="out of order"):
        simulate(bad, model=_layers_model(2), hardware=H100)


def test_deadlocking_schedule_raises_naming_stuck_ops():
    plan = uniform_plan(schedule="1f1b", pp=2, microbatches=2)
    model = _layers_model(2)
    ops = [[Op("F", 0, 0), Op("B", 0, 0), Op("F", 1, 0), Op("B", 1, 0)],
           [Op("F", 0, 0), Op("F", 1, 0), Op("B", 0, 0), Op("B", 1, 0)]]
    with pytest.raises(ScheduleError, match="stage 0 stuck at op #1 B"):
        simulate(plan, model=model, hardware=H100, schedules={0: ops})
    # The engine itself (no pre-check) also stops with the stuck ops, never hangs.
    g = next(plan.groups())
    cost = UniformCostModel(model=model)
    with pytest.raises(DeadlockError, match="stage 1 stuck at op #1 F"):
        run_group(group_id=0, ops=ops, costs=group_costs(g, model=model, cost=cost,
                                                         gpus_per_node=8),
                  memory=group_memory(g, model=model, dp=1), start_s=[0.0, 0.0], record=False)


# -- traces ------------------------------------------------------------------------------------

def test_chrome_trace_and_gantt(tmp_path):
    model = model_preset("llama-7b")
    plan = uniform_plan(schedule="slimpipe", pp=2, vpp=2, slices=2, microbatches=2,
                        seq_len=8192, tp=8, dp=2, model=model.name)
    result = simulate(plan, model=model, hardware=H100, trace=True)
    trace = to_chrome_trace(result)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    compute = [e for e in spans if e["cat"] == "compute"]
    # 2 groups x 2 stages x (4 F + 4 B units) x 2 chunks
    assert len(compute) == 2 * 2 * 8 * 2
    assert {e["cat"] for e in spans} == {"compute", "send-next", "send-prev", "dp-sync",
                                         "optimizer"}
    end_us = max(e["ts"] + e["dur"] for e in spans)
    assert end_us == pytest.approx(result.record.step_time_s * 1e6, rel=1e-9)
    png = plot_gantt(result, tmp_path / "gantt.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="trace=True"):
        to_chrome_trace(simulate(plan, model=model, hardware=H100))


def test_cli_plan_file_with_trace(tmp_path, capsys):
    model = model_preset("llama-7b")
    plan = uniform_plan(schedule="interleaved", pp=2, vpp=2, microbatches=4, seq_len=4096,
                        tp=8, model=model.name)
    path = tmp_path / "plan.json"
    plan.save(path)
    trace = tmp_path / "trace.json"
    assert cli_main(["simulate", str(path), "--json", "--trace", str(trace)]) == 0
    out = json.loads(capsys.readouterr().out)
    direct = simulate(plan, model=model, hardware=H100).record
    assert out["step_time_s"] == pytest.approx(direct.step_time_s, rel=1e-12)
    assert json.loads(trace.read_text())["traceEvents"]
    assert cli_main(["simulate", str(tmp_path / "missing.json")]) == 2


def test_kernel_cost_model_is_default():
    # The validated model (docs/cost-model.md) prices every comparison unless told otherwise.
    model = model_preset("llama-7b")
    plan = uniform_plan(schedule="1f1b", pp=2, microbatches=2, seq_len=4096, tp=8)
    a = simulate(plan, model=model, hardware=H100).record
    b = simulate(plan, model=model, hardware=H100,
                 cost=KernelCostModel(model=model, hardware=H100)).record
    analytic = simulate(plan, model=model, hardware=H100,
                        cost=AnalyticCostModel(model=model, hardware=H100)).record
    assert a.step_time_s == b.step_time_s
    assert analytic.step_time_s != a.step_time_s
    assert a.tokens_per_s == pytest.approx(plan.num_tokens / a.step_time_s)
