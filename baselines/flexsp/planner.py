"""FlexSP (arXiv 2412.01523) as a planner: heterogeneous Ulysses SP groups per micro-batch.

1. Sort the batch; for each micro-batch count M from M_min (the batch over the pool's memory)
   to M_min+4, cut the sorted sequences into M consecutive micro-batches balanced by tokens
   (linear-partition DP); when no such M fits, the same window from the first M that does.
2. Per micro-batch, bucket the lengths (DP, Q=16) and choose SP groups: the greedy homogeneous
   answer first, then the MILP with HiGHS, warm-started from the greedy answer and bounded by
   a node limit (deterministic work, so every machine plans the same batch the same way);
   keep whichever is faster at true lengths. The wall-clock ``time_limit_s`` is only a safety
   net: when it is reached the incumbents so far are kept and ``metadata['stopped_by']``
   says ``time-limit`` (then, and only then, the plan depends on the machine's speed).
3. Keep the M with the smallest total estimated time. Each micro-batch is one phase whose
   groups (degree d = CP size, ``cp_kind='ulysses'``) tile the dp*cp slots.

The slots are the (dp, cp) positions of ``parallel``; tp and pp are kept (FlexSP itself runs
tp = pp = 1 with ZeRO-3: the auto-parallel search finds that configuration). FlexSP has no
static CP: a layout with cp > 1 is planned, and returned, as its SP pool of dp*cp slots
(``sp_pool_layout``), and model states are sharded over every slot, as the distributed
optimizer (or ZeRO-3) of that pool shards them.

When no micro-batching fits memory even with full recompute, the planner falls back to one
sequence per phase on all slots and says so: ``metadata['fallback']`` holds the reason
(absent otherwise) and ``estimated_seconds`` still prices the fallback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from baselines.common.finish import finish_plan
from baselines.flexsp.assignment import Assignment, SPGroup, greedy, milp, ulysses_degrees
from baselines.flexsp.bucketing import dp_buckets
from baselines.flexsp.constants import FlexSPConstants, from_cost_model, paper_a100_gpt7b
from slimpack.batch import Batch
from slimpack.cost.model import CostModel, training_of
from slimpack.plan import Phase, Plan
from slimpack.planning import (
    WALL_CLOCK_FALLBACK,
    Deadline,
    GroupLayout,
    aligned_blocks,
    contiguous_partition,
    lpt_partition,
    num_slots,
    packed_group,
    slot_ranks,
    whole,
)
from slimpack.planning.setup import PlanSetup
from slimpack.specs import ParallelSpec
from slimpack.specs.recompute import AUTO, RECOMPUTE_MODES, check_recompute

CONSTANT_SOURCES = ("cost-model", "paper-a100-gpt7b")
MIP_MAX_NODES = 1
"""Default node limit per micro-batch MILP (*reconstructed*: FlexSP's paper solves with SCIP
for 5-15 s and gives no limit; see docs/methods.md for how this value was measured)."""


@dataclass(frozen=True, kw_only=True)
class FlexSPOptions:
    context: int | None = None
    """Accepted for a uniform interface; FlexSP never packs to a fixed length."""
    num_buckets: int = 16
    """Q of the DP bucketing (the paper's value)."""
    extra_microbatch_counts: int = 4
    """Try M_min .. M_min + this many micro-batch counts."""
    time_limit_s: float | None = 60.0
    """Wall-clock safety net for the whole search (the greedy answer is always available);
    the node limit, not this, bounds the work in normal use."""
    mip_max_nodes: int = MIP_MAX_NODES
    """Branch-and-bound nodes per micro-batch MILP: the deterministic work bound."""
    mip_sub_mip_heuristics: bool = True
    """HiGHS's RINS and RENS at the root: most of the MILP's time and most of its gain over
    the greedy answer (docs/methods.md); off makes FlexSP plan about 5x faster."""
    milp_counts: int = 1
    """Micro-batch counts solved with the MILP: the best ones by the greedy estimate (see
    :func:`milp_counts`); ``extra_microbatch_counts + 1`` solves every count; 0 runs no MILP
    (the greedy homogeneous answer for every count: not FlexSP's solver, for sweeps that
    cannot afford a HiGHS root per plan, 5-50 s on a loaded 2-core machine)."""
    mip_rel_gap: float = 1e-2
    constants: str = "cost-model"
    recompute: str = "auto"
    """``auto``: the cheapest of none/selective/full with which the longest sequence fits
    the largest SP group (FlexSP itself trains without recompute where memory allows)."""

    def __post_init__(self) -> None:
        if self.num_buckets < 1:
            raise ValueError(f"flexsp: num_buckets must be >= 1, got {self.num_buckets}")
        if self.extra_microbatch_counts < 0:
            raise ValueError("flexsp: extra_microbatch_counts must be >= 0")
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"flexsp: time_limit_s must be >= 0, got {self.time_limit_s}")
        if isinstance(self.mip_max_nodes, bool) or not isinstance(self.mip_max_nodes, int) or (
                self.mip_max_nodes < 0):
            raise ValueError(f"flexsp: mip_max_nodes must be an integer >= 0, got "
                             f"{self.mip_max_nodes!r}")
        if not isinstance(self.mip_sub_mip_heuristics, bool):
            raise ValueError(f"flexsp: mip_sub_mip_heuristics must be true or false, got "
                             f"{self.mip_sub_mip_heuristics!r}")
        if isinstance(self.milp_counts, bool) or not isinstance(self.milp_counts, int) or (
                self.milp_counts < 0):
            raise ValueError(f"flexsp: milp_counts must be an integer >= 0, got "
                             f"{self.milp_counts!r}")
        check_recompute("flexsp", self.recompute, allow_auto=True)
        if self.constants not in CONSTANT_SOURCES:
            raise ValueError(f"flexsp: constants must be one of {CONSTANT_SOURCES}, "
                             f"got {self.constants!r}")


