"""``slimpack plan`` and ``slimpack compare``: run planners on one sampled global batch.

    slimpack plan --method wlb-llm --model llama-7b --hardware h100 --gpus 64 \\
        --tp 8 --cp 2 --pp 4 --dataset wlb-llm --context 131072 --global-batch 256 -o plan.json
    slimpack compare --methods megatron,wlb-llm,flexsp,slimpipe --model llama-13b \\
        --hardware h100 --gpus 64 --auto-parallel --dataset wikipedia --context 131072 \\
        --global-batch 512 --json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from slimpack.batch import Batch
from slimpack.cli.types import (
    MAX_GLOBAL_BATCH,
    MAX_TOKEN_BUDGET,
    int_range,
    positive_float,
    positive_int,
    preset_help,
    usable_cpus,
)
from slimpack.cost.kernel_model import default_cost_model
from slimpack.jsonio import check_output_path, strict_json
from slimpack.methods import DEFAULT_METHODS, MethodRegistry
from slimpack.planning.options import parse_options
from slimpack.planning.packing import sample_pieces
from slimpack.specs import ParallelSpec, hardware_preset, model_preset
from slimpack.specs.parallel import PIPELINE_SPLITS
from slimpack.specs.training import ZERO_STAGES, TrainingSpec

DOCUMENTS, SAMPLE_PIECES = "documents", "sample-pieces"
WORKLOADS = (DOCUMENTS, SAMPLE_PIECES)
"""``--workload``: what every method is given (the flag's help)."""


def _add_workload_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help=preset_help("model"))
    p.add_argument("--hardware", default="h100", help=preset_help("hardware") + " (default h100)")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    for name in ("tp", "cp", "pp", "vpp", "dp"):
        p.add_argument(f"--{name}", type=int, default=None, help=f"{name} degree")
    p.add_argument("--ep", type=int, default=None,
                   help="expert-parallel degree (MoE models; divides dp*cp and the experts; "
                        "simulated at tp 1 only)")
    p.add_argument("--pipeline-split", choices=PIPELINE_SPLITS, default="even",
                   help="decoder layers over the pp*vpp virtual stages: even (default), or "
                        "embedding-and-loss (each counted as a layer, as Megatron-Core's "
                        "account_for_*_in_pipeline_split; megatron methods only)")
    p.add_argument("--auto-parallel", action="store_true",
                   help="search each method's best tp/cp/pp/vpp/dp/recompute with the memory "
                        "model (needs the simulator)")
    p.add_argument("--dataset", required=True,
                   help="length profile name (wikipedia, wlb-llm, ...) or a length file path")
    p.add_argument("--context", type=int, required=True, help="context length in tokens")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--global-batch", type=int_range(1, MAX_GLOBAL_BATCH),
                      help="documents in the global batch (documents longer than the context "
                           f"are split); 1 to {MAX_GLOBAL_BATCH:,}")
    size.add_argument("--token-budget", type=int_range(1, MAX_TOKEN_BUDGET),
                      help="tokens in the global batch instead (e.g. 512 x context for "
                           "Megatron's 'global batch 512' of context-length samples); 1 to "
                           f"{MAX_TOKEN_BUDGET:,}")
    p.add_argument("--seed", type=int, default=0, help="sampler seed for the batch (default 0)")
    p.add_argument("--workload", choices=WORKLOADS, default=DOCUMENTS,
                   help="documents (default): the batch's documents, each method cutting or "
                        "keeping them its own way (Megatron-LM, naive packing and SlimPipe cut "
                        "a document at each context-length sample boundary, so they compute "
                        "less attention); sample-pieces: the documents cut every --context "
                        "tokens as Megatron-LM's GPTDataset cuts them, given to every method, "
                        "so all compute the same attention")
    p.add_argument("--time-limit", type=positive_float, default=None,
                   help="planner time limit in seconds, a finite number > 0 (default: each "
                        "planner's own)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--option", action="append", default=[], metavar="[METHOD:]KEY=VALUE",
                   help="a planner option, checked against the method's options dataclass "
                        "(repeatable; `slimpack methods NAME` lists them). In compare, prefix "
                        "the method: --option slimpack:search=false")


