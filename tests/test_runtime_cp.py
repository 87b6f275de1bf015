"""Context parallelism (ring, both shardings) and Ulysses, end to end on real gloo processes:
loss and every parameter gradient equal the unsliced single-process model's.

All plans of one world size run in one job of processes (:func:`runtime.many.run_plans`):
starting processes costs far more than these plans' steps.

Tolerance: fp32 on CPU. CP only reorders sums (attention pieces per rank, dK/dV
reduce-scattered, gradients summed over cp and dp ranks); the issue's bounds are 1e-6
relative on the loss and 1e-5 relative on every parameter's gradient (max over parameters).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from slimpack.plan import Group, Phase, Plan, Segment, Slice, Unit
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.cp_layout import shard_slice
from slimpack.runtime.launch import RunResult
from slimpack.runtime.layout import GroupLayout
from slimpack.runtime.many import run_plans
from slimpack.runtime.reference import reference_step
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs import ParallelSpec, model_preset

pytestmark = pytest.mark.slow
LOSS_TOL, GRAD_TOL = 1e-6, 1e-5
TINY = model_preset("tiny")  # 4 layers, hidden 64, 4 heads, 2 K/V heads (GQA)

# One long document (96 tokens) cut into three slices, each packed with short documents of
# very different lengths (27, 13, 5, 2 tokens) and a 1-token document alone in a slice (some
# cp ranks hold no row of it). Forward and backward MicroPacks differ (SlimPack-style).
_SLICES = [[(0, 0, 40), (1, 0, 13)], [(0, 40, 72), (2, 0, 5), (3, 0, 2)],
           [(0, 72, 96), (4, 0, 27)], [(5, 0, 1)]]
_FWD, _BWD = [[0], [1, 2], [3]], [[3], [2], [1], [0]]
# A second replica's batch: other documents, other cuts.
_SLICES_B = [[(0, 0, 30), (1, 0, 9)], [(0, 30, 61), (2, 0, 17)], [(3, 0, 44)]]
_FWD_B, _BWD_B = [[0, 1], [2]], [[2], [1], [0]]


def _group(group_id: int, ranks: tuple[int, ...], slices_spec, fwd, bwd, *, base: int,
           cp: int, pp: int = 1, vpp: int = 1, sharding: str = "per-sequence",
           kind: str = "ring", lengths: dict[int, int]) -> Group:
    slices = []
    for i, segs in enumerate(slices_spec):
        segments = tuple(Segment(seq_id=base + s, start=a, end=b) for s, a, b in segs)
        for seg in segments:
            lengths[seg.seq_id] = max(lengths.get(seg.seq_id, 0), seg.end)
        slices.append(Slice(slice_id=i, segments=segments))
    return Group(group_id=group_id, ranks=ranks, cp=cp, pp=pp, vpp=vpp, slices=tuple(slices),
                 forward_units=tuple(Unit(slice_ids=tuple(u)) for u in fwd),
                 backward_units=tuple(Unit(slice_ids=tuple(u)) for u in bwd),
                 schedule="asymmetric", cp_sharding=sharding, cp_kind=kind)


def _plan(parallel: ParallelSpec, phases: list[list[dict]]) -> Plan:
    """``phases``: per phase, per group the keyword arguments of :func:`_group`."""
    lengths: dict[int, int] = {}
    built, gid = [], 0
    for phase in phases:
        groups = []
        for kw in phase:
            groups.append(_group(gid, lengths=lengths, **kw))
            gid += 1
        built.append(Phase(groups=tuple(groups)))
    return Plan(method="test-cp", parallel=parallel, sequence_lengths=lengths,
                phases=tuple(built)).validate()


def _one_group(cp: int, *, pp: int = 1, vpp: int = 1, sharding: str = "per-sequence",
               kind: str = "ring") -> Plan:
    return _plan(ParallelSpec(cp=cp, pp=pp, vpp=vpp),
                 [[dict(ranks=tuple(range(cp * pp)), slices_spec=_SLICES, fwd=_FWD, bwd=_BWD,
                        base=0, cp=cp, pp=pp, vpp=vpp, sharding=sharding, kind=kind)]])


def _dp_merge_plan() -> Plan:
    # Phase 1: two replicas at cp2 (dp2 x cp2); phase 2: all four ranks merged into one cp4
    # group for the long document (listed out of rank order, as a merge may list them).
    replica = dict(slices_spec=_SLICES_B, fwd=_FWD_B, bwd=_BWD_B, cp=2,
                   sharding="per-document")
    return _plan(ParallelSpec(dp=2, cp=2), [
        [dict(ranks=(0, 1), base=100, **replica), dict(ranks=(2, 3), base=200, **replica)],
        [dict(ranks=(2, 3, 0, 1), slices_spec=_SLICES, fwd=_FWD, bwd=_BWD, base=0, cp=4,
              sharding="per-sequence")],
    ])


def _mixed_ulysses_plan() -> Plan:
    # FlexSP: a degree-2 group for the long document beside a degree-1 group, same step.
    return _plan(ParallelSpec(dp=3), [[
        dict(ranks=(1, 0), slices_spec=_SLICES, fwd=_FWD, bwd=_BWD, base=0, cp=2,
             kind="ulysses"),
        dict(ranks=(2,), slices_spec=_SLICES_B, fwd=_FWD_B, bwd=_BWD_B, base=100, cp=1,
             kind="ulysses"),
    ]])


PLANS: dict[str, Callable[[], Plan]] = {
    **{f"ring-cp{cp}-{sh}": (lambda cp=cp, sh=sh: _one_group(cp, sharding=sh))
       for cp in (2, 4) for sh in ("per-sequence", "per-document")},
    **{f"pp2-cp2-{sh}-{kind}-vpp{vpp}":
       (lambda sh=sh, kind=kind, vpp=vpp: _one_group(2, pp=2, vpp=vpp, sharding=sh, kind=kind))
       for sh, kind, vpp in (("per-sequence", "ring", 1), ("per-document", "ring", 1),
                             ("per-document", "ring", 2), ("per-sequence", "ulysses", 1))},
    "dp-merge": _dp_merge_plan,
    **{f"ulysses-cp{cp}": (lambda cp=cp: _one_group(cp, kind="ulysses")) for cp in (2, 4)},
    "ulysses-2+1": _mixed_ulysses_plan,
}


class _Executed:
    """Runs every plan of a world size in one job, the first time one of them is asked for."""

    def __init__(self) -> None:
        self.plans = {name: build() for name, build in PLANS.items()}
        self.results: dict[str, RunResult] = {}

    def __getitem__(self, name: str) -> tuple[Plan, RunResult]:
        if name not in self.results:
            world = self.plans[name].world_size
            names = [n for n, p in self.plans.items() if p.world_size == world]
            runs = run_plans([self.plans[n] for n in names], TINY, RuntimeConfig(seed=5),
                             return_grads=True, timeout_s=120)
            self.results.update(zip(names, runs, strict=True))
        return self.plans[name], self.results[name]


@pytest.fixture(scope="module")
def executed() -> _Executed:
    return _Executed()


def _check_parity(executed: _Executed, name: str) -> RunResult:
    plan, result = executed[name]
    ref = reference_step(TINY, plan.sequence_lengths, seed=5)
    assert abs(result.loss - ref.loss) <= LOSS_TOL * abs(ref.loss)
    grads = result.grads()
    assert set(grads) == set(ref.grads)
    worst = max(float((grads[n] - w).norm() / w.norm()) for n, w in ref.grads.items())
    assert worst < GRAD_TOL, f"{name}: max norm-relative gradient error {worst:.2e}"
    for param, want in ref.grads.items():  # elementwise, relative to the largest entry
        assert float((grads[param] - want).abs().max()) <= GRAD_TOL * float(want.abs().max()), \
            param
    return result


@pytest.mark.parametrize("sharding", ["per-sequence", "per-document"])
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_cp_with_kv_prefix_slices_matches_unsliced_model(executed, cp, sharding):
    result = _check_parity(executed, f"ring-cp{cp}-{sharding}")
    # The record's per-unit time is the stage's: its slowest cp rank, not the ranks' sum.
    for unit, recorded in enumerate(result.record.unit_forward_s):
        per_rank = [sum(op.end_s - op.start_s for op in r.ops if op.kind == "F" and
                        op.unit == unit) for r in result.ranks]
        assert recorded == pytest.approx(max(per_rank), rel=1e-12)


@pytest.mark.parametrize("sharding,kind,vpp", [
    ("per-sequence", "ring", 1), ("per-document", "ring", 1), ("per-document", "ring", 2),
    ("per-sequence", "ulysses", 1)])
def test_pipeline_times_cp_matches_unsliced_model(executed, sharding, kind, vpp):
    name = f"pp2-cp2-{sharding}-{kind}-vpp{vpp}"
    assert executed.plans[name].world_size == 4  # stage s owns ranks 2s, 2s+1: two cp lanes
    _check_parity(executed, name)


def test_cp_degree_changes_between_phases_dp_merge_style(executed):
    plan = executed.plans["dp-merge"]
    assert [sorted({g.cp for g in p.groups}) for p in plan.phases] == [[2], [4]]
    _check_parity(executed, "dp-merge")


@pytest.mark.parametrize("cp", [2, 4])  # 4 > num_kv_heads = 2: K/V heads are repeated
def test_ulysses_matches_unsliced_model(executed, cp):
    _check_parity(executed, f"ulysses-cp{cp}")


def test_ulysses_groups_of_different_degrees_in_one_phase(executed):
    _check_parity(executed, "ulysses-2+1")


def test_ulysses_needs_heads_divisible_by_degree():
    plan = _plan(ParallelSpec(dp=3), [[
        dict(ranks=(0, 1, 2), slices_spec=_SLICES, fwd=_FWD, bwd=_BWD, base=0, cp=3,
             kind="ulysses")]])
    with pytest.raises(ValueError, match=r"cp_kind='ulysses' needs cp=3 to divide num_heads=4"):
        check_runtime_plan(plan, TINY)


def test_a_rank_with_no_row_of_a_slice_still_joins_its_collectives(executed):
    # Slice 3 holds one token: under per-sequence cp4 three ranks hold none of it; the run
    # would hang or fail if an empty rank skipped a reduce-scatter.
    group = next(executed.plans["ring-cp4-per-sequence"].groups())
    counts = shard_slice(GroupLayout(group)[3], cp=4, cp_index=0, sharding="per-sequence").counts
    assert sorted(counts) == [0, 0, 0, 1]
    _check_parity(executed, "ring-cp4-per-sequence")


def test_tied_embeddings_across_stages_with_cp():
    # tiny-mha ties embedding and LM head: both cp ranks of stage 0 and of stage 1 hold a
    # copy, and all four copies' gradients are one logical weight's.
    spec = model_preset("tiny-mha")
    plan = _one_group(2, pp=2, sharding="per-document")
    (result,) = run_plans([plan], spec, RuntimeConfig(seed=5), return_grads=True,
                          timeout_s=120)
    ref = reference_step(spec, plan.sequence_lengths, seed=5)
    assert abs(result.loss - ref.loss) <= LOSS_TOL * abs(ref.loss)
    grads = result.grads()
    worst = max(float((grads[n] - w).norm() / w.norm()) for n, w in ref.grads.items())
    assert worst < GRAD_TOL, f"max norm-relative gradient error {worst:.2e}"
