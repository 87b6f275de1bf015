"""Plan every method on the same batch, simulate each, and report one record per method.

This is the library behind ``slimpack compare`` and the harness's method sweeps. With
``auto_parallel=True`` each method gets its own best (tp, cp, pp, vpp, dp) and recompute, as
the SlimPipe authors did for every method they compared (arXiv 2504.14519, section 6): the
memory model lists the candidates that fit, and every one is planned and simulated unless a
lower bound on its step (``step_lower_bound``) shows it cannot beat the best found so far.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from slimpack.batch import Batch
from slimpack.cost.kernel_model import default_cost_model
from slimpack.cost.memory import kv_bytes_per_token_per_layer
from slimpack.cost.model import CostModel, training_of
from slimpack.methods import DEFAULT_METHODS, MethodRegistry
from slimpack.plan import Plan
from slimpack.planning.auto_parallel import (
    Candidate,
    auto_parallel_candidates,
    estimate_fixed_length_step,
)
from slimpack.planning.method import SEARCH_SPACE, MethodSpec
from slimpack.planning.packing import sample_pieces
from slimpack.planning.setup import PlanSetup
from slimpack.planning.winners import layout_key, try_winner_layouts
from slimpack.records import MethodRecord, StepRecord
from slimpack.runtime.validate import refused_field, runtime_refusal
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec
from slimpack.specs.training import TrainingSpec

if TYPE_CHECKING:
    from slimpack.sim.redistribution import PricedGroup


@dataclass(frozen=True, kw_only=True)
class CompareSettings:
    context: int | None = None
    """Training context; default: the longest sequence of the batch."""
    time_limit_s: float | None = None
    """Passed to every planner (None: each planner's default)."""
    auto_parallel_top_k: int | Mapping[str, int | None] | None = None
    """Cap on layouts simulated per method (None: no cap; the lower bound prunes), or one cap
    per method name, which must name every method compared (None there: uncapped), so no
    method is searched more than another by omission. Unlike ``search_budget_s`` a count
    gives the same answer on every machine."""
    search_budget_s: float | None = None
    """Wall seconds per method's configuration search (None, the default: no limit). A
    safety net for interactive use only: a search stopped by it depends on the machine, and
    its record says so (``search_exhaustive`` False, ``fallback`` set)."""

    def __post_init__(self) -> None:
        if self.context is not None and self.context < 1:
            raise ValueError(f"context must be >= 1 token, got {self.context}")
        caps = (self.auto_parallel_top_k.values()
                if isinstance(self.auto_parallel_top_k, Mapping) else [self.auto_parallel_top_k])
        for cap in caps:
            if cap is not None and (not isinstance(cap, int) or cap < 1):
                raise ValueError(f"auto_parallel_top_k must be >= 1 or None (or a mapping of "
                                 f"method to such caps), got {self.auto_parallel_top_k!r}")
        if self.search_budget_s is not None and not self.search_budget_s > 0:
            raise ValueError(f"search_budget_s must be > 0 or None, got {self.search_budget_s}")

    def top_k_for(self, method: str) -> int | None:
        """The cap on layouts simulated for ``method`` (None: no cap); ValueError when a
        per-method mapping does not name it."""
        if isinstance(self.auto_parallel_top_k, Mapping):
            if method not in self.auto_parallel_top_k:
                raise ValueError(f"auto_parallel_top_k names no cap for {method!r} (it names "
                                 f"{sorted(self.auto_parallel_top_k)}); give every compared "
                                 f"method its cap, None for an uncapped search")
            return self.auto_parallel_top_k[method]
        return self.auto_parallel_top_k


def plan_method(method: str, batch: Batch, model: ModelSpec, hardware: HardwareSpec,
                parallel: ParallelSpec, cost: CostModel, *, context: int | None = None,
                registry: MethodRegistry = DEFAULT_METHODS,
                priced: dict[int, PricedGroup] | None = None, **options: Any) -> Plan:
    """Run method ``method``'s planner, ``plan(batch, setup, options)``: the one opening and
    closing every planner shares. Opening: ``options`` become the method's typed options
    dataclass (unknown or bad options fail before any work) and ``parallel`` is checked
    against ``model``. Closing: ``plan.metadata['plan_seconds']`` is the planner's wall time,
    ``plan.zero_stage`` is ``cost``'s recipe when the planner stated none, and
    ``plan.memory_fits`` is the simulator's memory walk under that recipe for a planner that
    gave no verdict of its own (the baselines give theirs, having escalated recompute
    until it fits). ``context`` is every method's option (None: the method's default);
    ``time_limit_s``, every method's too, is one of ``options``: absent, the planner's own
    safety net; None, no wall-clock limit at all (the harness). ``registry`` is where
    ``method`` is looked up (every function here takes one). ``priced``: where the plan's
    closing leaves the groups it priced (``PlanSetup.priced``), for :func:`_simulate`."""
    spec = registry.get(method)
    shared = {"context": context} if context is not None else {}
    if shared and "context" in options:
        raise ValueError(f"{method}: ['context'] given twice (as a setting and as a method "
                         f"option)")
    started = time.perf_counter()
    typed = spec.make_options({**shared, **options})
    if parallel.pipeline_split not in spec.pipeline_splits:
        raise ValueError(f"{method}: pipeline_split {parallel.pipeline_split!r} is not planned "
                         f"by this method; it plans {', '.join(spec.pipeline_splits)}")
    parallel.validate_for_model(model)
    setup = PlanSetup(model=model, hardware=hardware, parallel=parallel, cost=cost,
                      priced=priced)
    plan = spec.planner(batch, setup, typed)
    if plan.parallel.ep != parallel.ep:  # never price a layout other than the one asked for
        raise ValueError(f"{method}: planned ep={plan.parallel.ep} for a layout with "
                         f"ep={parallel.ep}; this planner does not carry expert parallelism")
    plan.metadata["plan_seconds"] = time.perf_counter() - started
    if plan.zero_stage is None:  # a planner that states no recipe was planned under cost's
        plan = dataclasses.replace(plan, zero_stage=setup.training.zero_stage)
    if plan.memory_fits is None:
        from slimpack.sim.memory import plan_fits_memory

        plan = dataclasses.replace(plan, memory_fits=plan_fits_memory(
            plan, model, hardware, setup.training))
    return plan


def paper_recipe_costs(methods: Sequence[str], model: ModelSpec, hardware: HardwareSpec,
                       registry: MethodRegistry = DEFAULT_METHODS) -> dict[str, CostModel]:
    """The default cost model under each method's paper recipe, for the methods whose paper ran
    them under another ZeRO stage than the suite's default (``MethodSpec.paper_zero_stage``:
    FlexSP and its Ulysses baselines under ZeRO-3): the ``method_costs`` that price every
    method as its paper ran it (``slimpack compare`` and the harness)."""
    default = TrainingSpec().zero_stage
    out: dict[str, CostModel] = {}
    for method in methods:
        stage = registry.get(method.split(":")[0]).paper_zero_stage
        if stage is not None and stage != default:
            out[method] = default_cost_model(model, hardware, TrainingSpec(zero_stage=stage))
    return out


def _simulate(plan: Plan, model: ModelSpec, hardware: HardwareSpec, cost: CostModel,
              price_cache: dict | None = None,
              priced: dict[int, PricedGroup] | None = None):
    from slimpack.sim import simulate  # the simulator is the judge; imported when needed

    return simulate(plan, model=model, hardware=hardware, cost=cost, validate=False,
                    price_cache=price_cache, priced=priced).record


def _record(method: str, plan: Plan, rec: StepRecord, parallel: ParallelSpec,
            cost: CostModel, search: Mapping[str, Any]) -> MethodRecord:
    """The record of ``method``'s ``plan`` on ``parallel``, simulated as ``rec``."""
    return MethodRecord(
        method=method, step=rec, parallel=parallel.to_dict(), recompute=_recompute_of(plan),
        offload=max(g.offload for g in plan.groups()),
        zero_stage=training_of(cost).zero_stage,
        plan_seconds=float(plan.metadata.get("plan_seconds", float("nan"))),
        # A planner that fell back to a simpler answer says so (never silently degrades).
        fallback=str(plan.metadata.get("fallback", "")),
        runtime_refusal=runtime_refusal(plan, cost.model), **search)


def _failed(method: str, parallel: ParallelSpec | None, cost: CostModel | None, error: str,
            search: Mapping[str, Any]) -> MethodRecord:
    """The record of a method that failed to plan or simulate: no step, ``error`` set."""
    return MethodRecord(method=method, step=None, error=error,
                        parallel=parallel.to_dict() if parallel is not None else None,
                        zero_stage=training_of(cost).zero_stage if cost is not None else None,
                        **search)


def _recompute_of(plan: Plan) -> str:
    modes = sorted({g.recompute for g in plan.groups()})
    return modes[0] if len(modes) == 1 else ",".join(modes)


CandidateFilter = Callable[[Candidate], bool]


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """The configuration search's answer for one method."""

    plan: Plan
    record: StepRecord
    """The simulated step of ``plan`` (every per-unit and per-stage field)."""
    parallel: ParallelSpec
    tried: tuple[dict[str, Any], ...]
    """Every candidate planned: its layout, lower bound, step seconds and OOM flag, or its
    error; a last ``{"stopped": ...}`` entry when a cap ended the search."""
    candidates: int
    """Memory-feasible layouts of the method."""
    simulated: int
    pruned: int
    """Layouts skipped because their lower bound could not beat the best step found."""
    exhaustive: bool
    """True when every layout was simulated or pruned: the answer is the simulator's best."""
    winner_layouts: int = 0
    """Of ``simulated``, layouts tried because a faster method won with them
    (:mod:`slimpack.planning.winners`), beyond the search's own cap."""
    space: str = ""
    """The layout space searched, in words (``MethodSpec.search_space``)."""
    unvisited: tuple[tuple[tuple, float], ...] = ()
    """(layout key, step lower bound) of every layout a cap left neither simulated nor
    pruned: the layouts that could still hold a faster plan (:attr:`gain_bound`)."""

    @property
    def gain_bound(self) -> float:
        """How much faster than this answer any plan on a layout the search did not
        simulate could be: the answer's step over the lowest step lower bound
        (:func:`step_lower_bound`) among the unvisited layouts whose bound is below it, minus
        one; 0 when there is none (an exhaustive search). A capped search's certificate: its
        method's exhaustive best is at least ``step / (1 + gain_bound)``."""
        step = self.record.step_time_s
        below = [bound for _, bound in self.unvisited if bound < step]
        return step / min(below) - 1.0 if below else 0.0


def method_candidates(method: str, model: ModelSpec, hardware: HardwareSpec, gpus: int,
                      context: int, candidate_filter: CandidateFilter | None = None,
                      registry: MethodRegistry = DEFAULT_METHODS) -> list[Candidate]:
    """The memory-feasible layouts of ``gpus`` GPUs that method ``method`` runs on."""
    spec = registry.get(method)
    candidates = spec.candidates(auto_parallel_candidates(
        model, hardware, gpus, context, schedule=spec.schedule_family,
        max_cp=SEARCH_SPACE.max_cp, max_pp=SEARCH_SPACE.max_pp,
        vpp_options=SEARCH_SPACE.vpp_options))
    if candidate_filter is not None:
        candidates = [c for c in candidates if candidate_filter(c)]
    return candidates


def step_lower_bound(cost: CostModel, lengths: Sequence[int], parallel: ParallelSpec, *,
                     ring_cp: bool = False) -> float:
    """Seconds no plan that trains the sequences ``lengths`` can beat on ``parallel``: their
    layer work (forward and backward, no recompute, each sequence causal under its own mask)
    priced as one kernel per layer at ``parallel.tp``, spread perfectly over the ``dp * cp``
    GPUs of the most loaded pipeline stage, with no bubble and no communication. ``lengths``
    are the sequences the method trains: for a method that cuts documents at sample
    boundaries, the pieces (:func:`bound_lengths`). With ``ring_cp`` (a method whose
    ``MethodSpec.ring_cp_at_layout_degree`` holds), the larger of that and the ring's K/V
    traffic (:func:`ring_cp_bound`).

    It is a bound because the cost model's kernels are sub-additive: packing pieces into one
    kernel never costs more than running them apart (tiles and waves round up, fixed costs are
    paid per kernel), and the most loaded GPU carries at least the average. Full-context
    attention over a sample (no document masks) only adds work to the pieces it holds.
    """
    compute = _bound_from_layer_work(_batch_layer_seconds(cost, lengths, parallel.tp), parallel,
                                     cost.model.num_layers)
    return max(compute, ring_cp_bound(cost, sum(lengths), parallel)) if ring_cp else compute


def ring_cp_bound(cost: CostModel, tokens: int, parallel: ParallelSpec) -> float:
    """Seconds the K/V traffic of ring attention alone keeps the most loaded pipeline stage
    busy when every one of ``tokens`` goes through a ring over at least ``parallel.cp`` ranks
    (0 at cp = 1).

    The simulator prices each unit's layer as the longer of its attention and the ring's
    ``cp - 1`` steps, each a p2p of the unit's largest CP shard of K and V (``2 (cp - 1)`` in
    backward, which sends dK and dV too: ``slimpack.sim.costs.unit_layer_seconds``). So a
    stage's ops last at least ``3 (cp - 1)`` such transfers per layer, and summed over the
    stage's GPUs the shards hold every token: its busiest GPU moves at least
    ``3 (cp - 1) * tokens / (dp * cp)`` tokens' K and V per layer over the layer's bandwidth
    (the latency left out). A merged group (DP-Merge) over ``k * cp`` ranks moves more, not
    less. The link: NVLink when the tp * cp GPUs of a stage can share a node (the faster,
    whatever the placement), else the inter-node one, as every such group spans nodes.
    """
    if parallel.cp == 1:
        return 0.0
    model, comm = cost.model, cost.comm
    intra = parallel.tp * parallel.cp <= parallel.gpus_per_node
    shard_bytes = tokens / (parallel.dp * parallel.cp) \
        * kv_bytes_per_token_per_layer(model, parallel.tp)
    per_layer = 3 * (parallel.cp - 1) * (comm.p2p(shard_bytes, intra_node=intra)
                                         - comm.p2p(0.0, intra_node=intra))
    return -(-model.num_layers // parallel.pp) * per_layer


def bound_lengths(spec: MethodSpec, batch: Batch, context: int) -> Sequence[int]:
    """The sequence lengths :func:`step_lower_bound` prices for method ``spec``: the batch's
    documents, or, for a method that may cut documents at sample boundaries
    (``MethodSpec.cuts_at_sample_boundaries``), the pieces Megatron-LM's GPTDataset cuts them
    into at ``context`` (:func:`slimpack.planning.packing.sample_pieces`), whose attention is
    smaller: the whole documents would over-price such a method and could prune its best
    layout."""
    return sample_pieces(batch, context).lengths if spec.cuts_at_sample_boundaries \
        else batch.lengths


def _batch_layer_seconds(cost: CostModel, lengths: Sequence[int], tp: int) -> float:
    """Forward + backward seconds of one layer over the whole batch as one kernel set."""
    times = cost.layer_times([(n, 0) for n in lengths], tp=tp)
    return times.forward_s + times.backward_s


def _bound_from_layer_work(layer_seconds: float, parallel: ParallelSpec, num_layers: int) -> float:
    layers = -(-num_layers // parallel.pp)
    return layers * layer_seconds / (parallel.dp * parallel.cp)


def best_parallel(method: str, batch: Batch, model: ModelSpec, hardware: HardwareSpec,
                  gpus: int, cost: CostModel, *, context: int, top_k: int | None = None,
                  budget_s: float | None = None,
                  candidate_filter: CandidateFilter | None = None,
                  estimate_cache: dict | None = None,
                  registry: MethodRegistry = DEFAULT_METHODS, **options: Any) -> SearchResult:
    """The configuration search (the only one in the suite): plan and simulate the
    memory-feasible layouts, skipping every one whose :func:`step_lower_bound` is no better
    than the fastest in-memory step found so far, so the answer is the true best of the
    simulator unless a cap stops the search early.

    Order: the fixed-length estimate's ranking, so a capped search keeps the most promising
    layouts (the order changes only the time of an exhaustive search, never its answer).
    ``top_k`` caps the layouts simulated and ``budget_s`` the seconds spent
    planning and simulating them (checked between layouts; ranking is not counted);
    ``estimate_cache`` shares the ranking's work and the simulator's unit prices between calls
    on the same batch, cost model and context (``compare`` passes one for all its methods);
    ``SearchResult.exhaustive`` says whether every layout was simulated or pruned. Returns the
    fastest layout that does not run out of memory (or the fastest overall when all do). A
    layout that fails to plan is skipped and listed in ``tried``; ValueError when none plans."""
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 or None, got {budget_s}")
    candidates = method_candidates(method, model, hardware, gpus, context, candidate_filter,
                                   registry)
    if not candidates:
        raise ValueError(f"no parallel configuration of {gpus} GPUs fits {model.name} at "
                         f"context {context} for {method}; add GPUs or shorten the context")
    spec = registry.get(method)
    lengths = bound_lengths(spec, batch, context)
    work_of_tp: dict[int, float] = {}  # the bound's kernel sum depends on tp only
    for cand in candidates:
        if cand.parallel.tp not in work_of_tp:
            work_of_tp[cand.parallel.tp] = _batch_layer_seconds(cost, lengths, cand.parallel.tp)
    bounds = [_bound_from_layer_work(work_of_tp[c.parallel.tp], c.parallel, model.num_layers)
              for c in candidates]
    if spec.ring_cp_at_layout_degree:
        tokens = sum(lengths)
        bounds = [max(b, ring_cp_bound(cost, tokens, c.parallel))
                  for b, c in zip(bounds, candidates, strict=True)]
    cache = {} if estimate_cache is None else estimate_cache
    estimates = [estimate_fixed_length_step(cost, batch.lengths, c, context, cache=cache)
                 for c in candidates]
    order = sorted(range(len(candidates)), key=lambda i: (estimates[i], bounds[i]))
    started = time.perf_counter()
    best: tuple[tuple[bool, float], Plan, StepRecord, ParallelSpec] | None = None
    tried: list[dict[str, Any]] = []
    unvisited: tuple[tuple[tuple, float], ...] = ()
    errors: list[str] = []
    simulated = pruned = 0
    for position, i in enumerate(order):
        cand = candidates[i]
        incumbent = best[0][1] if best is not None and not best[0][0] else math.inf
        if bounds[i] >= incumbent:
            pruned += 1
            continue
        cap = ("top_k" if top_k is not None and simulated >= top_k else
               "budget_s" if budget_s is not None and simulated
               and time.perf_counter() - started > budget_s else None)
        if cap is not None:
            left = [j for j in order[position:] if bounds[j] < incumbent]
            unvisited = tuple((layout_key(candidates[j].parallel), bounds[j]) for j in left)
            tried.append({"stopped": f"{cap} reached with {len(left)} layouts unvisited"})
            break
        entry: dict[str, Any] = {"parallel": cand.parallel.to_dict(), "lower_bound_s": bounds[i]}
        simulated += 1
        try:
            priced: dict[int, PricedGroup] = {}
            plan = plan_method(method, batch, model, hardware, cand.parallel, cost,
                               context=context, registry=registry, priced=priced, **options)
            rec = _simulate(plan, model, hardware, cost,
                            price_cache=cache.setdefault("unit_prices", {}), priced=priced)
        except (ValueError, RuntimeError) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            errors.append(f"{cand.parallel.describe()}: {entry['error']}")
            tried.append(entry)
            continue
        entry.update(step_time_s=rec.step_time_s, oom=rec.oom)
        tried.append(entry)
        key = (rec.oom, rec.step_time_s)
        if best is None or key < best[0]:
            best = (key, plan, rec, cand.parallel)
    if best is None:
        raise ValueError(f"{method}: no candidate layout could be planned: " + "; ".join(errors))
    exhaustive = not any("stopped" in t for t in tried)
    best[1].metadata["parallel_search"] = {
        "candidates": len(candidates), "simulated": simulated, "pruned_by_bound": pruned,
        "exhaustive": exhaustive, "seconds": time.perf_counter() - started}
    return SearchResult(plan=best[1], record=best[2], parallel=best[3], tried=tuple(tried),
                        candidates=len(candidates), simulated=simulated, pruned=pruned,
                        exhaustive=exhaustive, unvisited=unvisited, space=spec.search_space())


def extend_search(found: SearchResult, method: str, layouts: Sequence[ParallelSpec],
                  batch: Batch, model: ModelSpec, hardware: HardwareSpec, gpus: int,
                  cost: CostModel, *, context: int,
                  candidate_filter: CandidateFilter | None = None,
                  estimate_cache: dict | None = None,
                  registry: MethodRegistry = DEFAULT_METHODS, **options: Any) -> SearchResult:
    """``found`` after also planning and simulating ``layouts`` (those of them in the
    method's search space and ``candidate_filter``), whatever cap ended its search: the
    faster answer, with every layout tried listed and counted in ``winner_layouts``."""
    wanted = {layout_key(p) for p in layouts}

    def keep(cand: Candidate) -> bool:
        return layout_key(cand.parallel) in wanted and (
            candidate_filter is None or candidate_filter(cand))

    if not method_candidates(method, model, hardware, gpus, context, keep, registry):
        return found  # none of them is a layout this method may use
    # The extra search is exhaustive over the wanted layouts: each is simulated, fails to
    # plan, or is pruned by a bound at least the extra search's incumbent, which is no faster
    # than the final answer. None of them can still beat it, so none stays unvisited.
    still_unvisited = tuple(u for u in found.unvisited if u[0] not in wanted)
    try:
        extra = best_parallel(method, batch, model, hardware, gpus, cost, context=context,
                              candidate_filter=keep, estimate_cache=estimate_cache,
                              registry=registry, **options)
    except ValueError:  # none of them could be planned: the search's answer stands
        return dataclasses.replace(found, unvisited=still_unvisited)
    better = (extra.record.oom, extra.record.step_time_s) < (found.record.oom,
                                                             found.record.step_time_s)
    base = extra if better else found
    return dataclasses.replace(
        base, tried=found.tried + extra.tried, simulated=found.simulated + extra.simulated,
        pruned=found.pruned + extra.pruned, candidates=found.candidates,
        exhaustive=found.exhaustive, unvisited=still_unvisited,
        winner_layouts=found.winner_layouts + extra.simulated)


def compare_method(*, method: str, batch: Batch, model: ModelSpec, hardware: HardwareSpec,
                   gpus: int, parallel: ParallelSpec | None, auto_parallel: bool,
                   cost: CostModel, context: int | None,
                   top_k: int | None, budget_s: float | None, options: Mapping[str, Any],
                   estimate_cache: dict | None = None,
                   registry: MethodRegistry = DEFAULT_METHODS) -> MethodRecord:
    """One method's record of :func:`compare` (``speedup_vs_first`` left NaN): its planner on
    ``parallel`` or, with ``auto_parallel``, its :func:`best_parallel`; a method that fails
    gets ``error`` set and no step. ``context`` None (a fixed layout only): each planner's
    default."""
    return _compare_method(method=method, batch=batch, model=model, hardware=hardware,
                           gpus=gpus, parallel=parallel, auto_parallel=auto_parallel,
                           cost=cost, context=context, top_k=top_k, budget_s=budget_s,
                           options=options, estimate_cache=estimate_cache,
                           registry=registry)[0]


def _compare_method(*, method: str, batch: Batch, model: ModelSpec, hardware: HardwareSpec,
                    gpus: int, parallel: ParallelSpec | None, auto_parallel: bool,
                    cost: CostModel, context: int | None,
                    top_k: int | None, budget_s: float | None, options: Mapping[str, Any],
                    estimate_cache: dict | None = None,
                    registry: MethodRegistry = DEFAULT_METHODS,
                    ) -> tuple[MethodRecord, SearchResult | None]:
    """:func:`compare_method`'s record and, with ``auto_parallel``, the search behind it."""
    try:
        if auto_parallel:
            assert context is not None, "a layout search needs the training context"
            found = best_parallel(method, batch, model, hardware, gpus, cost, context=context,
                                  top_k=top_k, budget_s=budget_s, estimate_cache=estimate_cache,
                                  registry=registry, **options)
            return searched_record(method, found, cost), found
        assert parallel is not None
        priced: dict[int, PricedGroup] = {}
        plan = plan_method(method, batch, model, hardware, parallel, cost, context=context,
                           registry=registry, priced=priced, **options)
        rec = _simulate(plan, model, hardware, cost, priced=priced)
        return _record(method, plan, rec, parallel, cost, search_columns("fixed layout", None)), None
    except (ValueError, RuntimeError) as exc:
        search = {**search_columns("fixed layout" if not auto_parallel else "", None),
                  "search_exhaustive": None}
        return _failed(method, parallel or ParallelSpec.for_world(gpus), cost,
                       f"{type(exc).__name__}: {exc}", search), None


def searched_record(method: str, found: SearchResult, cost: CostModel) -> MethodRecord:
    """The record of a method at the layout its search found."""
    record = _record(method, found.plan, found.record, found.parallel, cost,
                     search_columns(search_summary(found), found))
    clock_stop = [t["stopped"] for t in found.tried
                  if "stopped" in t and t["stopped"].startswith("budget_s")]
    if clock_stop:
        # The wall-clock search budget chose the layout: this machine's answer only.
        record = dataclasses.replace(record, fallback="; ".join(
            filter(None, (record.fallback, f"search {clock_stop[0]}"))))
    return record


def search_summary(found: SearchResult) -> str:
    """One line on what a search covered, for records and tables."""
    text = (f"{found.simulated} of {found.candidates} layouts simulated, "
            f"{found.pruned} pruned by bound")
    if found.winner_layouts:
        text += f", {found.winner_layouts} of them because a faster method won with them"
    return text


def search_columns(search: str, found: SearchResult | None) -> dict[str, Any]:
    """What a record says about the layout search behind it: the space, and how many layouts
    it held, simulated and pruned (None for a fixed layout), so a reader can check that no
    method was searched less than another."""
    return {"search": search, "search_exhaustive": found.exhaustive if found else True,
            "search_space": found.space if found else "fixed layout",
            "layouts_candidates": found.candidates if found else None,
            "layouts_simulated": found.simulated if found else None,
            "layouts_pruned": found.pruned if found else None,
            "layouts_from_winners": found.winner_layouts if found else None,
            "search_gain_bound": found.gain_bound if found else None}


def compare(methods: Sequence[str], batch: Batch, model: ModelSpec, hardware: HardwareSpec,
            gpus: int, parallel: ParallelSpec | None = None, auto_parallel: bool = False, *,
            cost: CostModel | None = None, context: int | None = None,
            time_limit_s: float | None = None,
            auto_parallel_top_k: int | Mapping[str, int | None] | None = None,
            search_budget_s: float | None = None, progress: bool = False,
            method_options: Mapping[str, Mapping[str, Any]] | None = None,
            method_costs: Mapping[str, CostModel] | None = None, jobs: int = 1,
            registry: MethodRegistry = DEFAULT_METHODS) -> list[MethodRecord]:
    """One :class:`~slimpack.records.MethodRecord` per method, in ``methods`` order.

    ``method_costs`` gives some methods their own cost model, e.g. a ZeRO-3 recipe
    (``TrainingSpec(zero_stage=3)``) for the sequence-parallel methods whose papers ran them
    so; the others use ``cost``.

    Give ``parallel`` (its world size must equal ``gpus``) or ``auto_parallel=True``. A method
    that fails to plan or simulate gets a record with ``error`` set and no step, so one
    broken method never hides the others. ``speedup_vs_first`` is the first method's step time
    over this one's. ``registry`` holds the methods (:data:`slimpack.methods.DEFAULT_METHODS`
    unless a caller adds its own). ``jobs`` > 1 runs that many methods at once, each in its own process
    (the records are the same as with one job).
    """
    if not methods:
        raise ValueError("methods must name at least one planner")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if parallel is None and not auto_parallel:
        raise ValueError("give parallel degrees or auto_parallel=True")
    if parallel is not None and not auto_parallel and parallel.world != gpus:
        raise ValueError(f"parallel degrees {parallel.describe()} use {parallel.world} GPUs "
                         f"but gpus={gpus}")
    settings = CompareSettings(context=context, time_limit_s=time_limit_s,
                               auto_parallel_top_k=auto_parallel_top_k,
                               search_budget_s=search_budget_s)
    cost = cost or default_cost_model(model, hardware)
    ctx = settings.context or max(batch.lengths)
    method_options = method_options or {}
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    unknown = sorted(set(method_costs or {}) - set(methods))
    if unknown:
        raise ValueError(f"method_costs names methods not compared: {unknown}")
    jobs = min(jobs, len(methods))
    tasks = []
    for method in methods:
        # ``time_limit_s`` travels in the options (None there: no wall-clock net at all, as
        # the harness plans); the shared setting joins them unless a method names its own.
        options = dict(method_options.get(method, {}))
        if settings.time_limit_s is not None:
            if "time_limit_s" in options:
                raise ValueError(f"{method}: time_limit_s given twice (as a setting and as a "
                                 f"method option)")
            options["time_limit_s"] = settings.time_limit_s
        tasks.append(dict(method=method, batch=batch, model=model, hardware=hardware, gpus=gpus,
                          parallel=parallel, auto_parallel=auto_parallel,
                          cost=(method_costs or {}).get(method, cost), context=ctx,
                          top_k=settings.top_k_for(method),
                          budget_s=settings.search_budget_s, options=options,
                          registry=registry))
    bar = tqdm(total=len(methods), desc="compare", unit="method", disable=not progress,
               file=sys.stderr, leave=False)
    if jobs <= 1:
        # One batch, cost model and context: the ranking's work and unit prices are shared
        # by every method that uses the same cost model.
        caches: dict[int, dict] = {}
        results = []
        for task in tasks:
            bar.set_postfix_str(task["method"])
            results.append(_compare_method(
                **task, estimate_cache=caches.setdefault(id(task["cost"]), {})))
            bar.update()
    else:
        # Methods are independent: each runs in its own process (its own caches).
        # Methods that simulate to plan (MethodSpec.simulates_to_plan: SlimPipe, SlimPack)
        # cost the most per layout, so they start first and the processes finish closer
        # together. Wall time only: each record is its own.
        heavy = {name for name in registry.names() if registry.get(name).simulates_to_plan}
        start_order = sorted(range(len(tasks)),
                             key=lambda i: (tasks[i]["method"] not in heavy, i))
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_compare_method, **tasks[i]): i for i in start_order}
            results_at: dict[int, tuple[MethodRecord, SearchResult | None]] = {}
            for future in as_completed(futures):
                results_at[futures[future]] = future.result()
                bar.set_postfix_str(results_at[futures[future]][0].method)
                bar.update()
        results = [results_at[i] for i in range(len(tasks))]
        caches = {}
    bar.close()
    records = [record for record, _ in results]
    if auto_parallel:
        records = _with_winner_layouts(tasks, results, caches)
    first = records[0].step_time_s
    return [dataclasses.replace(record, speedup_vs_first=first / record.step_time_s
                                if record.step_time_s and not math.isnan(record.step_time_s)
                                else float("nan"))
            for record in records]


def _with_winner_layouts(tasks: list[dict[str, Any]],
                         results: list[tuple[MethodRecord, SearchResult | None]],
                         caches: dict[int, dict]) -> list[MethodRecord]:
    """The records after :func:`slimpack.planning.winners.try_winner_layouts`: a method whose
    capped search is slower than another method is also tried on that method's layout."""
    by_method = {task["method"]: task for task in tasks}

    def extend(method: str, found: SearchResult, layouts: list[ParallelSpec]) -> SearchResult:
        task = by_method[method]
        return extend_search(found, method, layouts, task["batch"], task["model"],
                             task["hardware"], task["gpus"], task["cost"],
                             context=task["context"],
                             estimate_cache=caches.setdefault(id(task["cost"]), {}),
                             registry=task["registry"], **task["options"])

    answers = {task["method"]: found for task, (_, found) in zip(tasks, results, strict=True)}
    answers = try_winner_layouts(answers, extend)
    rows = []
    for task, (row, found) in zip(tasks, results, strict=True):
        now = answers[task["method"]]
        rows.append(row if now is None or now is found else
                    searched_record(task["method"], now, task["cost"]))
    return rows


def format_table(records: Sequence[MethodRecord]) -> str:
    """A fixed-width text table of compare records."""
    rows = [record.to_dict() for record in records]
    headers = ("method", "parallel", "recompute", "step s", "tokens/s", "MFU", "bubble",
               "peak GiB", "OOM", "speedup", "step/ideal", "plan s", "runtime")
    lines = []
    for r in rows:
        p = r["parallel"]
        par = "" if p is None else f"tp{p['tp']} cp{p['cp']} pp{p['pp']} dp{p['dp']}" + (
            f" v{p['vpp']}" if p.get("vpp", 1) > 1 else "")
        if r.get("error"):
            lines.append((r["method"], par, "", "error", "", "", "", "", "", "", "", "", ""))
            continue
        lines.append((r["method"], par, r["recompute"], f"{r['step_time_s']:.3f}",
                      f"{r['tokens_per_s']:,.0f}", f"{100 * r['mfu']:.1f}%",
                      f"{100 * r['bubble_fraction']:.1f}%", f"{r['peak_memory_gib']:.1f}",
                      "yes" if r["oom"] else "no", f"{r['speedup_vs_first']:.2f}x",
                      f"{r['step_over_ideal']:.2f}", f"{r['plan_seconds']:.3f}",
                      runtime_column(r["runtime_refusal"])))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out += [f"{r['method']}: {r['error']}" for r in rows if r.get("error")]
    if any(r.get("runtime_refusal") and not r.get("error") for r in rows):
        out.append("runtime: 'no: FIELD' = `slimpack run` refuses that plan field (the whole "
                   "message is the record's runtime_refusal; docs/architecture.md, runtime)")
    return "\n".join(out)


def runtime_column(refusal: str) -> str:
    """The table's ``runtime`` cell: "runs", or "no: FIELD" with the plan field refused."""
    return f"no: {refused_field(refusal)}" if refusal else "runs"
