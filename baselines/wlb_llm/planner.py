"""WLB-LLM (arXiv 2503.17924) as a planner: variable-length packing + outlier delay + CP
sharding choice, on Megatron-LM's 4D parallelism (static tp/cp/pp/dp, 1F1B or interleaved).

One-shot ``plan(batch, ...)`` plans the batch completely (steady-state outlier placement, see
:func:`baselines.wlb_llm.iteration.pack_iteration`); pass ``queue_state`` (and unique seq ids
across iterations) to run the real queues over a stream, reading the new state, the carried
documents and the delay from ``plan.metadata``.
"""

from __future__ import annotations

from dataclasses import dataclass

from baselines.common.finish import finish_plan
from baselines.wlb_llm.iteration import Doc, IterationPacking, assign_to_replicas, pack_iteration
from baselines.wlb_llm.outlier_queue import (
    OutlierQueues,
    queues_from_dict,
    queues_to_dict,
)
from baselines.wlb_llm.workload import Workload, fit_workload
from slimpack.batch import Batch
from slimpack.cost.model import CostModel
from slimpack.plan import Phase, Plan, Segment
from slimpack.planning import (
    WALL_CLOCK_FALLBACK,
    Deadline,
    GroupLayout,
    imbalance_degree,
    max_tokens_that_fit,
    microbatch_stage_times,
    packed_group,
    replica_groups,
    resolve_recompute,
    schedule_for,
)
from slimpack.planning.setup import PlanSetup
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec
from slimpack.specs.recompute import AUTO

SHARDINGS = ("adaptive", "per-sequence", "per-document")
DEFAULT_QUEUE_FRACTIONS = (0.25, 0.5)
"""Two queues (the paper's best setting, Table 2) at 1/4 and 1/2 of the context. *Reconstructed*:
the paper does not list its thresholds; these reproduce its imbalance numbers here."""
MAX_EXTRA_MICROBATCHES = 4


@dataclass(frozen=True, kw_only=True)
class WLBOptions:
    context: int | None = None
    """Training context (longest sequence); sets the default micro-batch count, as many as
    fixed-length packing would use. Default: the longest sequence in the batch."""
    s_max: int | None = None
    """S_max, the token cap per micro-batch (memory-bound, paper section 4.1); default: the
    most tokens the memory model fits without recompute, between context and 2*context."""
    num_microbatches: int | None = None
    """Micro-batches per DP replica; default: ceil(tokens / (dp * context))."""
    outlier_thresholds: tuple[int, ...] | None = None
    """Queue thresholds in tokens (increasing); None: 1/4 and 1/2 of context; () disables."""
    queue_state: OutlierQueues | dict | None = None
    """Streaming mode: the queues (or their JSON form from the previous plan's
    ``metadata['queue_state']``); start a stream with ``OutlierQueues(thresholds=...)``."""
    iteration: int = 0
    arrivals: dict[int, int] | None = None
    """Streaming mode: arrival iteration of carried-over documents in this batch."""
    cp_sharding: str = "adaptive"
    recompute: str = "auto"
    time_limit_s: float | None = 1.0
    """The packer is O(n M); past the limit, extra micro-batch counts are not tried."""

    def __post_init__(self) -> None:
        if self.context is not None and self.context < 1:
            raise ValueError(f"wlb-llm: context must be >= 1 token, got {self.context}")
        if self.s_max is not None and self.s_max < 1:
            raise ValueError(f"wlb-llm: s_max must be >= 1 token, got {self.s_max}")
        if self.num_microbatches is not None and self.num_microbatches < 1:
            raise ValueError(f"wlb-llm: num_microbatches must be >= 1, "
                             f"got {self.num_microbatches}")
        if self.cp_sharding not in SHARDINGS:
            raise ValueError(f"wlb-llm: cp_sharding must be one of {SHARDINGS}, "
                             f"got {self.cp_sharding!r}")
        if isinstance(self.queue_state, dict):
            object.__setattr__(self, "queue_state", queues_from_dict(self.queue_state))
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"wlb-llm: time_limit_s must be >= 0, got {self.time_limit_s}")