def register(subparsers: argparse._SubParsersAction,
             registry: MethodRegistry = DEFAULT_METHODS) -> None:
    """Add plan, compare and methods; their handlers read ``registry`` (``args.registry``)."""
    plan_p = subparsers.add_parser("plan", help="plan one global batch with one method")
    plan_p.add_argument("--method", required=True, choices=registry.names(),
                        help="the method to plan with")
    _add_workload_flags(plan_p)
    plan_p.add_argument("-o", "--output", default=None, help="write the plan JSON here")
    plan_p.add_argument("--strict", action="store_true",
                        help="exit 1 (and write no plan) when the plan does not fit device "
                             "memory; without it a warning is printed and the plan written")
    plan_p.set_defaults(handler=run_plan, registry=registry)

    cmp_p = subparsers.add_parser("compare", help="plan and simulate several methods on the "
                                                  "same batch and print one table")
    cmp_p.add_argument("--methods", required=True,
                       help="comma-separated method names: " + ", ".join(registry.names()))
    _add_workload_flags(cmp_p)
    cmp_p.add_argument("--zero-stage", action="append", default=[], metavar="[METHOD=]STAGE",
                       help="ZeRO stage (0, 1 or 3) the memory and step are priced under, for "
                            "every method or for one (repeatable). Default: each method as its "
                            "paper ran it (FlexSP and its Ulysses baselines 3), the others 1 "
                            "(Megatron-LM's distributed optimizer)")
    cmp_p.add_argument("--jobs", type=positive_int, default=None,
                       help="methods run at once, each in its own process (default: the CPUs "
                            "this process may use; the table is the same for any count)")
    cmp_p.add_argument("--search-layouts", type=positive_int, default=None, metavar="N",
                       help="with --auto-parallel: simulate at most N layouts per method, the "
                            "same cap for every method (default: every memory-feasible layout "
                            "not pruned by the step lower bound). A count, never wall time: "
                            "the table is the same on every machine")
    cmp_p.set_defaults(handler=run_compare, registry=registry)

    list_p = subparsers.add_parser("methods", help="list the methods, or one method's options")
    list_p.add_argument("name", nargs="?", choices=registry.names(),
                        help="a method to describe")
    list_p.set_defaults(handler=run_methods, registry=registry)


def method_options(methods: list[str], pairs: list[str], *, prefixed: bool,
                   registry: MethodRegistry = DEFAULT_METHODS) -> dict[str, dict[str, Any]]:
    """``--option`` values typed per method. With ``prefixed``, each pair names its method
    (``slimpack:search=false``); otherwise every pair belongs to ``methods[0]``."""
    raw: dict[str, list[str]] = {m: [] for m in methods}
    for pair in pairs:
        method, text = (methods[0], pair)
        if prefixed:
            method, sep, text = pair.partition(":")
            if not sep or "=" in method:
                raise ValueError(f"--option {pair!r}: in compare, name the method: "
                                 "METHOD:KEY=VALUE")
            if method not in raw:
                raise ValueError(f"--option {pair!r}: method {method!r} is not in --methods "
                                 f"({', '.join(methods)})")
        raw[method].append(text)
    out = {}
    for method, texts in raw.items():
        spec = registry.get(method)
        out[method] = parse_options(spec.options, method, texts)
        shared = sorted({"context", "time_limit_s"} & set(out[method]))
        if shared:
            raise ValueError(f"--option {method}:{shared[0]}: use --context / --time-limit")
    return out


DEFAULT_ZERO_STAGE = TrainingSpec().zero_stage


def zero_stages(methods: list[str], values: list[str],
                registry: MethodRegistry = DEFAULT_METHODS) -> dict[str, int]:
    """Each method's ZeRO stage: its paper's (``MethodSpec.paper_zero_stage``) or the suite's
    default, then ``--zero-stage`` values in order (``STAGE`` for all, ``METHOD=STAGE``)."""
    stages = {m: registry.get(m).paper_zero_stage for m in methods}
    stages = {m: DEFAULT_ZERO_STAGE if z is None else z for m, z in stages.items()}
    for value in values:
        method, sep, text = value.rpartition("=")
        if sep and method not in stages:
            raise ValueError(f"--zero-stage {value!r}: method {method!r} is not in --methods "
                             f"({', '.join(methods)})")
        try:
            stage = int(text)
        except ValueError:
            stage = -1
        if stage not in ZERO_STAGES:
            raise ValueError(f"--zero-stage {value!r}: the stage must be one of "
                             f"{', '.join(map(str, ZERO_STAGES))}")
        for m in ([method] if sep else methods):
            stages[m] = stage
    return stages


