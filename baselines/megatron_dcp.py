"""Megatron-Core hybrid (dynamic) context parallelism at pipeline parallelism 1.

Megatron-Core gives each document the power-of-two CP size it needs and regroups the data-
parallel x context-parallel ranks, round by round, so every rank carries about the same
``sum s^2 / cp`` (:mod:`baselines.hybrid_cp_scheduler`, the rules of its
``BalancedCPScheduler``). Here each round is a plan phase (Megatron-Core puts a barrier
between rounds), each group a set of consecutive ranks running its documents one at a time,
each document its own forward and backward (one sub-sample per ``forward_step`` in
Megatron-Core's ``hybrid_context_parallel_forward_backward``).

Megatron-Core refuses hybrid CP with pipeline parallelism (NVIDIA/Megatron-LM d98e8a64dd,
``megatron/training/arguments.py``), so this method plans pp = 1 (and vpp = 1) only and
refuses any other layout by name. Per-rank capacity ``capacity_tokens`` is Megatron-Core's
``max_seqlen_per_dp_cp_rank``; its default, ``ceil(context / cp)``, is what the layout's
static CP gives each rank (raised to ``ceil(longest / (dp * cp))`` for a longer document).
The recompute mode (Megatron-Core's is one for the run) is ours: each group's cheapest mode
that fits its longest document, escalated until the plan fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from baselines.common.finish import finish_plan
from baselines.hybrid_cp_scheduler import schedule_rounds
from slimpack.batch import Batch
from slimpack.plan import Phase, Plan
from slimpack.planning import GroupLayout, choose_recompute, num_slots, packed_group, slot_ranks, whole
from slimpack.planning.method import MethodSpec
from slimpack.planning.setup import PlanSetup
from slimpack.specs import ParallelSpec


@dataclass(frozen=True, kw_only=True)
class DCPOptions:
    context: int | None = None
    """Longest sequence the static layout is sized for; default: the batch's longest."""
    capacity_tokens: int | None = None
    """Per-rank capacity (Megatron-Core's ``max_seqlen_per_dp_cp_rank``); default
    ceil(context / parallel.cp), or ceil(longest / (dp * cp)) where that is larger."""
    time_limit_s: float | None = 1.0
    """Accepted as every method's option; the scheduler is a bounded greedy pass."""

    def __post_init__(self) -> None:
        for name in ("context", "capacity_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"megatron-dcp: {name} must be >= 1 token, got {value}")
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"megatron-dcp: time_limit_s must be >= 0, got {self.time_limit_s}")


def unpipelined(parallel: ParallelSpec) -> bool:
    """Megatron-Core's hybrid CP runs without pipeline parallelism (pp = 1, vpp = 1)."""
    return parallel.pp == 1 and parallel.vpp == 1


def plan(batch: Batch, setup: PlanSetup, options: DCPOptions) -> Plan:
    model, hardware, parallel = setup.model, setup.hardware, setup.parallel
    if not unpipelined(parallel):
        raise ValueError(f"megatron-dcp: parallel.pp={parallel.pp}, parallel.vpp="
                         f"{parallel.vpp}: Megatron-Core's hybrid context parallelism runs "
                         f"at pp = 1 and vpp = 1 only (\"Hybrid context parallelism not "
                         f"supported with pipeline parallelism\", megatron/training/"
                         f"arguments.py)")
    context = options.context or max(batch.lengths)
    ranks = num_slots(parallel)
    # Default: what static CP gives a rank, raised where a longer document (a hand-made batch;
    # the sampler splits at the context) would find too few ranks: Megatron-Core never
    # places a document needing more than every rank. A capacity given is kept (or refused).
    capacity = options.capacity_tokens or max(-(-context // parallel.cp),
                                              -(-max(batch.lengths) // ranks))
    rounds = schedule_rounds([(s.seq_id, s.length) for s in batch.sequences], capacity, ranks)
    phases, recomputes = [], {}
    for groups in rounds:
        planned = []
        for group in groups:
            group_id, cp = len(recomputes), len(group.ranks)
            recompute = choose_recompute(
                model, hardware, tokens=max(n for _, n in group.documents), schedule="1f1b",
                tp=parallel.tp, cp=cp, dp=parallel.dp, ep=parallel.ep) or "full"
            recomputes[str(group_id)] = recompute
            layout = GroupLayout(tp=parallel.tp, cp=cp, pp=1, vpp=1, schedule="1f1b",
                                 recompute=recompute)
            planned.append(packed_group(group_id, slot_ranks(parallel, group.ranks), layout,
                                        [[whole(seq_id, n)] for seq_id, n in group.documents]))
        phases.append(Phase(groups=tuple(planned)))
    return finish_plan(
        method="megatron-dcp", setup=setup,
        sequence_lengths={s.seq_id: s.length for s in batch.sequences}, phases=phases,
        metadata={"context": context, "capacity_tokens": capacity, "schedule": "1f1b",
                  "recompute_by_group": recomputes, "num_phases": len(phases)},
        escalate_recompute=True,
    )


METHOD = MethodSpec(
    name="megatron-dcp", planner=plan, options=DCPOptions, allows=unpipelined,
    layout_rule="pp = 1, vpp = 1 (Megatron-Core's hybrid CP runs without a pipeline)",
    summary="Megatron-Core hybrid CP: each document gets the power-of-two CP size it needs, "
            "ranks regrouped every round (pp = 1)",
    source="Megatron-Core hybrid context parallelism, BalancedCPScheduler (docs/methods.md)")
