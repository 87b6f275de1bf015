"""``slimpack simulate``: time a plan, or a uniform synthetic workload, with the simulator.

    slimpack simulate PLAN.json [--model M] [--hardware H] [--json] [--trace FILE] [--gantt PNG]
    slimpack simulate --uniform --schedule slimpipe --pp 16 --vpp 5 --slices 16 \\
        --microbatches 16 --json

The uniform mode prices every unit the same (UniformCostModel, free communication), so its
bubble fraction must equal the closed forms of docs/cost-model.md; it prints them side by side.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from slimpack.cli.types import positive_int, preset_help
from slimpack.specs import ParallelSpec

UNIFORM_SCHEDULES = ("gpipe", "1f1b", "interleaved", "slimpipe")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate one training step of a plan (or a uniform workload)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", nargs="?", help="plan JSON written by a planner")
    p.add_argument("--model", help=preset_help("model") + " (default: the plan's model)")
    p.add_argument("--hardware", default="h100-80g",
                   help=preset_help("hardware") + " (default h100-80g)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart")
    p.add_argument("--no-overlap-dp-sync", action="store_true",
                   help="start gradient synchronisation only after the last backward")
    u = p.add_argument_group("uniform synthetic workload")
    u.add_argument("--uniform", action="store_true",
                   help="simulate m sequences of n equal slices with uniform unit costs")
    u.add_argument("--schedule", choices=UNIFORM_SCHEDULES, default="1f1b",
                   help="pipeline schedule (default 1f1b)")
    u.add_argument("--pp", type=positive_int, default=4, help="pipeline ranks, >= 1")
    u.add_argument("--vpp", type=positive_int, default=1, help="model chunks per rank, >= 1")
    u.add_argument("--slices", type=positive_int, default=1, help="slices per sequence, >= 1")
    u.add_argument("--microbatches", type=positive_int, default=8, help="sequences, >= 1")
    p.set_defaults(handler=run)


def closed_form_bubble(schedule: str, *, pp: int, vpp: int, slices: int,
                       microbatches: int) -> float:
    """(p-1)/(v*n*m + p-1): 1F1B and GPipe (v = n = 1), interleaved (n = 1), SlimPipe."""
    return (pp - 1) / (vpp * slices * microbatches + pp - 1)


def run(args: argparse.Namespace) -> int:
    from slimpack.jsonio import atomic_write_text, check_output_path, strict_json
    from slimpack.specs import hardware_preset, model_preset

    for flag, path in (("--trace", args.trace), ("--gantt", args.gantt)):
        if path:
            check_output_path(flag, path)  # before the simulation, not after it
    hardware = hardware_preset(args.hardware)
    extra: dict[str, Any] = {}
    if args.uniform:
        if args.plan:
            raise ValueError("give either PLAN.json or --uniform, not both")
        plan, model, cost = _uniform(args, hardware)
        if args.schedule == "interleaved" and args.microbatches < args.pp:
            # Measured: pp 4, vpp 2, m 3 simulates 0.400 against a formula of 0.333; the
            # formula assumes every rank's warm-up is filled, which needs m >= pp.
            extra["closed_form_bubble_fraction"] = None
            extra["closed_form_note"] = (f"no closed form: interleaved needs --microbatches >= "
                                         f"--pp ({args.microbatches} < {args.pp})")
        else:
            extra["closed_form_bubble_fraction"] = closed_form_bubble(
                args.schedule, pp=args.pp, vpp=args.vpp, slices=args.slices,
                microbatches=args.microbatches)
    else:
        if not args.plan:
            raise ValueError("give a plan JSON file, or --uniform for a synthetic workload")
        from slimpack.cost.kernel_model import default_cost_model
        from slimpack.plan import Plan
        from slimpack.specs.training import TrainingSpec

        plan = Plan.load(args.plan)
        name = args.model or plan.model
        if not name:
            raise ValueError(f"plan {args.plan} names no model; pass --model")
        model = model_preset(name)
        _check_plan_model(plan, model, given=args.model)
        # Priced under the ZeRO stage the plan states (the simulator refuses any other).
        cost = None if plan.zero_stage is None else default_cost_model(
            model, hardware, TrainingSpec(zero_stage=plan.zero_stage))
    from slimpack.sim import plot_gantt, simulate, to_chrome_trace

    want_ops = bool(args.trace or args.gantt)
    result = simulate(plan, model=model, hardware=hardware, cost=cost, trace=want_ops,
                      overlap_dp_sync=not args.no_overlap_dp_sync)
    if args.trace:
        atomic_write_text(args.trace, json.dumps(to_chrome_trace(result)))
    if args.gantt:
        _atomic_gantt(result, args.gantt, plot_gantt)
    summary = _summary(result.record) | extra
    if args.json:
        print(strict_json(summary, indent=1))
    else:
        for key in ("method", "model", "step_time_s", "ideal_step_time_s", "step_over_ideal",
                    "bubble_fraction", "mfu", "tokens_per_s", "imbalance_degree",
                    "peak_memory_gib", "oom", *extra):
            print(f"{key:28s} {summary[key]}")
    return 0


def _check_plan_model(plan, model, *, given: str | None) -> None:
    """Refuse a plan made for another model, or whose degrees cannot shard this one: the
    simulator would otherwise time a step that cannot exist (tp 8 on a 4-head model)."""
    if given and plan.model and plan.model not in (given, model.name):
        raise ValueError(f"--model {given!r} does not match the plan's model {plan.model!r}; "
                         "simulate a plan with the model it was made for (omit --model)")
    where = f"the plan's layout ({plan.parallel.describe()})"
    try:
        plan.parallel.validate_for_model(model)
        for group in plan.groups():
            where = f"group {group.group_id} (tp={group.tp} pp={group.pp} vpp={group.vpp})"
            ParallelSpec(tp=group.tp, cp=group.cp, pp=group.pp, vpp=group.vpp,
                         pipeline_split="even" if group.virtual_stage_layers is None
                         else plan.parallel.pipeline_split).validate_for_model(model)
    except ValueError as exc:
        raise ValueError(f"{where} cannot run {model.name}: {exc}") from None


def _atomic_gantt(result, path: str, plot_gantt) -> None:
    """Draw into a temp file with the same suffix (matplotlib picks the format from it) in
    the same directory, then replace: a failed draw leaves neither a half PNG nor a temp."""
    import contextlib
    import os
    import tempfile
    from pathlib import Path

    out = Path(path)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=out.suffix or ".png")
    os.close(fd)
    try:
        plot_gantt(result, tmp)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _summary(record) -> dict[str, Any]:
    out = asdict(record)
    out.pop("ops")
    out["step_over_ideal"] = record.step_over_ideal
    out["peak_memory_gib"] = record.peak_memory_gib
    return out


def _uniform(args: argparse.Namespace, hardware):
    from slimpack.sim import UniformCostModel, uniform_plan
    from slimpack.specs import ModelSpec, model_preset

    if args.schedule == "1f1b" and args.vpp > 1:
        raise ValueError("--schedule 1f1b needs --vpp 1; use --schedule interleaved")
    stages = args.pp * args.vpp
    if args.model:
        model = model_preset(args.model)
        if model.num_layers % stages:
            raise ValueError(f"--pp * --vpp = {stages} must divide {model.name}'s "
                             f"{model.num_layers} layers")
    else:
        # One layer per virtual stage: only the unit count matters to uniform costs.
        model = ModelSpec(name=f"uniform-{stages}l", num_layers=stages, hidden=64,
                          ffn_hidden=128, num_heads=4, num_kv_heads=4, vocab_size=128)
    plan = uniform_plan(schedule=args.schedule, pp=args.pp, vpp=args.vpp, slices=args.slices,
                        microbatches=args.microbatches, model=model.name)
    # A whole sequence takes 1 ms forward and 2 ms backward on one stage, however cut.
    layers_per_stage = model.num_layers / args.pp
    per_layer = 1e-3 / (layers_per_stage * args.slices)
    cost = UniformCostModel(model=model, hardware=hardware, forward_s=per_layer,
                            backward_s=2 * per_layer)
    return plan, model, cost