def _thresholds(opts: WLBOptions, context: int) -> tuple[int, ...]:
    if opts.queue_state is not None:
        return opts.queue_state.thresholds
    if opts.outlier_thresholds is not None:
        return tuple(opts.outlier_thresholds)
    return tuple(int(f * context) for f in DEFAULT_QUEUE_FRACTIONS)


def default_s_max(model: ModelSpec, hardware: HardwareSpec, parallel: ParallelSpec,
                  context: int) -> int:
    fit = max_tokens_that_fit(model, hardware, schedule=schedule_for(parallel), tp=parallel.tp,
                              cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp, dp=parallel.dp,
                              ep=parallel.ep, upper=2 * context)
    return max(context, fit)


def _pack(docs: list[Doc], opts: WLBOptions, *, dp: int, context: int, s_max: int,
          workload: Workload, deadline: Deadline) -> tuple[IterationPacking, int]:
    total = sum(n for _, n in docs)
    m = opts.num_microbatches or max(1, -(-total // (dp * context)))
    streaming = opts.queue_state is not None
    queues = opts.queue_state or OutlierQueues(thresholds=_thresholds(opts, context))
    # One-shot: a few more micro-batches rather than leave documents behind.
    tries = 1 if streaming or opts.num_microbatches else MAX_EXTRA_MICROBATCHES + 1
    for extra in range(tries):
        packing = pack_iteration(docs, num_microbatches=(m + extra) * dp, s_max=s_max,
                                 workload=workload, queues=queues, iteration=opts.iteration,
                                 arrivals=opts.arrivals, steady_state=not streaming)
        if not packing.carried or deadline.expired:
            return packing, m + extra
    return packing, m + tries - 1


def _clock_cut(packing: IterationPacking, deadline: Deadline, streaming: bool) -> bool:
    """The wall-clock net ended the re-packing while documents were left over (one-shot)."""
    return not streaming and bool(packing.carried) and deadline.expired


def _flush_carried(packing: IterationPacking, s_max: int, dp: int) -> list[list[Doc]]:
    """One-shot fallback: carried documents get extra micro-batches (first-fit, dp of them
    at a time) so nothing is dropped from the step."""
    extra: list[list[Doc]] = []
    room: list[int] = []
    for d in sorted(packing.carried, key=lambda d: -d[1]):
        k = next((i for i, r in enumerate(room) if d[1] <= r), None)
        if k is None:
            extra.append([d])
            room.append(s_max - d[1])
        else:
            extra[k].append(d)
            room[k] -= d[1]
    while len(extra) % dp:
        k = max(range(len(extra)), key=lambda i: len(extra[i]))
        if len(extra[k]) < 2:
            break
        big = extra.pop(k)
        extra[k:k] = [big[: len(big) // 2], big[len(big) // 2:]]
    return extra


def _sharding_seconds(cost: CostModel, docs: list[int], parallel: ParallelSpec,
                      recompute: str) -> dict[str, float]:
    """Forward+backward stage seconds of one micro-batch under each CP sharding."""
    if parallel.cp == 1:  # one rank holds every token either way
        t = microbatch_stage_times(cost, docs, tp=parallel.tp, pp=parallel.pp,
                                   recompute=recompute)
        return dict.fromkeys(("per-sequence", "per-document"), t.forward_s + t.backward_s)
    out = {}
    for sharding in ("per-sequence", "per-document"):
        t = microbatch_stage_times(cost, docs, tp=parallel.tp, cp=parallel.cp, pp=parallel.pp,
                                   sharding=sharding, recompute=recompute)
        out[sharding] = t.forward_s + t.backward_s
    return out


def _choose_sharding(times: dict[str, float], requested: str) -> str:
    """Per micro-batch (arXiv 2503.17924, section 5): per-document sharding balances CP ranks
    exactly but runs smaller kernels; keep per-sequence when it is as fast."""
    if requested != "adaptive":
        return requested
    return "per-document" if times["per-document"] < 0.999 * times["per-sequence"] else (
        "per-sequence")


def plan(batch: Batch, setup: PlanSetup, options: WLBOptions) -> Plan:
    opts, model, hardware, parallel = options, setup.model, setup.hardware, setup.parallel
    cost = setup.cost
    deadline = Deadline(time_limit_s=opts.time_limit_s)
    context = opts.context or max(batch.lengths)
    s_max = opts.s_max or default_s_max(model, hardware, parallel, context)
    streaming = opts.queue_state is not None
    docs = [(s.seq_id, s.length) for s in batch.sequences]
    too_long = [d for d in docs if d[1] > s_max]
    if too_long:
        raise ValueError(f"wlb-llm: {len(too_long)} sequence(s) longer than S_max={s_max} "
                         f"(e.g. seq {too_long[0][0]}: {too_long[0][1]} tokens); split them "
                         f"when sampling (truncation='split') or raise context")
    workload = fit_workload(cost, tp=parallel.tp, cp=parallel.cp)
    packing, m = _pack(docs, opts, dp=parallel.dp, context=context, s_max=s_max,
                       workload=workload, deadline=deadline)
    clock_cut = _clock_cut(packing, deadline, streaming)
    microbatches = [mb for mb in packing.microbatches if mb]
    if not streaming and packing.carried:
        microbatches += _flush_carried(packing, s_max, parallel.dp)
    schedule = schedule_for(parallel)
    largest = max(sum(n for _, n in mb) for mb in microbatches)
    recompute, _ = resolve_recompute(opts.recompute, model, hardware, parallel, largest,
                                        schedule)
    times = [_sharding_seconds(cost, [n for _, n in mb], parallel, recompute)
             for mb in microbatches]
    kinds_all = [_choose_sharding(t, opts.cp_sharding) for t in times]
    chosen = [t[k] for t, k in zip(times, kinds_all, strict=True)]
    replicas = assign_to_replicas(microbatches, chosen, parallel.dp)
    index_of = {id(mb): i for i, mb in enumerate(microbatches)}
    groups, unit_sharding = [], {}
    for d, (ranks, mbs) in enumerate(zip(replica_groups(parallel), replicas, strict=True)):
        if not mbs:
            continue
        kinds = [kinds_all[index_of[id(mb)]] for mb in mbs]
        # A group has one sharding in the IR: the one with the smaller total time over its
        # micro-batches (the per-micro-batch choices stay in metadata['unit_cp_sharding']).
        group_kind = opts.cp_sharding if opts.cp_sharding != "adaptive" else min(
            ("per-sequence", "per-document"),
            key=lambda k: sum(times[index_of[id(mb)]][k] for mb in mbs))
        layout = GroupLayout(tp=parallel.tp, cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp,
                             schedule=schedule, recompute=recompute, cp_sharding=group_kind)
        segs = [[Segment(seq_id=i, start=0, end=n) for i, n in mb] for mb in mbs]
        groups.append(packed_group(d, ranks, layout, segs))
        unit_sharding[str(d)] = kinds
    trained = {i: n for mb in microbatches for i, n in mb}
    metadata = {
        "context": context, "s_max": s_max, "num_microbatches_per_replica": m, "recompute": recompute,
        "schedule": schedule,
        "outlier_thresholds": list(packing.queues.thresholds),
        "mode": "streaming" if streaming else "one-shot (steady-state outlier placement)",
        "imbalance_degree_estimate": imbalance_degree(chosen),
        "unit_cp_sharding": unit_sharding,
        "avg_token_delay_iterations": packing.delay_token_iterations / max(packing.trained_tokens,
                                                                          1),
        "delay_token_iterations": packing.delay_token_iterations,
        "workload": {"attention_s_per_token2": workload.attention_s_per_token2,
                     "linear_s_per_token": workload.linear_s_per_token},
    }
    if clock_cut:
        metadata["fallback"] = WALL_CLOCK_FALLBACK.format(limit=opts.time_limit_s)
    if streaming:
        metadata["queue_state"] = queues_to_dict(packing.queues)
        metadata["carried"] = [list(d) for d in packing.carried]
    return finish_plan(method="wlb-llm", setup=setup,
                       sequence_lengths=trained, phases=[Phase(groups=tuple(groups))],
                       metadata=metadata, escalate_recompute=opts.recompute == AUTO)
