"""Shared steps of the method-comparison experiments: draw a batch, plan, simulate, flatten.

Library imports happen inside the functions, so listing experiments stays cheap.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from repro.experiment import Experiment, Point, Row

if TYPE_CHECKING:
    from slimpack.methods import MethodRegistry


def method_registry(registry: MethodRegistry | None) -> MethodRegistry:
    """``registry``, or the suite's (:data:`slimpack.methods.DEFAULT_METHODS`) for None: the
    harness's functions take None so that importing an experiment imports no planner."""
    from slimpack.methods import DEFAULT_METHODS

    return DEFAULT_METHODS if registry is None else registry


def all_methods(registry: MethodRegistry | None = None) -> tuple[str, ...]:
    """Every method the suite compares, from the registry (``MethodSpec.compared``), in its
    order: a method registered there joins every all-method experiment."""
    return tuple(method_registry(registry).compared_names())


def over_methods(experiment: Experiment, registry: MethodRegistry) -> Experiment:
    """``experiment`` over ``registry``'s methods instead of the suite's: its ``points``,
    ``run_point`` and ``plot`` (which all take ``registry=``) bound to it. The all-method
    experiments (e2e-throughput, balance, memory, solver-overhead) support it; a harness
    registry module can hold the result as its ``EXPERIMENT``."""
    fields = ("points", "run_point", "plot")
    lacking = [f for f in fields
               if "registry" not in inspect.signature(getattr(experiment, f)).parameters]
    if lacking:
        raise ValueError(f"experiment {experiment.name!r} takes no method registry: its "
                         f"{', '.join(lacking)} have no registry= parameter (all-method "
                         f"experiments: e2e-throughput, balance, memory, solver-overhead)")
    bound = {f: functools.partial(getattr(experiment, f), registry=registry) for f in fields}
    return dataclasses.replace(experiment, **bound)


BASELINE = "megatron"
MEGATRON_BRACKET = ("megatron", "megatron-causal")
"""Megatron-LM with and without document masks: the paper does not say which it ran, so every
SlimPack-over-Megatron claim is shown against both (``Claim.bracket``), judged on the first."""
BEST_LAYOUT, FIXED_LAYOUT = "best layout", "fixed layout"
"""The ``protocol`` of a method comparison's row (issue 24): each method at the layout its own
search found best (as the SlimPipe authors compared methods), or every method at Megatron-LM's
best layout (the papers' protocol of one configuration for all)."""
SLIMPACK_SOURCE = "SlimPack arXiv 2509.26246"
SLIMPIPE_SOURCE = "SlimPipe arXiv 2504.14519"
TIMING_COLUMNS = ("plan_seconds", "sim_seconds")
HARNESS_METHOD_OPTIONS: dict[str, Any] = {"time_limit_s": None}
"""Planner options every harness plan uses, for every method: no wall-clock safety net. Each
planner's search is bounded by counts (SlimPack's ``search_candidates``, SlimPipe's
``max_trials``, FlexSP's MILP node limit, WLB-LLM's extra micro-batch count); a clock-stopped
search gives a plan that depends on the machine's load, so records never rely on one
(:mod:`slimpack.planning.deadline`). An experiment cannot set a limit back
(:func:`with_harness_options` refuses it)."""


def harness_caps(methods: tuple[str, ...] | list[str],
                 registry: MethodRegistry | None = None, *,
                 capped: bool = False) -> dict[str, int | None]:
    """Every entry's cap on the layouts its configuration search simulates (entries may be
    ``"planner:variant"``): None, every layout the step lower bound does not prune, for every
    method, so no method is searched less than another.

    ``capped`` (the papers' batches of 512 context-length samples: e2e-throughput, paper-scale
    and batch-size's largest point): each method's ``MethodSpec.search_layouts``, a count, so
    records are the same on every machine. Only SlimPack sets one: its exhaustive search
    there costs 5 to 65 minutes a point, a capped SlimPack can only understate its ratios,
    the winner-layout pass then plans it on every layout a faster method won with, and its
    capped answers are audited against its exhaustive search (``repro.scripts.cap_audit``).
    Every baseline stays exhaustive: a capped one could only inflate the ratios over it."""
    registry = method_registry(registry)
    return {m: registry.get(m.split(":")[0]).search_layouts if capped else None
            for m in methods}


