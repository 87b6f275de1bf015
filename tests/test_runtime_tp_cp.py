"""Tensor parallelism (with sequence parallelism) and context parallelism in one group, on real
gloo processes (world 4, ranks ordered (cp, tp), tp fastest): loss and every parameter gradient
(tp shards gathered whole) equal the unsliced single-process model's, for hand-built plans and
for registered planners' plans at tp2 (Megatron, Megatron dynamic CP, SlimPack DP-Merge,
FlexSP).

Composition: each cp rank holds its zigzag rows of every slice; sequence parallelism splits
those cp-local rows over the tp ranks; after the column-parallel QKV, ring CP all-gathers K/V
of the tp-local heads over the ranks with the same tp index, and Ulysses splits the heads each
tp rank holds again over the cp ranks.

Tolerances are the issue's (fp32, CPU): loss within 1e-6 relative, every gradient within 1e-5
norm-relative (max over parameters); only the order of sums differs from the unsliced model.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Group, Phase, Plan, Segment, Slice, Unit
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.cp_layout import shard_slice
from slimpack.runtime.layout import GroupLayout
from slimpack.runtime.many import run_plans
from slimpack.runtime.parity import parity
from slimpack.runtime.reference import reference_step
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

pytestmark = pytest.mark.slow
TINY = model_preset("tiny")  # 4 layers, hidden 64, 4 heads, 2 K/V heads (GQA)

# A 96-token document in three slices packed with documents of 13, 5, 2 and 27 tokens, and a
# 1-token document alone in the last slice (one cp rank holds no row of it, so its tp pair has
# zero sequence-parallel rows). Forward and backward MicroPacks differ (SlimPack-style).
_SLICES = [[(0, 0, 40), (1, 0, 13)], [(0, 40, 72), (2, 0, 5), (3, 0, 2)],
           [(0, 72, 96), (4, 0, 27)], [(5, 0, 1)]]
_FWD, _BWD = [[0], [1, 2], [3]], [[3], [2], [1], [0]]
# A second replica's batch: other documents, other cuts.
_SLICES_B = [[(0, 0, 30), (1, 0, 9)], [(0, 30, 61), (2, 0, 17)], [(3, 0, 44)]]
_FWD_B, _BWD_B = [[0, 1], [2]], [[2], [1], [0]]


def _group(group_id: int, ranks: tuple[int, ...], *, cp: int, base: int, lengths: dict,
           slices_spec=_SLICES, fwd=_FWD, bwd=_BWD, **fields) -> Group:
    slices = []
    for i, segs in enumerate(slices_spec):
        segments = tuple(Segment(seq_id=base + s, start=a, end=b) for s, a, b in segs)
        for seg in segments:
            lengths[seg.seq_id] = max(lengths.get(seg.seq_id, 0), seg.end)
        slices.append(Slice(slice_id=i, segments=segments))
    return Group(group_id=group_id, ranks=ranks, tp=2, cp=cp, slices=tuple(slices),
                 forward_units=tuple(Unit(slice_ids=tuple(u)) for u in fwd),
                 backward_units=tuple(Unit(slice_ids=tuple(u)) for u in bwd),
                 schedule="asymmetric", **fields)


def _tp2_cp2_plan(*, sharding: str = "per-sequence", kind: str = "ring",
                  recompute: str = "none", offload: float = 0.0) -> Plan:
    parallel = ParallelSpec(tp=2, cp=2)
    lengths: dict[int, int] = {}
    group = _group(0, parallel.replica_ranks(0), cp=2, base=0, lengths=lengths,
                   cp_sharding=sharding, cp_kind=kind, recompute=recompute, offload=offload)
    return Plan(method="test-tp-cp", parallel=parallel, sequence_lengths=lengths,
                phases=(Phase(groups=(group,)),)).validate()


def test_plan_puts_tp_fastest_and_one_cp_rank_holds_no_row_of_the_last_slice():
    plan = _tp2_cp2_plan()
    group = next(plan.groups())
    assert group.ranks == (0, 1, 2, 3) and group.stage_ranks(0) == (0, 1, 2, 3)
    counts = shard_slice(GroupLayout(group)[3], cp=2, cp_index=0,
                         sharding="per-sequence").counts
    assert sorted(counts) == [0, 1]


def _dp_merge_plan() -> Plan:
    # Phase 1: two tp2 replicas (cp1); phase 2: both merged into one tp2 x cp2 group for the
    # long document. Rank 2 moves from lane 0 to lane 2 of its stage; its tp peer stays 3.
    lengths: dict[int, int] = {}
    replica = dict(cp=1, slices_spec=_SLICES_B, fwd=_FWD_B, bwd=_BWD_B, lengths=lengths)
    phases = (Phase(groups=(_group(0, (0, 1), base=100, **replica),
                            _group(1, (2, 3), base=200, **replica))),
              Phase(groups=(_group(2, (0, 1, 2, 3), cp=2, base=0, lengths=lengths,
                                   cp_sharding="per-document"),)))
    return Plan(method="test-tp-dp-merge", parallel=ParallelSpec(tp=2, dp=2),
                sequence_lengths=lengths, phases=phases).validate()


PLANS: dict[str, Callable[[], Plan]] = {
    **{f"tp2-ring-cp2-{sh}": (lambda sh=sh: _tp2_cp2_plan(sharding=sh))
       for sh in ("per-sequence", "per-document")},
    # 4 heads / tp2 = 2 per tp rank, 1 per (tp, cp) rank; its single K/V head is repeated.
    "tp2-ulysses2": lambda: _tp2_cp2_plan(kind="ulysses"),
    # Full recompute reruns each layer in backward, its tp and cp collectives included.
    **{f"tp2-ring-cp2-{mode}-offload": (lambda mode=mode: _tp2_cp2_plan(
        sharding="per-document", recompute=mode, offload=0.5)) for mode in ("selective", "full")},
    "tp2-ulysses2-full": lambda: _tp2_cp2_plan(kind="ulysses", recompute="full"),
    "tp2-dp-merge-cp2": _dp_merge_plan,
}

# Registered planners at tp2 on 4 ranks, each with the (tp, cp, cp_kind, cp_sharding) groups
# per phase it is here for (a planner change that stops emitting them fails the test).
OUTLIER = (900, 40, 17, 90, 5, 60, 8, 33)  # one document far above the others
MIXED = (300, 40, 17, 90, 5, 120, 60, 8, 33, 150)
PLANNERS = {
    # Megatron-LM: static tp2 x cp2, per-document (THD) sharding.
    "megatron": (dict(tp=2, cp=2), MIXED, 320, [[(2, 2, "ring", "per-document")]]),
    # Megatron dynamic CP under tp2: a cp2 phase and a phase of two cp1 groups.
    "megatron-dcp": (dict(tp=2, cp=2), MIXED, 320,
                     [[(2, 2, "ring", "per-sequence")], [(2, 1, "ring", "per-sequence")]]),
    # SlimPack DP-Merge under tp2: the two tp2 replicas merged into tp2 x cp2 for the outlier.
    "slimpack": (dict(tp=2, dp=2), OUTLIER, 1024,
                 [[(2, 2, "ring", "per-sequence")], [(2, 1, "ring", "per-sequence")]]),
    # FlexSP under tp2: one Ulysses group of degree 2 over both tp2 replicas.
    "flexsp": (dict(tp=2, dp=2), OUTLIER, 1024, [[(2, 2, "ulysses", "per-sequence")]]),
}


def _planned(method: str) -> Plan:
    parallel, lengths, context, _ = PLANNERS[method]
    tiny, h100 = TINY, hardware_preset("h100-80g")
    return plan_method(method, Batch.from_lengths(lengths), tiny, h100,
                       ParallelSpec(**parallel), default_cost_model(tiny, h100),
                       context=context)


@pytest.fixture(scope="module")
def executed() -> dict:
    """Every plan above (all world 4) in one job of processes: start-up dominates a step."""
    plans = {name: build() for name, build in PLANS.items()}
    plans.update({f"planner-{m}": _planned(m) for m in PLANNERS})
    for plan in plans.values():
        check_runtime_plan(plan, TINY, world_size=4)
    runs = run_plans(list(plans.values()), TINY, RuntimeConfig(seed=7), return_grads=True,
                     timeout_s=180)
    return {name: (plans[name], run) for name, run in zip(plans, runs, strict=True)}


@pytest.mark.parametrize("name", list(PLANS))
def test_tp_with_cp_matches_unsliced_model(executed, name):
    plan, result = executed[name]
    ref = reference_step(TINY, plan.sequence_lengths, seed=7)
    check = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert check.ok, check.describe()
    assert result.record.num_gpus == 4


@pytest.mark.parametrize("method", list(PLANNERS))
def test_planner_plan_with_tp_and_cp_matches_unsliced_model(executed, method):
    plan, result = executed[f"planner-{method}"]
    shape = [sorted({(g.tp, g.cp, g.cp_kind, g.cp_sharding) for g in p.groups})
             for p in plan.phases]
    assert sorted(shape) == sorted(PLANNERS[method][3]), shape
    ref = reference_step(TINY, plan.sequence_lengths, seed=7)
    check = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert check.ok, f"{method}: {check.describe()}"