def _solve_microbatch(lengths: list[int], slots: int, k: FlexSPConstants, opts: FlexSPOptions,
                      time_left_s: float, degrees: list[int]) -> Assignment | None:
    """Greedy, then the node-limited MILP, both over the Ulysses ``degrees``; ``time_left_s``
    is the safety net's remainder (the MILP is skipped once it is spent, never shortened by a
    share of it)."""
    best = greedy(lengths, slots, k, degrees=degrees)
    if time_left_s > 0:
        buckets = dp_buckets(lengths, opts.num_buckets)
        exact = milp(lengths, buckets, slots, k, time_limit_s=time_left_s, warm=best,
                     mip_rel_gap=opts.mip_rel_gap, max_nodes=opts.mip_max_nodes,
                     sub_mip_heuristics=opts.mip_sub_mip_heuristics, degrees=degrees)
        if exact is not None and (best is None or exact.seconds < best.seconds):
            best = exact
    return best


def sp_pool_layout(parallel: ParallelSpec) -> ParallelSpec:
    """``parallel`` with its cp folded into dp: FlexSP's pool of dp*cp slots (same world)."""
    if parallel.cp == 1:
        return parallel
    return dataclasses.replace(parallel, cp=1, dp=parallel.dp * parallel.cp)


def zero_stage_of(cost: CostModel) -> int:
    """The ZeRO stage the simulator will charge for ``cost`` (cost models without a
    TrainingSpec are priced with the distributed optimizer, ZeRO-1)."""
    return training_of(cost).zero_stage


def _one_per_microbatch(lengths: list[int], top: int, k: FlexSPConstants) -> list[Assignment]:
    """Last resort: every sequence alone in a group of the largest Ulysses degree ``top``
    (always valid; memory is the simulator's to report)."""
    return [Assignment(groups=(SPGroup(degree=top, members=(0,)),),
                       seconds=k.seq_seconds(n, top), source="fallback") for n in lengths]