DOCUMENTS_WORKLOAD = "documents"
"""A record's ``workload`` when every method got the batch's documents (each cutting them its
own way); rows without the column are that too. Under any other workload (the same sample
pieces for every method) no method cuts what another keeps (``repro.diagnosis``, rule 5)."""
SAMPLE_PIECES_WORKLOAD = "sample pieces"
"""The ``workload`` of the same batch cut into Megatron-LM's sample pieces for every method
(``slimpack.planning.packing.sample_pieces``): the sibling the diagnosis's ``documents`` rule
compares with (``e2e-throughput``, ``balance``)."""
WORKLOADS = (DOCUMENTS_WORKLOAD, SAMPLE_PIECES_WORKLOAD)


def documents_only(records: pd.DataFrame) -> pd.DataFrame:
    """The rows of the documents workload (records without a ``workload`` are those)."""
    if records.empty or "workload" not in records.columns:
        return records
    return records[records["workload"].fillna(DOCUMENTS_WORKLOAD) == DOCUMENTS_WORKLOAD]


def workload_batch(point: Point, experiment: str) -> Any:
    """The point's batch under its ``workload`` (none: documents): the documents drawn
    (:func:`draw_batch`), or those documents cut into Megatron-LM's sample pieces for every
    method."""
    from slimpack.planning.packing import sample_pieces

    workload = point.get("workload", DOCUMENTS_WORKLOAD)
    if workload not in WORKLOADS:
        raise ValueError(f"{experiment}: workload must be one of {WORKLOADS}, got "
                         f"{workload!r}")
    batch = draw_batch(point, experiment)
    return sample_pieces(batch, point["context"]) if workload == SAMPLE_PIECES_WORKLOAD \
        else batch


def draw_batch(point: Point, experiment: str) -> Any:
    """The point's global batch: ``global_batch`` documents of ``dataset`` split at ``context``,
    or, when the point has ``token_budget``, documents drawn until that many tokens.

    A global batch counts sequences (documents after splitting), the unit the planners pack;
    ``seed`` makes it reproducible on any machine (numpy PCG64).
    """
    from slimpack import data

    if "token_budget" in point:  # paper-scale: the batch counted in tokens, not documents
        return data.sample_batch(point["dataset"], token_budget=point["token_budget"],
                                 context=point["context"], seed=point["seed"])
    return data.sample_batch(point["dataset"], num_sequences=point["global_batch"],
                             context=point["context"], seed=point["seed"])