def run_methods(args: argparse.Namespace) -> int:
    registry: MethodRegistry = args.registry
    if args.name is None:
        for name in registry.names():
            spec = registry.get(name)
            print(f"{name:<13} {spec.summary}\n{'':<13} ({spec.source})")
        return 0
    spec = registry.get(args.name)
    print(f"{spec.name}: {spec.summary}\nsource: {spec.source}\noptions (--option KEY=VALUE):")
    for name, type_name, default in spec.describe_options():
        print(f"  {name:<26} {type_name:<28} default {default}")
    return 0


def load_batch(dataset: str, *, context: int, global_batch: int | None, seed: int,
               token_budget: int | None = None, workload: str = DOCUMENTS) -> Batch:
    """Sample the global batch by document count or token budget (documents longer than
    ``context`` are split); for the ``sample-pieces`` workload, cut into Megatron-LM's
    sample pieces (:func:`slimpack.planning.packing.sample_pieces`)."""
    if workload not in WORKLOADS:
        raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    if global_batch is not None and global_batch < 1:
        raise ValueError(f"--global-batch must be >= 1, got {global_batch}")
    if token_budget is not None and token_budget < 1:
        raise ValueError(f"--token-budget must be >= 1, got {token_budget}")
    if context < 1:
        raise ValueError(f"--context must be >= 1, got {context}")
    from slimpack.data import sample_batch

    batch = sample_batch(dataset, num_sequences=global_batch, token_budget=token_budget,
                         context=context, seed=seed, truncation="split")
    return sample_pieces(batch, context) if workload == SAMPLE_PIECES else batch


def parallel_from_args(args: argparse.Namespace) -> ParallelSpec | None:
    degrees = {k: getattr(args, k) for k in ("tp", "cp", "pp", "vpp", "dp", "ep")}
    given = {k: v for k, v in degrees.items() if v is not None}
    if args.auto_parallel:
        if given or args.pipeline_split != "even":
            raise ValueError("give either --auto-parallel or explicit degrees (and "
                             "--pipeline-split), not both")
        return None
    if args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    tp, cp, pp, vpp, ep = (given.get(k, 1) for k in ("tp", "cp", "pp", "vpp", "ep"))
    par = ParallelSpec.for_world(args.gpus, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep,
                                 pipeline_split=args.pipeline_split)
    if "dp" in given and given["dp"] != par.dp:
        raise ValueError(f"--dp {given['dp']} disagrees with --gpus {args.gpus} / "
                         f"(tp*cp*pp = {tp * cp * pp}) = {par.dp}")
    return par


def _specs(args: argparse.Namespace):
    model, hardware = model_preset(args.model), hardware_preset(args.hardware)
    return model, hardware, default_cost_model(model, hardware)


def run_plan(args: argparse.Namespace) -> int:
    from slimpack.compare import best_parallel, plan_method

    if args.output:
        check_output_path("-o/--output", args.output)  # before minutes of planning
    model, hardware, cost = _specs(args)
    parallel = parallel_from_args(args)
    batch = load_batch(args.dataset, context=args.context, global_batch=args.global_batch,
                       token_budget=args.token_budget, seed=args.seed,
                       workload=args.workload)
    registry: MethodRegistry = args.registry
    options = method_options([args.method], args.option, prefixed=False,
                             registry=registry)[args.method]
    if args.time_limit is not None:
        options["time_limit_s"] = args.time_limit
    if parallel is None:
        found = best_parallel(args.method, batch, model, hardware, args.gpus, cost,
                              context=args.context, registry=registry, **options)
        plan, parallel = found.plan, found.parallel
    else:
        parallel.validate_for_model(model)
        plan = plan_method(args.method, batch, model, hardware, parallel, cost,
                           context=args.context, registry=registry, **options)
    fits = plan.memory_fits
    if fits is False:
        print(f"slimpack plan: warning: the {args.method} plan does not fit in "
              f"{hardware.name} memory ({_peak_note(plan, model, hardware, cost)}); try more "
              "pp/tp/cp, recompute, or --auto-parallel",
              file=sys.stderr)
        if args.strict:
            print("slimpack plan: --strict: not writing a plan that does not fit",
                  file=sys.stderr)
            return 1
    if args.output:
        plan.save(args.output)
    summary = {
        "method": args.method, "model": model.name, "hardware": hardware.name,
        "workload": args.workload,
        "parallel": parallel.to_dict(), "num_sequences": len(batch),
        "num_tokens": plan.num_tokens, "num_phases": len(plan.phases),
        "num_groups": sum(1 for _ in plan.groups()),
        "num_units": sum(len(g.forward_units) for g in plan.groups()),
        "plan_seconds": plan.metadata.get("plan_seconds"), "output": args.output,
        "metadata": {k: v for k, v in plan.metadata.items()
                     if isinstance(v, (int, float, str, bool))},
    }
    if args.json:
        print(strict_json(summary, indent=1))
    else:
        for key, value in summary.items():
            print(f"{key:>14}: {value}")
    return 0