def _fallback_reason(lengths: list[int], k: FlexSPConstants, top: int, slots: int,
                     recompute: str, capacity: float) -> str:
    """Why no micro-batching fits, in numbers (for ``metadata['fallback']``)."""
    if k.memory_budget_bytes <= 0:
        return (f"model states leave no activation memory on a GPU (recompute {recompute}, "
                f"states sharded {slots} ways); each sequence runs alone on {top} slots")
    return (f"longest sequence {max(lengths)} tokens exceeds the {int(capacity)} tokens an SP "
            f"group of {top} GPUs holds (recompute {recompute}); each sequence runs alone on "
            f"{top} slots")


GROWTH = 1.25
"""Factor by which the count grows (at least by one) per check once the wall-clock safety net
has expired (:func:`first_fitting_count`)."""


def first_fitting_count(lengths: list[int], last: int, fits: Callable[[list[int]], bool], *,
                        expired: Callable[[], bool] = lambda: False) -> int | None:
    """The smallest micro-batch count above ``last`` whose token-balanced runs of ``lengths``
    (sorted) all ``fit``; None when not even one sequence per micro-batch does.

    FlexSP raises its count one at a time until every micro-batch fits (the authors' solver,
    ``flexSPOptimizer.get_min_valid_microbatch_num``, PKU-DAIR/Hetu-Galvatron); so does this,
    at one greedy answer per run per count. Fitting is not monotone in the count (a
    token-balanced cut can put one long sequence too many into a run), so growing the count
    geometrically, as this did before, overshoots: llama-13b Common Crawl, 512 x 64K on 64
    slots, grew 31 -> 38 -> 47 -> 58 where 46 fits, at a 10% longer estimated step. Only once
    ``expired()`` (the planner's wall-clock safety net, never set in the harness) does the
    count grow by :data:`GROWTH` per check, so a CLI plan stays within its limit; the plan
    then says it was cut (``stopped_by``)."""
    m = last
    while m < len(lengths):
        m = min(len(lengths), max(m + 1, int(m * GROWTH)) if expired() else m + 1)
        if all(fits([lengths[i] for i in run]) for run in contiguous_partition(lengths, m)
               if run):
            return m
    return None


def _units(seqs: list, pp: int) -> list[list]:
    """A group's sequences as one packed micro-batch; with pp > 1 (not in FlexSP, which runs
    without pipelining) split into up to pp token-balanced packs so the pipeline can fill."""
    parts = lpt_partition([s.length for s in seqs], min(pp, len(seqs)))
    return [[whole(seqs[i].seq_id, seqs[i].length) for i in sorted(p)] for p in parts if p]


Solve = Callable[[list[int], float], Assignment | None]
"""One micro-batch's SP groups from its lengths and the safety net's remaining seconds
(None: it does not fit)."""
Search = tuple[float, int, list[list[int]], list[Assignment]]
"""(estimated seconds, micro-batch count, runs of sorted indices, one answer per run)."""


def search_microbatches(lengths: list[int], tries: list[int], deadline: Deadline,
                        solve: Solve) -> Search | None:
    """FlexSP's outer loop: for each micro-batch count M in ``tries``, cut the sorted
    ``lengths`` into M token-balanced consecutive runs, solve each run, and keep the M with
    the smallest total estimate. None when no M has every run solved. Every M is tried
    unless the wall-clock safety net ``deadline`` has expired (see :func:`stopped_by`)."""
    best: Search | None = None
    for m in tries:
        if best is not None and deadline.expired:
            break
        runs = contiguous_partition(lengths, m)
        answers: list[Assignment] = []
        for run in runs:
            if not run:
                continue
            answer = solve([lengths[i] for i in run], deadline.remaining_s)
            if answer is None:
                break
            answers.append(answer)
        else:
            total = sum(a.seconds for a in answers)
            if best is None or total < best[0]:
                best = (total, m, [r for r in runs if r], answers)
    return best


