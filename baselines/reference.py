"""The reference planner: one whole sequence per micro-batch, no packing, no slicing.

It exists so the pipeline (plan -> simulator -> runtime) can be exercised end to end before
any real method, and as the plainest possible point of comparison. Sequences are dealt to
data-parallel replicas round-robin in batch order; each replica runs 1F1B (or interleaved
1F1B when vpp > 1) over its sequences with the static CP degree of ``parallel``.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.batch import Batch
from slimpack.plan import Group, Phase, Plan, Segment, Slice, Unit
from slimpack.planning.method import MethodSpec
from slimpack.planning.options import check_time_limit
from slimpack.planning.setup import PlanSetup


@dataclass(frozen=True, kw_only=True)
class ReferenceOptions:
    context: int | None = None
    """Accepted for a uniform interface: sequences are planned whole, as the batch gives them."""
    time_limit_s: float | None = 1.0
    """Accepted for a uniform interface: the planner is a single linear pass."""

    def __post_init__(self) -> None:
        check_time_limit("reference", self.time_limit_s)


def plan(batch: Batch, setup: PlanSetup, options: ReferenceOptions) -> Plan:
    """No memory verdict of its own: ``plan_method`` gives it the simulator's."""
    parallel = setup.parallel
    per_replica: list[list[Slice]] = [[] for _ in range(parallel.dp)]
    for i, seq in enumerate(batch.sequences):
        slices = per_replica[i % parallel.dp]
        segment = Segment(seq_id=seq.seq_id, start=0, end=seq.length)
        slices.append(Slice(slice_id=len(slices), segments=(segment,)))
    groups = []
    for dp_rank, slices in enumerate(per_replica):
        if not slices:
            continue
        units = tuple(Unit(slice_ids=(s.slice_id,)) for s in slices)
        groups.append(Group(
            group_id=dp_rank,
            ranks=parallel.replica_ranks(dp_rank),
            tp=parallel.tp, cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp,
            slices=tuple(slices), forward_units=units, backward_units=units,
            schedule="interleaved" if parallel.vpp > 1 else "1f1b",
        ))
    return Plan(
        method="reference", model=setup.model.name, parallel=parallel,
        sequence_lengths={s.seq_id: s.length for s in batch.sequences},
        phases=(Phase(groups=tuple(groups)),),
        zero_stage=setup.training.zero_stage,
    ).validate()


METHOD = MethodSpec(
    name="reference", planner=plan, options=ReferenceOptions, compared=False,
    summary="one whole sequence per micro-batch, no packing (the plainest plan; a plumbing check)",
    source="this suite")