def jsonable(value: Any) -> Any:
    """Scalars as they are; lists, tuples and dicts as JSON text (one CSV cell)."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def flatten(record: dict[str, Any]) -> Row:
    return {key: jsonable(value) for key, value in record.items()}


def compare_rows(point: Point, methods: tuple[str, ...], experiment: str,
                 registry: MethodRegistry | None = None, **extra: Any) -> list[Row]:
    """One row per method from ``slimpack.compare.compare`` on the point's workload, the
    methods looked up in ``registry`` (None: the suite's)."""
    from slimpack.compare import compare, paper_recipe_costs
    from slimpack.specs import ParallelSpec, hardware_preset, model_preset

    registry = method_registry(registry)
    batch = extra.pop("batch", None) or draw_batch(point, experiment)
    # Harness searches are never bounded by wall time, so every machine computes the same
    # records: exhaustive (bound-pruned) for every method unless the experiment caps by count.
    extra.setdefault("auto_parallel_top_k", harness_caps(methods, registry))
    extra.setdefault("search_budget_s", None)
    extra["method_options"] = with_harness_options(methods, extra.get("method_options"))
    model, hardware = model_preset(point["model"]), hardware_preset(point["hardware"])
    # Every method priced under its paper's recipe (FlexSP and the Ulysses baselines ZeRO-3)
    # unless the experiment gives its own costs; the records carry ``zero_stage``.
    if extra.get("cost") is None:
        extra["method_costs"] = {**paper_recipe_costs(methods, model, hardware, registry),
                                 **(extra.get("method_costs") or {})}
    parallel = None
    if point.get("parallel"):
        parallel = ParallelSpec.for_world(point["num_gpus"], **point["parallel"])
    records = compare(list(methods), batch, model, hardware, point["num_gpus"], parallel=parallel,
                      auto_parallel=parallel is None, context=point["context"],
                      registry=registry, **extra)
    return method_rows(records)


def method_rows(records: Any) -> list[Row]:
    """The harness rows of ``slimpack.records.MethodRecord`` values: every method row of every
    experiment has the one schema (``METHOD_RECORD_COLUMNS``), checked here."""
    from slimpack.records import check_method_row

    rows = []
    for record in records:
        row = record.to_row()
        check_method_row(row)
        rows.append(row)
    return rows


def with_harness_options(methods: tuple[str, ...],
                         given: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Every entry's options: ``given`` (entries may be ``"planner:variant"``) over
    :data:`HARNESS_METHOD_OPTIONS`. A wall-clock limit in ``given`` is refused: the harness
    never lets one decide a record."""
    out = {}
    for entry in methods:
        options = {**HARNESS_METHOD_OPTIONS, **(given or {}).get(entry, {})}
        if options["time_limit_s"] is not None:
            raise ValueError(f"{entry}: the harness plans without a wall-clock limit; "
                             f"time_limit_s must be None, got {options['time_limit_s']!r}")
        out[entry] = options
    return out


def simulate_planner(point: Point, method: str, experiment: str, batch: Any = None,
                     registry: MethodRegistry | None = None, **options: Any) -> Row:
    """One method's record at the point's fixed parallel config: ``slimpack.compare``'s
    fixed-layout path (``plan_method``, then the simulator), so the row has every
    ``MethodRecord`` column; a method that fails to plan gets ``error`` set."""
    from slimpack.compare import compare_method
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.specs import ParallelSpec, hardware_preset, model_preset

    model, hardware = model_preset(point["model"]), hardware_preset(point["hardware"])
    parallel = ParallelSpec.for_world(point["num_gpus"], **point["parallel"])
    batch = batch if batch is not None else draw_batch(point, experiment)
    options = with_harness_options((method,), {method: options})[method]
    # The planner's own context unless the experiment gives one, as a direct planner call.
    context = options.pop("context", None)
    record = compare_method(method=method, batch=batch, model=model, hardware=hardware,
                            gpus=parallel.world, parallel=parallel, auto_parallel=False,
                            cost=default_cost_model(model, hardware),
                            context=context, top_k=None, budget_s=None, options=options,
                            registry=method_registry(registry))
    return method_rows([record])[0]


def speedups(records: pd.DataFrame, keys: list[str], baseline: str = BASELINE,
             value: str = "tokens_per_s") -> pd.DataFrame:
    """Add ``speedup``: each row's ``value`` over the baseline method's in the same point."""
    if records.empty or "method" not in records.columns:
        return records.assign(speedup=pd.Series(dtype=float))
    base = records[records["method"] == baseline][keys + [value]].rename(columns={value: "_base"})
    merged = records.merge(base, on=keys, how="left")
    merged["speedup"] = merged[value] / merged["_base"]
    return merged.drop(columns="_base")


def fits_memory(frame: pd.DataFrame) -> pd.Series:
    """Per row: planned and fits memory. A row whose planning failed (``error`` set) or that
    has no memory verdict counts as *not* fitting: a planning error is an error, never "fits"."""
    if frame.empty:
        return pd.Series(dtype=bool)
    oom = frame["oom"] if "oom" in frame.columns else pd.Series("", index=frame.index)
    fits = oom.astype(str).str.strip().str.lower() == "false"
    if "error" in frame.columns:
        fits &= frame["error"].fillna("").astype(str).str.strip() == ""
    return fits


def bracket_speedups(records: pd.DataFrame, keys: list[str], reduce,
                     baselines: tuple[str, ...] = MEGATRON_BRACKET,
                     value: str = "tokens_per_s") -> tuple[tuple[str, float], ...]:
    """``(baseline, reduce(speedups))`` for each baseline of the bracket: ``reduce`` maps the
    frame from :func:`speedups` (over that baseline) to one number (NaN when no data)."""
    out = []
    for baseline in baselines:
        frame = speedups(records, keys, baseline=baseline, value=value)
        out.append((baseline, float(reduce(frame))))
    return tuple(out)


def best_record_rows(point: Point, methods: tuple[str, ...], experiment: str, *,
                     batch: Any = None, candidate_filter: Any = None,
                     top_k: int | None | dict[str, int | None] = None,
                     method_options: dict[str, dict[str, Any]] | None = None,
                     labels: dict[str, str] | None = None,
                     registry: MethodRegistry | None = None) -> list[Row]:
    """Method rows (per-unit times, per-stage memory included) for each method at the layout
    ``slimpack.compare.best_parallel`` (the suite's one configuration search) picks.

    A method entry may be ``"planner:variant"``; ``candidate_filter(entry, candidate)``
    narrows its layouts (e.g. vpp == 1 for plain 1F1B) and ``labels`` renames entries in the
    rows. A method that cannot be planned gets a row with ``error`` set, never silence.
    ``registry`` holds the methods (None: the suite's).
    """
    from slimpack.compare import best_parallel, extend_search, paper_recipe_costs, searched_record
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.planning.winners import try_winner_layouts
    from slimpack.records import MethodRecord
    from slimpack.specs import hardware_preset, model_preset

    model, hardware = model_preset(point["model"]), hardware_preset(point["hardware"])
    cost = default_cost_model(model, hardware)
    registry = method_registry(registry)
    recipe = paper_recipe_costs(methods, model, hardware, registry)  # e.g. FlexSP under ZeRO-3
    caps = (harness_caps(methods, registry) if top_k is None else top_k if isinstance(top_k, dict)
            else dict.fromkeys(methods, top_k))
    batch = batch if batch is not None else draw_batch(point, experiment)
    options = with_harness_options(methods, method_options)

    def keep_of(entry: str):
        return None if candidate_filter is None else (
            lambda c, entry=entry: candidate_filter(entry, c))

    def search(entry: str):
        return best_parallel(entry.split(":")[0], batch, model, hardware, point["num_gpus"],
                             recipe.get(entry, cost), context=point["context"],
                             top_k=caps[entry], candidate_filter=keep_of(entry),
                             registry=registry, **options.get(entry, {}))

    def extend(entry: str, found, layouts):
        return extend_search(found, entry.split(":")[0], layouts, batch, model, hardware,
                             point["num_gpus"], recipe.get(entry, cost),
                             context=point["context"], candidate_filter=keep_of(entry),
                             registry=registry, **options.get(entry, {}))

    answers, errors = {}, {}
    for entry in methods:
        try:
            answers[entry] = search(entry)
        except (ValueError, RuntimeError) as exc:
            answers[entry], errors[entry] = None, f"{type(exc).__name__}: {exc}"
    # A capped search that lost to another method is also tried on the winner's layout.
    answers = try_winner_layouts(answers, extend)
    records = []
    for entry in methods:
        label = (labels or {}).get(entry, entry)
        found, entry_cost = answers[entry], recipe.get(entry, cost)
        if found is None:
            records.append(MethodRecord(method=label, step=None, parallel=None,
                                        error=errors[entry]))
            continue
        records.append(dataclasses.replace(searched_record(entry, found, entry_cost),
                                           method=label))
    return method_rows(records)