def milp_counts(lengths: list[int], tries: list[int], keep: int,
                greedy_solve: Callable[[list[int]], Assignment | None]) -> list[int]:
    """The micro-batch counts worth a MILP: the ``keep`` best of ``tries`` by the greedy
    answer's total (milliseconds to compute), in their original order. Counts the greedy
    cannot plan rank last, so when none plans, every count is tried with the MILP.

    *Reconstructed*: the paper solves per micro-batch count with SCIP in 5-15 s; one HiGHS
    root per micro-batch costs 0.2-1 s here, so solving every count would make FlexSP the
    slowest planner by 10x. The MILP moves a count's total by a few percent (measured on
    the flexsp-headline batches, docs/methods.md) while counts differ by more, so the greedy
    ranking picks the same count."""
    ranked = []
    for m in tries:
        runs = [r for r in contiguous_partition(lengths, m) if r]
        answers = [greedy_solve([lengths[i] for i in r]) for r in runs]
        total = (sum(a.seconds for a in answers) if all(a is not None for a in answers)
                 else float("inf"))
        ranked.append((total, m))
    chosen = {m for _, m in sorted(ranked)[:keep]}
    if all(total == float("inf") for total, _ in ranked):
        chosen = set(tries)
    return [m for m in tries if m in chosen]


def stopped_by(sources: list[str], net_reached: bool) -> str:
    """Which limit ended the search: ``time-limit`` when the wall-clock safety net was reached
    (the plan then depends on the machine), else ``node-limit`` when some MILP stopped at its
    node limit, else ``complete`` (every MILP solved to its gap, or greedy only)."""
    if net_reached or "milp-timeout" in sources:
        return "time-limit"
    if "milp-node-limit" in sources:
        return "node-limit"
    return "complete"


def microbatch_phases(order: list, runs: list[list[int]], answers: list[Assignment],
                      parallel: ParallelSpec, recompute: str) -> list[Phase]:
    """One phase per micro-batch: its SP groups on aligned blocks of the pool's slots."""
    slots = num_slots(parallel)
    phases, group_id = [], 0
    for run, answer in zip(runs, answers, strict=True):
        placement = aligned_blocks([g.degree for g in answer.groups], slots)
        assert placement is not None  # degrees are powers of two summing to <= slots
        groups = []
        for g, block in zip(answer.groups, placement, strict=True):
            seqs = [order[run[i]] for i in g.members]
            layout = GroupLayout(tp=parallel.tp, cp=g.degree, pp=parallel.pp, vpp=1,
                                 schedule="1f1b", cp_kind="ulysses", recompute=recompute)
            groups.append(packed_group(group_id, slot_ranks(parallel, block), layout,
                                       _units(seqs, parallel.pp)))
            group_id += 1
        phases.append(Phase(groups=tuple(groups)))
    return phases


