"""Megatron-core dynamic context parallelism (hybrid CP), reconstructed from its description.

Rules (docs/methods.md):

* per-rank capacity ``C`` tokens (default ``context / parallel.cp``: what static CP gives each
  rank); a sequence of ``s`` tokens runs with CP size ``next_pow2(ceil(s / C))``, so short
  sequences stop paying ring-attention communication and long ones get just enough ranks;
* the dp*cp ranks of a pipeline stage (slots, :mod:`slimpack.planning.ranks`) are regrouped
  per micro-batch group into aligned power-of-two CP groups, sized so every slot carries about
  the same ``sum s^2 / cp`` (attention dominates long sequences);
* sequences whose CP size finds no room roll into the next micro-batch group (a later phase).

*Reconstructed*: the slot-allocation heuristic (one group per size class, then extra groups to
the class with the heaviest per-slot load) and the first-fit packing of each group's
sequences into micro-batches of ``cp * C`` tokens are our choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from baselines.common.finish import finish_plan
from slimpack.batch import Batch
from slimpack.plan import Phase, Plan
from slimpack.planning import (
    GroupLayout,
    aligned_blocks,
    choose_recompute,
    first_fit_decreasing,
    lpt_partition,
    next_power_of_two,
    num_slots,
    packed_group,
    schedule_for,
    slot_ranks,
    whole,
)
from slimpack.planning.method import MethodSpec
from slimpack.planning.setup import PlanSetup


@dataclass(frozen=True, kw_only=True)
class DCPOptions:
    context: int | None = None
    """Longest sequence the static layout is sized for; default: the batch's longest."""
    capacity_tokens: int | None = None
    """Per-rank capacity C; default ceil(context / parallel.cp)."""
    time_limit_s: float | None = 1.0

    def __post_init__(self) -> None:
        for name in ("context", "capacity_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"megatron-dcp: {name} must be >= 1 token, got {value}")
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"megatron-dcp: time_limit_s must be >= 0, got {self.time_limit_s}")


def cp_size(length: int, capacity: int, max_cp: int) -> int:
    return min(next_power_of_two(-(-length // capacity)), max_cp)


def _allocate_blocks(loads: dict[int, float], total_slots: int) -> dict[int, int]:
    """Blocks per CP size: one per size (largest first, while slots last), then one more to
    the size whose blocks carry the most load per slot, until no size fits."""
    blocks: dict[int, int] = {}
    used = 0
    for k in sorted(loads, reverse=True):
        if used + k <= total_slots:
            blocks[k] = 1
            used += k
    while True:
        fitting = [k for k in blocks if used + k <= total_slots]
        if not fitting:
            return blocks
        k = max(fitting, key=lambda k: (loads[k] / blocks[k], k))
        blocks[k] += 1
        used += k


def plan(batch: Batch, setup: PlanSetup, options: DCPOptions) -> Plan:
    model, hardware, parallel = setup.model, setup.hardware, setup.parallel
    context = options.context or max(batch.lengths)
    capacity = options.capacity_tokens or -(-context // parallel.cp)
    slots = num_slots(parallel)
    max_cp = 1 << (slots.bit_length() - 1)  # largest power of two <= slots
    pending = sorted(batch.sequences, key=lambda s: (-s.length, s.seq_id))
    schedule = schedule_for(parallel)
    phases, group_id, recomputes = [], 0, {}
    while pending:
        by_size: dict[int, list] = {}
        for s in pending:
            by_size.setdefault(cp_size(s.length, capacity, max_cp), []).append(s)
        loads = {k: sum(s.length**2 for s in seqs) / k for k, seqs in by_size.items()}
        blocks = _allocate_blocks(loads, slots)
        sizes = [k for k in sorted(blocks, reverse=True) for _ in range(blocks[k])]
        placement = aligned_blocks(sizes, slots)
        assert placement is not None  # _allocate_blocks keeps sum(sizes) <= slots
        groups, cursor = [], 0
        for k in sorted(blocks, reverse=True):
            seqs = by_size[k]
            parts = lpt_partition([s.length**2 / k for s in seqs], blocks[k])
            for part in parts:
                block = placement[cursor]
                cursor += 1
                if not part:
                    continue
                members = [seqs[i] for i in part]
                bins = first_fit_decreasing([s.length for s in members], max(
                    k * capacity, max(s.length for s in members)))
                mbs = [[whole(members[i].seq_id, members[i].length) for i in b] for b in bins]
                tokens = max(sum(x.num_tokens for x in mb) for mb in mbs)
                recompute = choose_recompute(
                    model, hardware, tokens=tokens, schedule=schedule, tp=parallel.tp, cp=k,
                    pp=parallel.pp, vpp=parallel.vpp, dp=parallel.dp) or "full"
                recomputes[str(group_id)] = recompute
                layout = GroupLayout(tp=parallel.tp, cp=k, pp=parallel.pp, vpp=parallel.vpp,
                                     schedule=schedule, recompute=recompute)
                groups.append(packed_group(group_id, slot_ranks(parallel, block), layout, mbs))
                group_id += 1
        phases.append(Phase(groups=tuple(groups)))
        pending = [s for k, seqs in by_size.items() if k not in blocks for s in seqs]
        pending.sort(key=lambda s: (-s.length, s.seq_id))
    return finish_plan(
        method="megatron-dcp", setup=setup,
        sequence_lengths={s.seq_id: s.length for s in batch.sequences}, phases=phases,
        metadata={"context": context, "capacity_tokens": capacity, "schedule": schedule,
                  "recompute_by_group": recomputes, "num_phases": len(phases)},
        escalate_recompute=True,
    )


METHOD = MethodSpec(
    name="megatron-dcp", planner=plan, options=DCPOptions,
    summary="Megatron-Core dynamic CP: each sequence gets the power-of-two CP size it needs",
    source="Megatron-Core dynamic context parallelism (docs/methods.md)")