def _peak_note(plan, model, hardware, cost) -> str:
    from slimpack.cost.model import training_of
    from slimpack.sim.memory import plan_peak_bytes

    peak = plan_peak_bytes(plan, model, training_of(cost))  # the recipe it was planned under
    return (f"peak {peak / 2**30:.1f} GiB per device, usable "
            f"{hardware.usable_memory_bytes / 2**30:.1f} GiB")


def cut_documents_note(methods: list[str], workload: str, context: int,
                       registry: MethodRegistry) -> str:
    """A line under the table where, on the documents, some methods cut documents at sample
    boundaries (``MethodSpec.cuts_at_sample_boundaries``) and others keep them whole: their
    steps then price different attention, which a reader of the table must know."""
    if workload != DOCUMENTS:
        return ""
    cutting = [m for m in methods if registry.get(m).cuts_at_sample_boundaries]
    if not cutting or len(cutting) == len(methods):
        return ""
    return (f"Documents: {', '.join(cutting)} cut documents at the {context}-token sample "
            "boundaries (a cut tail no longer attends to its head), the others keep each "
            "document whole; --workload sample-pieces gives every method the same pieces.")


def run_compare(args: argparse.Namespace) -> int:
    from slimpack.compare import compare, format_table

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise ValueError("--methods must name at least one planner")
    registry: MethodRegistry = args.registry
    unknown = [m for m in methods if m not in registry.names()]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; allowed: {', '.join(registry.names())}")
    options = method_options(methods, args.option, prefixed=True, registry=registry)
    if args.search_layouts is not None and not args.auto_parallel:
        raise ValueError("--search-layouts caps the --auto-parallel search; give --auto-parallel "
                         "or drop it")
    model, hardware, cost = _specs(args)
    parallel = parallel_from_args(args)
    if parallel is not None:
        parallel.validate_for_model(model)
    batch = load_batch(args.dataset, context=args.context, global_batch=args.global_batch,
                       token_budget=args.token_budget, seed=args.seed,
                       workload=args.workload)
    stages = zero_stages(methods, args.zero_stage, registry)
    method_costs = {m: default_cost_model(model, hardware, TrainingSpec(zero_stage=z))
                    for m, z in stages.items() if z != DEFAULT_ZERO_STAGE}
    records = compare(methods, batch, model, hardware, args.gpus, parallel=parallel,
                   auto_parallel=args.auto_parallel, cost=cost, context=args.context,
                   time_limit_s=args.time_limit, method_options=options, progress=True,
                   auto_parallel_top_k=args.search_layouts,
                   method_costs=method_costs, jobs=args.jobs or usable_cpus(),
                   registry=registry)
    if args.json:
        print(strict_json({"workload": args.workload,
                           "records": [r.to_dict() for r in records]}, indent=1))
    else:
        pieces = " (sample pieces)" if args.workload == SAMPLE_PIECES else ""
        print(f"{model.name} on {args.gpus} x {hardware.name}, {args.dataset}, context "
              f"{args.context}, {len(batch)} sequences{pieces} ({batch.num_tokens:,} tokens), "
              f"seed {args.seed}")
        print(format_table(records))
        print("ZeRO stage: " + ", ".join(f"{m} {z}" for m, z in stages.items()))
        note = cut_documents_note(methods, args.workload, args.context, registry)
        if note:
            print(note)
    for r in records:
        if r.fallback:
            print(f"slimpack compare: {r.method} fell back: {r.fallback}", file=sys.stderr)
    failed = [r for r in records if r.error]
    for r in failed:
        print(f"slimpack compare: {r.method} failed: {r.error}", file=sys.stderr)
    if failed:
        # A comparison with a missing column is not a result: scripts must be able to tell.
        print(f"slimpack compare: {len(failed)} of {len(records)} methods failed",
              file=sys.stderr)
        return 1
    return 0
