"""Assemble a SlimPack plan for one slice length: phase 1, DP-Merge, phase 2."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimpack.batch import Batch
from slimpack.cost.memory import (
    activation_bytes_per_token_per_layer,
    model_state_bytes,
)
from slimpack.cost.model import CostModel, training_of
from slimpack.plan import Group, Phase, Plan
from slimpack.planning.deadline import Deadline
from slimpack.sim.costs import layers_per_virtual_stage
from slimpack.sim.memory import peaks_and_schedule, stage_state_bytes
from slimpack.slimpack_planner.assign import bin_loads, lpt_assign, milp_assign, token_assign
from slimpack.slimpack_planner.estimate import WorkEstimator
from slimpack.slimpack_planner.layout_peak import layout_peak_bytes
from slimpack.slimpack_planner.merge import MergeDecision, find_outliers
from slimpack.slimpack_planner.micropacks import (
    OutOfTime,
    ReplicaLayout,
    check,
    emit_layout,
    layout_replica,
)
from slimpack.slimpack_planner.options import SlimPackOptions
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec
from slimpack.specs.training import TrainingSpec


@dataclass(frozen=True, kw_only=True)
class BuildContext:
    batch: Batch
    model: ModelSpec
    hardware: HardwareSpec
    parallel: ParallelSpec
    cost: CostModel
    options: SlimPackOptions
    estimators: dict[int, WorkEstimator] = field(default_factory=dict, compare=False, repr=False)
    """CP degree -> its estimator: probed once per plan, not once per candidate (its memo of
    priced lengths is shared by every candidate as well)."""
    whole_segments: dict = field(default_factory=dict, compare=False, repr=False)
    """seq_id -> Segment of a whole short document, shared by every packing of the plan."""
    cuts_cache: dict = field(default_factory=dict, compare=False, repr=False)
    """Cuts of long sequences by (length, S, target, floor, estimator), shared by a group's
    memory repairs (which repack the same sequences in smaller rounds)."""
    work_of: dict[int, float] = field(default_factory=dict, compare=False, repr=False)
    """seq_id -> estimated seconds on the base CP degree (see :meth:`work`)."""
    doc_forward: dict[int, float] = field(default_factory=dict, compare=False, repr=False)
    """seq_id -> forward seconds of the whole sequence on the base CP degree
    (``est.documents_forward``), kept by :meth:`work` for the packings of every candidate."""
    doc_backward: dict[int, float] = field(default_factory=dict, compare=False, repr=False)
    """The same for backward seconds."""
    schedules: dict = field(default_factory=dict, compare=False, repr=False)
    """group_id -> op lists of the last plan built, where its memory check built them
    (groups with virtual stages): the search hands them to the simulator, which builds the
    others."""

    def work(self, est: WorkEstimator, lengths: dict[int, int]) -> dict[int, float]:
        """seq_id -> estimated fwd+bwd seconds of each sequence, the same for every
        candidate of a plan: computed once (``est``: the base CP degree's estimator)."""
        if not self.work_of:
            # est.total(n) is forward(n) + backward(n): the same sum of the same floats.
            fwd, bwd = est.documents_forward(lengths), est.documents_backward(lengths)
            self.doc_forward.update(fwd)
            self.doc_backward.update(bwd)
            self.work_of.update({s: fwd[s] + bwd[s] for s in lengths})
        return self.work_of

    def document_prices(self, merged: int) -> tuple[dict[int, float], dict[int, float]] | None:
        """(forward, backward) seconds per whole sequence for a group of ``merged`` replicas:
        the base CP degree's, kept once per plan; None for a merged group (its own CP degree:
        its few outliers are priced when packed)."""
        return (self.doc_forward, self.doc_backward) if merged == 1 and self.work_of else None

    def estimator(self, cp: int) -> WorkEstimator:
        est = self.estimators.get(cp)
        if est is None:
            est = self.estimators[cp] = WorkEstimator.from_cost(
                self.cost, tp=self.parallel.tp, cp=cp, cp_sharding=self.options.cp_sharding,
                recompute=self.options.recompute_mode)
        return est


def max_tokens_in_flight(ctx: BuildContext, cp: int) -> int:
    """Tokens whose activations fit on the worst pipeline stage of one group with CP ``cp``."""
    par, model = ctx.parallel, ctx.model
    budget = ctx.hardware.usable_memory_bytes * ctx.options.memory_headroom
    budget -= model_state_bytes(model, tp=par.tp, pp=par.pp, dp=par.dp, cp=par.cp, ep=par.ep)
    # Terms a token count leaves out (logits, dK/dV buffers, the spread LM head's weights)
    # take a few percent; without this margin most groups need one repacking round.
    budget *= IN_FLIGHT_MARGIN
    per_token = (activation_bytes_per_token_per_layer(model, ctx.options.recompute_mode)
                 * model.num_layers / par.pp / (par.tp * cp))
    return max(int(budget / per_token), 0)


__all__ = ["BuildContext", "OutOfTime", "OverMemory", "build_plan", "max_tokens_in_flight"]


class OverMemory(Exception):
    """A candidate's group still overflows memory after its repairs: the search, holding a
    plan that fits already, stops building it (an over-memory plan never beats one that fits,
    and the peak is the simulator's own: :func:`peaks_and_schedule`)."""

    def __init__(self, *, outliers: int, peak_bytes: float) -> None:
        super().__init__(f"a group peaks at {peak_bytes / 2**30:.1f} GiB")
        self.outliers = outliers
        self.peak_bytes = peak_bytes


def build_plan(ctx: BuildContext, slice_tokens: int | None, *, use_merge: bool,
               deadline: Deadline | None = None, stop_over_bytes: float | None = None) -> Plan:
    """The plan for one slice length. With ``deadline`` the build checks it between groups
    and inside phase 2 and raises :class:`OutOfTime` once it has passed (the search's later
    candidates); without, it always finishes (the heuristic answer). With ``stop_over_bytes``
    it raises :class:`OverMemory` as soon as a group's repaired peak exceeds it."""
    par, opts = ctx.parallel, ctx.options
    ctx.schedules.clear()
    lengths = {s.seq_id: s.length for s in ctx.batch.sequences}
    est = ctx.estimator(par.cp)
    check(deadline)
    work = ctx.work(est, lengths)
    # In flight per stage: one round plus the 1F1B warm-up of ~2(p-1) MicroPacks.
    warmup_tokens = 2 * (par.pp - 1) * (slice_tokens or 0)
    fit_tokens = max_tokens_in_flight(ctx, par.cp) - warmup_tokens
    feasible = fit_tokens >= (slice_tokens or 1)
    # A slice length whose warm-up alone overflows memory is infeasible: build the plan
    # anyway (rounds of one slice) and let the simulator flag it, rather than declaring every
    # sequence an outlier.
    fit_tokens = max(fit_tokens, slice_tokens or 128)

    decision = MergeDecision(outliers=(), merge_factor=1)
    if use_merge and feasible and not opts.no_dp_merge:
        decision = find_outliers(lengths, work, dp=par.dp, max_tokens_per_replica=fit_tokens)
    outlier_ids = set(decision.outliers)
    regular = {s: n for s, n in lengths.items() if s not in outlier_ids}

    if stop_over_bytes is not None:
        # Each phase's longest sequence alone may put it over the limit: check both phases
        # before packing either (a group's own check would come only after earlier groups).
        training = training_of(ctx.cost)
        for seqs, merged in ((decision.outliers, decision.merge_factor), (regular, 1)):
            if seqs:
                floor_bytes = _peak_floor_bytes(ctx, max(lengths[s] for s in seqs), merged,
                                                training)
                _stop_if_over(floor_bytes, stop_over_bytes, len(decision.outliers))
    phases: list[Phase] = []
    peaks: list[float] = []
    info: dict = {"slice_tokens": slice_tokens, "outliers": list(decision.outliers),
                  "merge_factor": decision.merge_factor,
                  "backward": "mirrored" if opts.no_asymmetric else "asymmetric"}
    next_group = 0
    if decision.outliers:
        k = decision.merge_factor
        merged_groups = par.dp // k
        m_est = ctx.estimator(par.cp * k)
        out_work = [m_est.total(lengths[s]) for s in decision.outliers]
        bins = lpt_assign(out_work, merged_groups)
        target = _unit_target(m_est, {s: lengths[s] for s in decision.outliers}, merged_groups,
                              slice_tokens, par, steady=opts.steady_state_floor)
        groups = []
        for g, members in enumerate(bins):
            if not members:
                continue
            replicas = list(range(g * k, (g + 1) * k))
            seqs = {decision.outliers[i]: lengths[decision.outliers[i]] for i in members}
            capacity = max(max_tokens_in_flight(ctx, par.cp * k) - warmup_tokens,
                           slice_tokens or 128)
            group, peak = _group(ctx, next_group, replicas, seqs, m_est, slice_tokens, capacity,
                                 target, deadline, stop_over_bytes=stop_over_bytes,
                                 outliers=len(decision.outliers))
            groups.append(group)
            peaks.append(peak)
            next_group += 1
        phases.append(Phase(groups=tuple(groups)))

    if regular:
        ids = sorted(regular)
        weights = [work[s] for s in ids]
        if opts.no_dp_aware:
            bins = token_assign([regular[s] for s in ids], par.dp)
            info["phase1"] = "tokens"
        elif opts.milp:
            bins, milp_info = milp_assign(weights, par.dp,
                                          time_limit_s=opts.milp_time_limit_s)
            info.update(milp_info)
            info["phase1"] = "milp"
        else:
            bins = lpt_assign(weights, par.dp)
            info["phase1"] = "lpt"
        loads = bin_loads(bins, weights)
        info["replica_load_spread"] = max(loads) / max(min(loads), 1e-12)
        target = _unit_target(est, regular, par.dp, slice_tokens, par,
                              doc_forward=ctx.doc_forward, steady=opts.steady_state_floor)
        groups = []
        for r, members in enumerate(bins):
            if not members:
                continue
            seqs = {ids[i]: regular[ids[i]] for i in members}
            group, peak = _group(ctx, next_group, [r], seqs, est, slice_tokens, fit_tokens, target,
                                 deadline, stop_over_bytes=stop_over_bytes,
                                 outliers=len(decision.outliers))
            groups.append(group)
            peaks.append(peak)
            next_group += 1
        phases.append(Phase(groups=tuple(groups)))

    info["peak_bytes"] = max(peaks)
    return Plan(method="slimpack", model=ctx.model.name, parallel=par,
                sequence_lengths=lengths, phases=tuple(phases), metadata={"slimpack": info},
                zero_stage=training_of(ctx.cost).zero_stage)


def _stop_if_over(peak: float, limit: float | None, outliers: int) -> None:
    if limit is not None and peak > limit:
        raise OverMemory(outliers=outliers, peak_bytes=peak)


def _unit_target(est: WorkEstimator, lengths: dict[int, int], replicas: int,
                 slice_tokens: int | None, par: ParallelSpec, *,
                 doc_forward: dict[int, float] | None = None, steady: bool = False) -> float:
    """Forward seconds per MicroPack: a replica's forward work over its number of steps.

    The step count aims at ``total tokens / S`` per replica, and at least pp (SlimPipe's
    fewest slices per sample), or with ``steady`` at least 2*pp*vpp (a steady state to hide
    fill and drain in). Neither floor wins everywhere: 2*pp*vpp alone forced small batches into
    more, smaller MicroPacks than S asks for, pp alone leaves deep interleaved pipelines a
    large bubble; the search builds both where they differ (``search_step_floor``;
    docs/slimpack-planner.md, "SlimPack vs SlimPipe on the same layout"). ``doc_forward``: ``est``'s
    forward seconds per sequence when the caller has them (the same floats, summed in the
    same order).
    """
    if doc_forward is None:
        doc_forward = est.documents_forward(lengths)
    total_fwd = sum([doc_forward[s] for s in lengths]) / replicas
    tokens = sum(lengths.values()) / replicas
    if slice_tokens is None:
        steps = max(len(lengths) / replicas, 1)
    else:
        steps = max(tokens / slice_tokens, 2 * par.pp * par.vpp if steady else par.pp, 1)
    return total_fwd / steps


MAX_MEMORY_REPAIRS = 6
IN_FLIGHT_MARGIN = 0.96


def _group(ctx: BuildContext, group_id: int, replicas: list[int], seqs: dict[int, int],
           est: WorkEstimator, slice_tokens: int | None, round_capacity: int,
           target: float, deadline: Deadline | None, *, stop_over_bytes: float | None = None,
           outliers: int = 0) -> tuple[Group, float]:
    """Pack one group; shrink its rounds until the schedule's peak memory fits.

    The round capacity is a first guess from tokens; MicroPacks balanced on cost can hold
    more tokens than S, so the real peak is read off the schedule the simulator will run
    (an order-only walk, no timing) and rounds shrink until it fits or reach one slice.
    Before any slice is built, a layout whose guessed peak (:mod:`.layout_peak`) is clearly
    over the budget is laid out again with smaller rounds, the same way: building and
    checking a packing costs several times its layout.
    """
    budget = ctx.hardware.usable_memory_bytes * ctx.options.memory_headroom
    training = training_of(ctx.cost)
    if stop_over_bytes is not None:
        floor_bytes = _peak_floor_bytes(ctx, max(seqs.values()), len(replicas), training)
        if floor_bytes > stop_over_bytes:
            raise OverMemory(outliers=outliers, peak_bytes=floor_bytes)
    floor = slice_tokens or 1
    repairs = 0
    layout = _layout_group(ctx, seqs, est, slice_tokens, round_capacity, target, deadline,
                           merged=len(replicas))
    while repairs < MAX_MEMORY_REPAIRS and round_capacity > floor:
        check(deadline)
        guess = _layout_peak(ctx, layout, len(replicas), training)
        if guess is None or guess <= budget * (1 + GUESS_OVER_SLACK):
            break
        round_capacity = max(int(round_capacity * budget / guess * 0.9), floor)
        layout = _layout_group(ctx, seqs, est, slice_tokens, round_capacity, target, deadline,
                               merged=len(replicas))
        repairs += 1
    group = _emit_group(ctx, group_id, replicas, layout, est, deadline)
    check(deadline)
    peaks, ops = peaks_and_schedule(group, ctx.model, ctx.parallel.dp, training,
                                     ep=ctx.parallel.ep)
    peak = max(peaks)
    for _ in range(MAX_MEMORY_REPAIRS - repairs):
        if peak <= budget or round_capacity <= floor:
            break
        round_capacity = max(int(round_capacity * budget / peak * 0.9), floor)
        layout = _layout_group(ctx, seqs, est, slice_tokens, round_capacity, target, deadline,
                               merged=len(replicas))
        group = _emit_group(ctx, group_id, replicas, layout, est, deadline)
        check(deadline)
        peaks, ops = peaks_and_schedule(group, ctx.model, ctx.parallel.dp, training,
                                     ep=ctx.parallel.ep)
        peak = max(peaks)
    if ops is not None:
        ctx.schedules[group.group_id] = ops
    _stop_if_over(peak, stop_over_bytes, outliers)
    return group, peak


GUESS_OVER_SLACK = 0.005
"""A layout is repacked before it is built only when its guessed peak is more than 0.5% over
the budget. The guess mirrors each round's backward MicroPacks (:mod:`.layout_peak`); over
123 groups of random layouts it was at most 0.53% above the exact peak (p95 0.17%), so a
layout it sends back would almost always have failed the exact check too, and one near the
budget is built and checked exactly. It was up to 1.8% below, which only leaves the repair
to the exact check, as before."""


def _layout_peak(ctx: BuildContext, layout: ReplicaLayout, merged: int,
                 training: TrainingSpec | None) -> float | None:
    """The guessed peak of a group of ``merged`` replicas laid out as ``layout`` (None with
    virtual stages, whose chunked order the guess does not follow)."""
    par = ctx.parallel
    if par.vpp != 1:
        return None
    return layout_peak_bytes(layout, model=ctx.model, tp=par.tp, cp=par.cp * merged, pp=par.pp,
                             dp=par.dp, vocab_parallel_pp=vocab_over_pp(ctx), training=training,
                             mirrored=ctx.options.no_asymmetric,
                             recompute=ctx.options.recompute_mode, ep=par.ep)


def _peak_floor_bytes(ctx: BuildContext, longest: int, merged: int,
                      training: TrainingSpec | None) -> float:
    """A floor under the peak of every packing of a group whose longest sequence has
    ``longest`` tokens: a sequence sits in one round, and when its last slice starts its
    backward every slice of it has run forward and none has freed its activations, so its
    whole activations share some stage with that stage's model states. No repair (smaller
    rounds) can go below it, so a group above the limit is over memory before it is packed."""
    par, model = ctx.parallel, ctx.model
    cp = par.cp * merged
    states = stage_state_bytes(model, tp=par.tp, cp=cp, pp=par.pp, dp=par.dp,
                               vocab_parallel_pp=vocab_over_pp(ctx), training=training,
                               ep=par.ep)
    per_layer = (longest * activation_bytes_per_token_per_layer(model, ctx.options.recompute_mode)
                 / (par.tp * cp))
    layers = layers_per_virtual_stage(model.num_layers, par.pp, par.vpp)
    return max(states[s] + per_layer * sum(layers[c * par.pp + s] for c in range(par.vpp))
               for s in range(par.pp))


def _layout_group(ctx: BuildContext, seqs: dict[int, int], est: WorkEstimator,
                  slice_tokens: int | None, round_capacity: int, target: float,
                  deadline: Deadline | None, *, merged: int) -> ReplicaLayout:
    """The group's layout (its ``merged`` replicas' CP ranks form one CP group)."""
    par = ctx.parallel
    prices = ctx.document_prices(merged)
    return layout_replica(seqs, est, slice_tokens=slice_tokens, round_capacity=round_capacity,
                          unit_forward_target=target, asymmetric=not ctx.options.no_asymmetric,
                          inflight_tokens=round_capacity + 2 * (par.pp - 1) * (slice_tokens or 0),
                          warmup_units=2 * (par.pp - 1), deadline=deadline,
                          cp=par.cp * merged, cuts_cache=ctx.cuts_cache,
                          short_reserve=ctx.options.short_reserve,
                          doc_forward=prices[0] if prices else None)


def _emit_group(ctx: BuildContext, group_id: int, replicas: list[int], layout: ReplicaLayout,
                est: WorkEstimator, deadline: Deadline | None) -> Group:
    par = ctx.parallel
    k = len(replicas)
    prices = ctx.document_prices(k)
    packs = emit_layout(layout, est, asymmetric=not ctx.options.no_asymmetric,
                        deadline=deadline, whole_segments=ctx.whole_segments,
                        doc_backward=prices[1] if prices else None,
                        regroup_long=ctx.options.regroup_long,
                        round_warmup=ctx.options.round_warmup)
    # Ranks ordered (pp, cp, tp): a merged group's CP index runs over its replicas' CP ranks.
    ranks = tuple(par.rank(dp=r, pp=s, cp=c, tp=t)
                  for s in range(par.pp) for r in replicas for c in range(par.cp)
                  for t in range(par.tp))
    return Group(
        group_id=group_id, ranks=ranks, tp=par.tp, cp=par.cp * k, pp=par.pp, vpp=par.vpp,
        slices=tuple(packs.slices), forward_units=tuple(packs.forward_units),
        backward_units=tuple(packs.backward_units), schedule="asymmetric",
        cp_sharding=ctx.options.cp_sharding, cp_kind="ring",
        recompute=ctx.options.recompute_mode,
        # The LM head on the last stage alone makes that stage the pipeline's bottleneck
        # (~6% for llama-70b at pp 8); spreading the vocabulary over the pipeline ranks as
        # SlimPipe does removes it.
        vocab_parallel_pp=vocab_over_pp(ctx),
    )


def vocab_over_pp(ctx: BuildContext) -> bool:
    """LM head and loss spread over the pipeline ranks (as SlimPipe does), when there are
    several and the options allow it (``vocab_parallel_pp``)."""
    return ctx.parallel.pp > 1 and ctx.options.vocab_parallel_pp