def plan(batch: Batch, setup: PlanSetup, options: FlexSPOptions) -> Plan:
    opts, model, hardware, cost = options, setup.model, setup.hardware, setup.cost
    deadline = Deadline(time_limit_s=opts.time_limit_s)
    parallel = sp_pool_layout(setup.parallel)
    slots = num_slots(parallel)
    # Ulysses groups split heads: no degree above the heads a tp rank holds (ulysses_degrees).
    degrees = ulysses_degrees(slots, model.num_heads // parallel.tp)
    top = degrees[-1]
    zero_stage = zero_stage_of(cost)
    recompute = opts.recompute
    for mode in (RECOMPUTE_MODES if recompute == AUTO else (recompute,)):
        recompute = mode
        if opts.constants == "paper-a100-gpt7b":
            k = paper_a100_gpt7b(model, hardware, tp=parallel.tp, pp=parallel.pp,
                                 num_gpus=slots)
        else:
            # Every slot holds a replica of the stage's weights, so the optimizer (ZeRO-1)
            # or everything (ZeRO-3) is sharded over all dp*cp slots of the pool.
            k = from_cost_model(cost, tp=parallel.tp, pp=parallel.pp, num_gpus=slots,
                                state_shards=slots, recompute=mode, zero_stage=zero_stage)
        if max(batch.lengths) <= k.max_tokens(top):
            break
    order = sorted(batch.sequences, key=lambda s: (s.length, s.seq_id))
    lengths = [s.length for s in order]
    capacity = k.max_tokens(top)  # the largest group's: what the longest sequence may use
    # The fewest micro-batches memory allows: the batch's tokens over what the whole pool
    # holds at once, every slot's share (the FlexSP authors' solver counts the cluster's token
    # capacity, device capacity times devices: flexSPOptimizer.get_min_valid_microbatch_num,
    # PKU-DAIR/Hetu-Galvatron). One group's capacity here made M_min slots/top times too
    # large: llama-13b on 16 slots of tp 4 (Ulysses degrees <= 2) got 15 micro-batches whose
    # longest ones used 2 to 4 of the 16 slots.
    pool_capacity = k.max_tokens(top) * (slots // top)
    m_min = max(1, -(-sum(lengths) // max(int(pool_capacity), 1)))
    m_min = min(m_min, len(lengths))
    tries = [m for m in range(m_min, m_min + opts.extra_microbatch_counts + 1)
             if m <= len(lengths)]

    def search(counts: range | list[int]) -> Search | None:
        """The best of ``counts``: greedy answers, or the MILP on the ``milp_counts`` best."""
        counts = list(counts)
        if opts.milp_counts == 0:
            return search_microbatches(
                lengths, counts, deadline,
                lambda run, _left: greedy(run, slots, k, degrees=degrees))
        return search_microbatches(
            lengths, milp_counts(lengths, counts, opts.milp_counts,
                                 lambda run: greedy(run, slots, k, degrees=degrees)),
            deadline, lambda run, left: _solve_microbatch(run, slots, k, opts, left, degrees))

    best = search(tries)
    if best is None:
        # No count near the memory minimum cuts the sorted batch into micro-batches that all
        # fit (a token-balanced run of the longest sequences can hold one sequence too many:
        # three 256K sequences where a group holds 743K tokens). As FlexSP raises M until its
        # chunks fit: the first count that fits (greedy answers), then the same window of
        # counts above it and the same solver as at the memory minimum; deterministic.
        first = first_fitting_count(
            lengths, tries[-1] if tries else m_min,
            lambda run: greedy(run, slots, k, degrees=degrees) is not None,
            expired=lambda: deadline.expired)
        if first is not None:
            best = search(range(first, min(first + opts.extra_microbatch_counts,
                                           len(lengths)) + 1))
    # Read right after the search: expired now means the safety net cut it (a skipped MILP or
    # an untried M happens only once it has expired).
    net_reached = deadline.expired
    fallback = None
    if best is None:
        fallback = _fallback_reason(lengths, k, top, slots, recompute, capacity)
        answers = _one_per_microbatch(lengths, top, k)
        best = (sum(a.seconds for a in answers), len(lengths), [[i] for i in range(len(lengths))],
                answers)
    _, m, runs, answers = best
    phases = microbatch_phases(order, runs, answers, parallel, recompute)
    sources = [a.source for a in answers]
    if fallback is None and stopped_by(sources, net_reached) == "time-limit":
        fallback = WALL_CLOCK_FALLBACK.format(limit=opts.time_limit_s)
    return finish_plan(
        method="flexsp", setup=setup, parallel=parallel,
        sequence_lengths={s.seq_id: s.length for s in batch.sequences}, phases=phases,
        metadata={"num_microbatches": m, "m_min": m_min, "solver": sources,
                  "recompute": recompute,
                  "estimated_seconds": best[0], "constants": opts.constants,
                  "sp_degrees": [[g.degree for g in a.groups] for a in answers],
                  "time_limit_s": opts.time_limit_s, "mip_max_nodes": opts.mip_max_nodes,
                  "mip_sub_mip_heuristics": opts.mip_sub_mip_heuristics,
                  "stopped_by": stopped_by(sources, net_reached),
                  **({"fallback": fallback} if fallback is not None else {})},
        escalate_recompute=opts.recompute == AUTO,
    )
