"""The SlimPack planner (*reconstructed* from the paper's public summary, arXiv 2509.26246).

``plan(batch, setup, options)`` (``slimpack.compare.plan_method`` builds the typed options
and checks the layout) runs:

1. **Slicing** at slice length S (searched, or given);
2. **Phase 1, DP-aware assignment** of sequences to data-parallel replicas, balanced on
   estimated forward+backward time (LPT, optionally refined by a HiGHS MILP);
3. **DP-Merge** of k replicas into one CP-k group for outlier sequences, as a phase of its own;
4. **Phase 2, asymmetric partitioning** of each replica's slices into forward MicroPacks
   balanced on forward cost and backward MicroPacks balanced on backward cost;
5. **Simulator-guided search** over S (and merge on/off), keeping the fastest plan that fits;
   where that plan is memory-bound, the search again with selective, then full recompute
   (``recompute="auto"``); a last backward MicroPack long enough to hide the gradient sync
   (``sync_tail``); and SlimPipe's offload and attention redistribution after it.

Every component has a switch (``no_slicing``, ``no_asymmetric``, ``no_dp_aware``,
``no_dp_merge``) so the ablation can price what each buys.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from itertools import product
from typing import Any

from slimpack.batch import Batch
from slimpack.cost.model import CostModel
from slimpack.plan import Plan
from slimpack.planning.deadline import WALL_CLOCK_FALLBACK, Deadline
from slimpack.planning.gc_pause import gc_paused
from slimpack.planning.setup import PlanSetup
from slimpack.sim.redistribution import PricedGroup, with_attention_moves
from slimpack.slimpack_planner.assemble import (
    BuildContext,
    OutOfTime,
    OverMemory,
    build_plan,
    max_tokens_in_flight,
)
from slimpack.slimpack_planner.mechanisms import try_mechanisms, with_offload
from slimpack.slimpack_planner.options import SlimPackOptions
from slimpack.slimpack_planner.sync_tail import with_sync_tail
from slimpack.slimpack_planner.uniform import (
    uniform_applies,
    uniform_counts,
    uniform_deals,
    uniform_plan,
)
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec

__all__ = ["SlimPackOptions", "plan", "default_slice_tokens"]


def default_slice_tokens(batch: Batch, parallel: ParallelSpec, *, fit_tokens: int | None = None) -> int:
    """Heuristic S, 128-aligned, between 1K and 32K tokens *per CP rank*.

    About 2*pp*vpp MicroPacks for the longest sequence (enough steady state to hide the
    pipeline fill), and, when ``fit_tokens`` (tokens whose activations fit a stage) is given,
    small enough that the 2(p-1) warm-up MicroPacks take at most two thirds of memory. A CP
    group splits every MicroPack cp ways, so S scales with cp: each rank keeps GEMMs of
    at least 1K (2K with CP) rows, where they still run near full efficiency.
    """
    longest = max(batch.lengths)
    align = max(128, 2 * parallel.cp)
    cp = parallel.cp
    s = longest / (2 * parallel.pp * parallel.vpp)
    if fit_tokens is not None and parallel.pp > 1:
        s = min(s, fit_tokens / (3 * (parallel.pp - 1)))
    floor = 1024 if cp == 1 else 2048 * cp
    s = min(max(s, floor), 32768 * cp)
    return max(align, int(round(s / align)) * align)


def plan(batch: Batch, setup: PlanSetup, options: SlimPackOptions) -> Plan:
    """A SlimPack plan; returns within ``time_limit_s`` (+10%) whenever the first (heuristic)
    candidate is built within it. Every later candidate is started only when the time left
    covers what the previous one took (build, validation and, in search mode, simulation);
    it stops inside its build once the limit is reached. A first candidate that alone takes
    longer is returned as soon as it is built (``metadata["search"][0]["built_s"]`` says when).
    Every returned plan has been validated once (``Plan.validate``)."""
    with gc_paused():
        return _plan(batch, setup.model, setup.hardware, setup.parallel, setup.cost, options,
                     priced=setup.priced)


def _plan(batch: Batch, model: ModelSpec, hardware: HardwareSpec, parallel: ParallelSpec,
          cost: CostModel, opts: SlimPackOptions,
          priced: dict[int, PricedGroup] | None = None) -> Plan:
    deadline = Deadline(time_limit_s=opts.time_limit_s)
    parallel.validate_for_model(model)
    if opts.slice_tokens is not None and opts.slice_tokens % (2 * parallel.cp):
        raise ValueError(
            f"slice_tokens ({opts.slice_tokens}) must be a multiple of 2*cp = {2 * parallel.cp}"
        )
    ctx = BuildContext(batch=batch, model=model, hardware=hardware, parallel=parallel,
                       cost=cost, options=opts)
    candidates = _slice_candidates(batch, parallel, opts,
                                   fit_tokens=max_tokens_in_flight(ctx, parallel.cp))
    merge_choices = (True,) if opts.no_dp_merge else (True, False)
    if parallel.ep > 1:
        # A merged group spans replicas at another CP degree than the plan's, and the
        # simulator prices expert groups only in the plan's own layout (sim/expert_dispatch).
        merge_choices = (False,)
    record = None
    chosen_moves: Mapping[int, PricedGroup] = {}
    if not opts.search:
        best, tried, cut = _first_fit(ctx, candidates, deadline)
        # Heuristic mode times nothing: only a mechanism the options force is applied.
        if opts.offload:
            best = with_offload(best, opts.offload)
        if opts.attention_redistribution:
            best = dataclasses.replace(best, attention_redistribution=True)
    else:
        best, tried, cut, record = _search(ctx, candidates, merge_choices, deadline)
        if opts.recompute == "auto" and not cut:
            best, tried, cut, record = _search_recompute(ctx, best, tried, record,
                                                         merge_choices, deadline)
        if record is not None and opts.sync_tail:
            best, record, more = _sync_tail(ctx, best, record)
            tried += more
        if record is not None:
            best, record, more, chosen_moves = _mechanisms(ctx, best, record)
            tried += more
    if cut:
        best.metadata["fallback"] = WALL_CLOCK_FALLBACK.format(limit=opts.time_limit_s)
    # Every group's peak is the simulator's own memory walk (assemble.peaks_and_schedule),
    # so the verdict is the simulator's; offload changes it, so the simulated one then.
    offloaded = any(g.offload for g in best.groups())
    best = dataclasses.replace(best, memory_fits=None if offloaded and record is None else bool(
        not record.oom if offloaded else
        best.metadata["slimpack"]["peak_bytes"] <= hardware.usable_memory_bytes))
    # The plan carries the moves its redistribution runs, chosen under the cost model it was
    # planned with (the simulator and the runtime execute them as they are): those its last
    # simulation chose, for the groups it simulated.
    best = with_attention_moves(best, model=model, cost=cost, chosen=chosen_moves,
                                priced=priced)
    best.metadata["plan_seconds"] = deadline.elapsed_s
    best.metadata["search"] = tried
    return best  # validated where it was built (heuristic) or simulated (search)


RECOMPUTE_LADDER = ("selective", "full")
"""Recompute modes ``recompute="auto"`` tries, in order, after the plan without recompute."""


def _memory_bound(plan: Plan, record, tried: list[dict]) -> bool:
    """Whether memory shaped ``plan``, the best of a search whose candidates are ``tried``: it
    overflows, it runs outliers on merged replicas (DP-Merge is SlimPack's answer to a
    sequence whose activations do not fit a replica; recompute is the other one, and neither
    is free, so both are simulated), or memory ruled out a candidate the simulator timed
    faster than it (recompute may make that one fit: on llama-70b at 128K, pp 16, the plan
    that fits without recompute needs the steady-state floor and was 21% slower than
    SlimPipe's uniform slices under selective recompute)."""
    if record is None or record.oom or plan.metadata["slimpack"]["outliers"]:
        return True
    return any(t.get("oom") and t.get("step_time_s", math.inf) < record.step_time_s
               for t in tried)


def _search_recompute(ctx: BuildContext, best: Plan, tried: list[dict], record,
                      merge_choices: tuple[bool, ...], deadline: Deadline,
                      ) -> tuple[Plan, list[dict], bool, Any]:
    """``recompute="auto"``: while the last search's best plan is memory-bound
    (:func:`_memory_bound`), the whole search again with the next mode of
    :data:`RECOMPUTE_LADDER` (its own estimator, memory budget and slice candidates), keeping
    the fastest plan that fits (a count of searches, like the slice candidates: the same
    answer on every machine)."""
    last_plan, last_record, last_tried = best, record, tried
    tried = [{**t, "recompute": "none"} for t in tried]
    if ctx.options.offload is None and record is not None and record.oom:
        # Offload is the third answer to memory (SlimPipe tries it before recompute): the
        # plan without recompute, with the smallest share that fits, is a candidate too.
        best, record, more, _ = _timed_mechanisms(ctx, best, record, offload=None,
                                                  attention_redistribution=False)
        tried += [{**t, "recompute": "none"} for t in more]
    key = _record_key(record)
    cut = False
    for mode in RECOMPUTE_LADDER:
        if not _memory_bound(last_plan, last_record, last_tried):
            break
        # A fresh context: every memo (estimators, prices, cuts) depends on the recompute mode.
        rctx = BuildContext(batch=ctx.batch, model=ctx.model, hardware=ctx.hardware,
                            parallel=ctx.parallel, cost=ctx.cost,
                            options=dataclasses.replace(ctx.options, recompute=mode))
        cands = _slice_candidates(ctx.batch, ctx.parallel, rctx.options,
                                  fit_tokens=max_tokens_in_flight(rctx, ctx.parallel.cp))
        plan, more, cut, rec = _search(rctx, cands, merge_choices, deadline)
        tried += [{**t, "recompute": mode} for t in more]
        if rec is not None and _record_key(rec) < key:
            best, record, key = plan, rec, _record_key(rec)
        last_plan, last_record, last_tried = plan, rec, more
        if cut:
            break
    best.metadata["slimpack"]["recompute"] = sorted({g.recompute for g in best.groups()})[0]
    return best, tried, cut, record


def _record_key(record) -> tuple[bool, float]:
    """What the search minimises: plans that fit first, then step time (peak when over)."""
    if record is None:
        return (True, float("inf"))
    return (record.oom, record.step_time_s if not record.oom else max(record.peak_memory_bytes))


SYNC_EXPOSED_SHARE = 1e-3
"""Exposed gradient sync below this share of the step is left alone (no extra simulation)."""


def _sync_tail(ctx: BuildContext, best: Plan, record) -> tuple[Plan, Any, list[dict]]:
    """Where the data-parallel gradient sync is exposed after compute, the plan whose last
    backward MicroPacks run as one long enough to hide it (:mod:`.sync_tail`), kept when the
    simulator times it faster: one more simulation."""
    from slimpack.sim import simulate

    extra = record.extra
    exposed = record.step_time_s - extra.get("compute_end_s", record.step_time_s) \
        - extra.get("optimizer_step_s", 0.0)
    if exposed <= SYNC_EXPOSED_SHARE * record.step_time_s:
        return best, record, []
    candidate = with_sync_tail(best, sync_s=extra["dp_sync_s"], model=ctx.model, cost=ctx.cost)
    if candidate is None:
        return best, record, []
    rec = simulate(candidate, model=ctx.model, hardware=ctx.hardware, cost=ctx.cost).record
    tried = [{"sync_tail": True, "exposed_sync_s": exposed, "step_time_s": rec.step_time_s,
              "oom": rec.oom}]
    if (rec.oom, rec.step_time_s) < (record.oom, record.step_time_s):
        return candidate, rec, tried
    return best, record, tried


def _mechanisms(ctx: BuildContext, best: Plan, record,
                ) -> tuple[Plan, Any, list[dict], Mapping[int, PricedGroup]]:
    """SlimPipe's offload and attention redistribution on the chosen plan (``mechanisms``),
    and the moves the simulation of the returned plan chose (``SimResult.chosen_moves``:
    empty unless it was simulated here with redistribution)."""
    opts = ctx.options
    return _timed_mechanisms(ctx, best, record, offload=opts.offload,
                             attention_redistribution=opts.attention_redistribution)


def _timed_mechanisms(ctx: BuildContext, best: Plan, record, *, offload: float | None,
                      attention_redistribution: bool | None,
                      ) -> tuple[Plan, Any, list[dict], Mapping[int, PricedGroup]]:
    from slimpack.sim import simulate

    simulated: list[tuple[Plan, Mapping]] = []

    def timed(plan: Plan):
        result = simulate(plan, model=ctx.model, hardware=ctx.hardware, cost=ctx.cost)
        simulated.append((plan, result.chosen_moves))
        return result.record

    plan, record, tried = try_mechanisms(best, record, timed, offload=offload,
                                         attention_redistribution=attention_redistribution)
    chosen = next((moves for candidate, moves in simulated if candidate is plan), {})
    return plan, record, tried, chosen


def _slice_candidates(batch: Batch, parallel: ParallelSpec, opts: SlimPackOptions, *,
                      fit_tokens: int) -> list[int | None]:
    if opts.no_slicing:
        return [None]
    if opts.slice_tokens is not None:
        return [opts.slice_tokens]
    default = default_slice_tokens(batch, parallel, fit_tokens=fit_tokens)
    longest = max(batch.lengths)
    align = 2 * parallel.cp
    # Candidates are per-CP-rank sizes: a cp-way group tries cp times longer slices.
    scaled = {s * parallel.cp for s in opts.slice_candidates}
    cands = sorted({s for s in scaled if s < longest and s % align == 0} | {default})
    # The heuristic first so a tight time limit still returns its answer, then outward from
    # it (nearest first in log scale): the best S is usually a neighbour of the heuristic.
    others = sorted((s for s in cands if s != default), key=lambda s: abs(math.log(s / default)))
    chosen = [default, *others][:opts.search_candidates]
    if parallel.pp == 1:
        # No pipeline to fill: the fewer the MicroPacks, the less each pays in per-kernel cost
        # and the longer the last backward that hides the gradient sync. The slice that cuts
        # nothing (the longest sequence) is the fewest the candidates above may not reach (they
        # stay below the longest); the memory repair shrinks it where it does not fit.
        tile = max(128, align)  # the heuristic S's alignment
        whole = -(-longest // tile) * tile
        if whole not in chosen:
            chosen.append(whole)
    return chosen


LIMIT_MARGIN = 0.05
"""Share of the time limit kept back from a later candidate's build: half the +10% slack
covers the step it is in when the deadline passes (the stretch between two deadline checks)
and a busy machine's jitter."""


def _build_deadline(deadline: Deadline, reserve_s: float) -> Deadline:
    """The deadline a later candidate's build runs under: the planner's, less ``reserve_s``
    for what must follow the build (its validation) and the :data:`LIMIT_MARGIN`, so an
    interrupted or finished build still leaves room to return within the limit."""
    if deadline.time_limit_s is None:
        return deadline
    margin = LIMIT_MARGIN * deadline.time_limit_s
    return Deadline(time_limit_s=max(deadline.time_limit_s - reserve_s - margin, 0.0),
                    started=deadline.started)


def _predicted_build_s(last_s: float, last: int | None, nxt: int | None) -> float:
    """A build's time from the previous one's: work grows with the number of slices, about
    as 1/S, so a shorter slice length costs proportionally more (never assumed cheaper)."""
    if last is None or nxt is None:
        return last_s
    return last_s * max(1.0, last / nxt)


def _num_units(plan: Plan) -> int:
    """Forward and backward MicroPacks of every group: what a simulation walks."""
    return max(sum(len(g.forward_units) + len(g.backward_units) for g in plan.groups()), 1)


def _first_fit(ctx: BuildContext, candidates: list[int | None],
               deadline: Deadline) -> tuple[Plan, list[dict], bool]:
    """Heuristic mode: the first candidate whose schedule fits memory (no timing at all).

    The check walks each group's op order (exactly the simulator's memory accounting), so a
    heuristic plan fits whenever any candidate does; otherwise the smallest peak is kept.
    """
    budget = ctx.hardware.usable_memory_bytes
    best: Plan | None = None
    best_peak = float("inf")
    tried: list[dict] = []
    last_s = validate_s = 0.0
    last_slice: int | None = None
    cut = False  # the wall-clock net stopped it before a fitting candidate was found
    for s in candidates:
        build_deadline = None  # the first candidate is always finished: the last resort
        if best is not None:
            build_deadline = _build_deadline(deadline, 2 * validate_s)
            if build_deadline.remaining_s < _predicted_build_s(last_s, last_slice, s):
                cut = True  # it would not finish in time: stop before starting it
                break
        started = time.perf_counter()
        try:
            candidate = build_plan(ctx, s, use_merge=True, deadline=build_deadline)
        except OutOfTime:
            cut = True
            break
        validate_started = time.perf_counter()
        candidate.validate()
        validate_s = max(validate_s, time.perf_counter() - validate_started)
        last_s, last_slice = time.perf_counter() - started, s
        peak = candidate.metadata["slimpack"]["peak_bytes"]
        tried.append({"slice_tokens": s, "merge": True, "peak_gib": peak / 2**30,
                      "built_s": deadline.elapsed_s})
        if peak < best_peak:
            best, best_peak = candidate, peak
        if peak <= budget:
            break
        if deadline.expired:
            cut = True
            break
    assert best is not None
    return best, tried, cut


def _variant(ctx: BuildContext, *, mirrored: bool, steady: bool) -> BuildContext:
    """``ctx`` building mirrored backward MicroPacks and/or with the steady-state MicroPack
    floor, sharing its per-plan memos (estimators, whole-document segments, cuts, prices: none
    depends on the grouping into MicroPacks) but with its own op lists, so each candidate
    hands the simulator the schedules of its own build."""
    if not mirrored and steady == ctx.options.steady_state_floor:
        return ctx
    options = dataclasses.replace(ctx.options, steady_state_floor=steady,
                                  no_asymmetric=ctx.options.no_asymmetric or mirrored)
    return dataclasses.replace(ctx, options=options, schedules={})


def _floor_binds(ctx: BuildContext, slice_tokens: int | None) -> bool:
    """Whether the steady-state floor (2*pp*vpp MicroPacks per replica) asks for more
    MicroPacks than the batch's tokens per replica over S give."""
    par = ctx.parallel
    if slice_tokens is None:
        return False
    tokens = sum(ctx.batch.lengths) / par.dp
    return tokens / slice_tokens < 2 * par.pp * par.vpp


def _search(ctx: BuildContext, candidates: list[int | None], merge_choices: tuple[bool, ...],
            deadline: Deadline) -> tuple[Plan, list[dict], bool, Any]:
    from slimpack.sim import simulate

    best: Plan | None = None
    best_record = None  # the simulated record of ``best`` (None: never simulated)
    best_key: tuple[bool, float] | None = None
    budget = ctx.hardware.usable_memory_bytes  # the simulator's out-of-memory line
    tried: list[dict] = []
    sim_seconds = 0.0  # the slowest simulation so far predicts the next one
    # ... per MicroPack, once one has run: a simulation's work grows with the plan's units
    # (a no-merge candidate can hold six times the units of the merged one before it)
    sim_per_unit = 0.0
    build_seconds = 0.0  # the slowest build so far predicts the next one
    last_slice: int | None = None
    # Each slice length as packed (asymmetric unless ``no_asymmetric``) and, with
    # ``search_mirrored``, with mirrored backward MicroPacks: a count, like the candidates.
    mirror_choices = (False, True) if ctx.options.search_mirrored \
        and not ctx.options.no_asymmetric else (False,)
    # ... and, with ``search_step_floor``, with the steady-state MicroPack floor where it binds.
    floor_choices = (False, True) if ctx.options.search_step_floor \
        and not ctx.options.steady_state_floor else (ctx.options.steady_state_floor,)
    contexts = {(m, f): _variant(ctx, mirrored=m, steady=f)
                for m, f in product(mirror_choices, floor_choices)}
    # The mirrored grouping holds the same rounds as the asymmetric one, so about the same
    # memory: it is tried only where the asymmetric plan of the same floor fits (a search
    # whose candidates all overflow would otherwise simulate each twice to rank peaks).
    over_memory: set[tuple[int | None, bool, bool]] = set()
    for s in candidates:
        merged_outliers = None
        for use_merge, steady, as_mirrored in product(merge_choices, floor_choices,
                                                      mirror_choices):
            if not use_merge and merged_outliers == 0:
                continue  # no outliers to merge: the no-merge plan is the same plan
            if steady and not ctx.options.steady_state_floor and not _floor_binds(ctx, s):
                continue  # the floor does not bind: the same plan as without it
            if as_mirrored and (s, use_merge, steady) in over_memory:
                continue
            build_ctx = contexts[(as_mirrored, steady)]
            mirrored = build_ctx.options.no_asymmetric  # what the candidate's backward is
            build_deadline = None  # the first candidate is always finished
            if best is not None:
                # A simulated plan is validated already: nothing to reserve but the margin.
                build_deadline = _build_deadline(deadline, 0.0)
                predicted = _predicted_build_s(build_seconds, last_slice, s)
                if build_deadline.remaining_s < predicted + 2 * sim_seconds:
                    # Not enough time left to build and judge another candidate: stop
                    # before starting one (its build would stop at the deadline, wasted).
                    return best, tried, True, best_record
            build_started = time.perf_counter()
            # Once a plan that fits is held, a candidate whose group overflows memory cannot
            # win (the build's peaks are the simulator's): its build stops at that group and
            # it is never simulated. The search's choice is the same; only its cost falls.
            holds_fit = best_key is not None and not best_key[0]
            try:
                candidate = build_plan(build_ctx, s, use_merge=use_merge,
                                       deadline=build_deadline,
                                       stop_over_bytes=budget if holds_fit else None)
            except OutOfTime:
                return best, tried, True, best_record
            except OverMemory as over:
                over_memory.add((s, use_merge, steady))
                if use_merge:
                    merged_outliers = over.outliers
                tried.append({"slice_tokens": s, "merge": use_merge, "mirrored": mirrored,
                              "steady_floor": steady, "outliers": over.outliers,
                              "built_s": deadline.elapsed_s, "oom": True, "simulated": False,
                              "peak_gib": over.peak_bytes / 2**30})
                continue
            build_seconds = max(build_seconds, time.perf_counter() - build_started)
            last_slice = s
            # Before any simulation has been timed, its build time predicts it (a simulation
            # walks the same units and schedule once more).
            if not sim_seconds:
                sim_seconds = build_seconds
            built_s = deadline.elapsed_s
            outliers = len(candidate.metadata["slimpack"]["outliers"])
            if use_merge:
                merged_outliers = outliers
            # Room for the simulation (which validates the plan) and the jitter of a busy
            # machine: twice the predicted simulation.
            units = _num_units(candidate)
            predicted_sim = sim_per_unit * units if sim_per_unit else sim_seconds
            if deadline.remaining_s < 2 * predicted_sim:
                # No time to judge it: a candidate never simulated is kept only as the
                # heuristic answer (the first), never in place of a simulated one.
                if best is None:
                    best = candidate.validate()
                    tried.append({"slice_tokens": s, "merge": use_merge, "mirrored": mirrored,
                                  "steady_floor": steady, "outliers": outliers,
                                  "built_s": built_s, "simulated": False})
                return best, tried, True, best_record
            sim_started = time.perf_counter()
            # simulate() validates the plan first: the plan kept is a validated one.
            record = simulate(candidate, model=ctx.model, hardware=ctx.hardware,
                              cost=ctx.cost, schedules=dict(build_ctx.schedules),
                              schedules_built=True).record
            sim_seconds = max(sim_seconds, time.perf_counter() - sim_started)
            sim_per_unit = max(sim_per_unit, (time.perf_counter() - sim_started) / units)
            tried.append({"slice_tokens": s, "merge": use_merge, "mirrored": mirrored,
                          "steady_floor": steady, "outliers": outliers, "built_s": built_s,
                          "step_time_s": record.step_time_s, "oom": record.oom})
            if record.oom:
                over_memory.add((s, use_merge, steady))
            key = _record_key(record)
            if best_key is None or key < best_key:
                best, best_key, best_record = candidate, key, record
    if uniform_applies(ctx):
        if best is not None:
            build_deadline = _build_deadline(deadline, 0.0)
            if build_deadline.remaining_s < build_seconds + 2 * sim_seconds:
                return best, tried, True, best_record
        built: list[Plan] = []
        for num_slices, by_tokens in product(uniform_counts(ctx), uniform_deals(ctx)):
            if built and _build_deadline(deadline, 0.0).remaining_s \
                    < build_seconds + 2 * sim_seconds:
                return best, tried, True, best_record
            candidate, schedules = uniform_plan(ctx, num_slices=num_slices, by_tokens=by_tokens)
            if any(candidate.phases == other.phases for other in built):
                continue  # the same plan as one built (both deals alike, or a count doubled)
            built.append(candidate)
            record = simulate(candidate, model=ctx.model, hardware=ctx.hardware, cost=ctx.cost,
                              schedules=schedules, schedules_built=True).record
            info = candidate.metadata["slimpack"]
            tried.append({"uniform": True, "uniform_slice_tokens": info["slice_tokens"],
                          "num_slices": info["num_slices"], "phase1": info["phase1"],
                          "built_s": deadline.elapsed_s, "step_time_s": record.step_time_s,
                          "oom": record.oom})
            key = _record_key(record)
            if best_key is None or key < best_key:
                best, best_key, best_record = candidate, key, record
    assert best is not None
    return best, tried, False, best_record
