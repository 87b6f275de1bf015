"""``slimpack run`` executes a plan with the PyTorch runtime; ``slimpack profile`` measures the
per-layer calibration table the calibrated cost model reads.

    slimpack run PLAN.json [--model M] [--backend gloo|nccl] [--dtype fp32|bf16] [--nproc N]
                           [--out run.json|runs.csv] [--calibration calib.csv]
    slimpack run --example slimpipe|slimpack|packed --model tiny --pp 2 --dp 2 [--tp 2]
    torchrun --nproc-per-node 8 -m slimpack.cli.main run PLAN.json --backend nccl --dtype bf16
    slimpack profile --model small --out calib.csv [--device cpu] [--threads 1]

``run`` checks the plan (IR rules, world size, schedule, and every field the runtime does not
execute, e.g. attention_redistribution at pp > 1 with Ulysses cp > 1: see
docs/architecture.md, runtime) before any process starts. SlimPipe's attention
redistribution executes the moves the plan carries (``Group.attention_moves``, chosen at
plan time; a plan older than format 4 is refused).
Without torchrun it spawns ``--nproc`` (default: the plan's world size) local processes
itself. With ``--calibration`` it also simulates the plan with the calibrated cost
model and prints simulated against measured step time and peak memory.
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path
from typing import Any

from slimpack.cli.types import int_range, positive_float, positive_int, preset_help
from slimpack.jsonio import atomic_write_text, check_output_path, strict_json
from slimpack.records import StepRecord


def register(subparsers: argparse._SubParsersAction) -> None:
    r = subparsers.add_parser("run", help="execute a plan with the PyTorch runtime",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("plan", nargs="?", help="plan JSON (or use --example)")
    r.add_argument("--example", choices=("slimpipe", "slimpack", "packed"),
                   help="run a built-in hand-made plan instead of a file")
    r.add_argument("--pp", type=int, default=2, help="--example only (default 2)")
    r.add_argument("--dp", type=int, default=1, help="--example only (default 1)")
    r.add_argument("--vpp", type=int, default=1, help="--example only (default 1)")
    r.add_argument("--tp", type=int, default=1,
                   help="--example only: tensor-parallel degree (default 1)")
    r.add_argument("--scale", type=int, default=1, help="--example token multiplier")
    r.add_argument("--model", help=preset_help("model") + " (default: the plan's model)")
    r.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="torch.distributed backend (default: nccl with CUDA, else gloo)")
    r.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="parameter and activation dtype (default fp32)")
    r.add_argument("--attention", default="auto", help="attention kernel (default auto)",
                   choices=("auto", "flash", "torch-varlen", "sdpa", "dense"))
    r.add_argument("--seed", type=int, default=0, help="weight and data seed (default 0)")
    r.add_argument("--nproc", type=positive_int,
                   help="processes to spawn, >= 1 (default: plan world size)")
    r.add_argument("--warmup", type=int_range(0), default=1,
                   help="untimed steps before the measured one (default 1)")
    r.add_argument("--steps", type=positive_int, default=1,
                   help="measured steps; the record keeps the median (default 1)")
    r.add_argument("--out", help="write the record: .csv appends a row, else JSON with ops")
    r.add_argument("--calibration", metavar="CSV",
                   help="also simulate with the calibrated cost model from this profile")
    r.add_argument("--timeout", type=positive_float, default=600.0,
                   help="collective timeout in seconds, a finite number > 0 (default 600)")
    r.set_defaults(handler=_run)

    p = subparsers.add_parser("profile", help="measure per-layer times for the cost model",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help=preset_help("model"))
    p.add_argument("--out", required=True, help="CSV to write (e.g. calib.csv)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to time the layers (default cpu)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="dtype to time (default fp32)")
    p.add_argument("--attention", default="auto", choices=("auto", "flash", "torch-varlen", "sdpa"),
                   help="attention kernel (default auto)")
    p.add_argument("--tokens", default="64,128,256,512,1024,2048",
                   help="comma-separated query token counts")
    p.add_argument("--prefixes", default="0,512,2048", help="comma-separated KV prefixes (with 0)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed repetitions per grid point (default 5)")
    p.add_argument("--threads", type=int, help="torch CPU threads (match the run's per-rank share)")
    p.add_argument("--concurrent", type=positive_int, default=1,
                   help="profile in N processes at once (CPU: the run's ranks per machine, "
                        "which share memory bandwidth); keeps the first one's numbers")
    p.add_argument("--quiet", action="store_true", help="no per-point progress lines")
    p.set_defaults(handler=_profile)


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None


def _load(args: argparse.Namespace):
    from slimpack.plan import Plan
    from slimpack.runtime.examples import EXAMPLES
    from slimpack.specs import model_preset

    if (args.plan is None) == (args.example is None):
        raise ValueError("give a plan file or --example NAME (exactly one)")
    if args.example:
        plan = EXAMPLES[args.example](pp=args.pp, dp=args.dp, vpp=args.vpp, scale=args.scale,
                                      tp=args.tp)
    else:
        plan = Plan.load(args.plan)
    name = args.model or plan.model
    if not name:
        raise ValueError("the plan names no model; pass --model")
    return plan, model_preset(name)


def _run(args: argparse.Namespace) -> int:
    import torch

    from slimpack.runtime.config import RuntimeConfig
    from slimpack.runtime.launch import run_plan, under_torchrun
    from slimpack.runtime.validate import check_runtime_plan
    from slimpack.validation.simulated_vs_measured import compare_with_simulator

    if args.out:
        check_output_path("--out", args.out, create_parent=True)  # before spawning anything
    plan, spec = _load(args)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = "cuda" if backend == "nccl" else "cpu"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("--backend nccl needs CUDA; use --backend gloo on this machine")
    config = RuntimeConfig(device=device, dtype=args.dtype, dist_backend=backend,
                           attention=args.attention, seed=args.seed, warmup_steps=args.warmup,
                           measured_steps=args.steps)
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
    else:
        world = args.nproc if args.nproc is not None else plan.world_size
    check_runtime_plan(plan, spec, world_size=world)  # fail before starting
    if device == "cpu" and not under_torchrun():
        check_host_memory(plan, spec, dtype=args.dtype)
    cost = None
    if args.calibration:
        from slimpack.cost.calibrated import CalibratedCostModel
        cost = CalibratedCostModel.from_csv(args.calibration, model=spec)
        from slimpack.cost.model import training_of
        from slimpack.sim.memory import check_zero_stage
        check_zero_stage(plan, training_of(cost))  # the comparison would refuse it after the run
    best = run_plan(plan, spec, config, nproc=world, timeout_s=args.timeout)
    if best is None:
        return 0  # non-zero torchrun rank: rank 0 reports
    record = best.record
    print(f"{plan.method}: step {record.step_time_s * 1e3:.1f} ms, loss {best.loss:.6f}, "
          f"peak memory per stage {[round(b / 2**20, 2) for b in record.peak_memory_bytes]} MiB "
          f"({record.extra['memory_source']}), bubble {record.bubble_fraction:.3f}, "
          f"schedule {record.extra['schedule_source']}")
    print(f"  activation peak per rank (tracked, model state excluded) "
          f"{[round(b / 2**20, 2) for b in record.extra['rank_peak_activation_bytes']]} MiB")
    print(f"  {record.tokens_per_s:,.0f} tokens/s; peak memory per rank "
          f"{[round(b / 2**20, 2) for b in record.extra['rank_peak_memory_bytes']]} MiB")
    comparison = None
    if cost is not None:
        comparison = compare_with_simulator(record, plan, spec, cost)
        print(f"simulated step {comparison['sim_step_s'] * 1e3:.1f} ms vs measured "
              f"{comparison['real_step_s'] * 1e3:.1f} ms: error "
              f"{comparison['step_error'] * 100:+.1f}%; peak memory error "
              f"{comparison['memory_error'] * 100:+.1f}%")
    if args.out:
        write_record(record, args.out, comparison=comparison)
    return 0


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def host_memory_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is no such file)."""
    try:
        for line in open("/proc/meminfo", encoding="ascii"):  # noqa: SIM115 - tiny file
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(plan, spec, *, dtype: str, available: int | None = None) -> None:  # noqa: ANN001
    """Refuse a CPU run whose weights and gradients alone exceed the host's free memory.

    A lower bound (activations come on top), so a refused run would certainly have failed:
    without it, `run --model llama-7b` on CPU spawned its ranks and met the OOM killer
    minutes later. Every data-parallel replica holds the whole model (its stages spread
    over pp ranks), each parameter once as a weight and once as a gradient.
    """
    available = host_memory_available() if available is None else available
    if available is None:
        return
    need = plan.parallel.dp * spec.num_params * DTYPE_BYTES[dtype] * 2
    if need > available:
        raise ValueError(
            f"--model {spec.name} needs at least {need / 2**30:.1f} GiB of host memory on CPU "
            f"(weights + gradients, {dtype}, dp={plan.parallel.dp}) but {available / 2**30:.1f}"
            f" GiB is available; use a smaller model (tiny, small) or --dtype bf16")


def write_record(record: StepRecord, path: str, *, comparison: dict[str, Any] | None = None
                 ) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix != ".csv":
        # JSON keeps nested fields nested (parallel, per-stage lists, extra, ops) and is
        # strict: non-finite floats become null.
        data = record.to_dict(ops=True)
        if comparison:
            data["comparison"] = comparison
        atomic_write_text(out, strict_json(data, indent=1))
        return
    row = record.to_row()
    if comparison:
        row.update({f"cmp_{k}": v for k, v in comparison.items()})
    new = not out.exists()
    with out.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def _profile(args: argparse.Namespace) -> int:
    check_output_path("--out", args.out, create_parent=True)  # before minutes of timing
    import torch

    from slimpack.runtime.profiler import (
        ProfileConfig,
        profile_concurrently,
        profile_model,
        write_profile_csv,
    )
    from slimpack.specs import model_preset

    spec = model_preset(args.model)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA device; profile on cpu here")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    config = ProfileConfig(tokens=_int_list(args.tokens, "--tokens"),
                           prefixes=_int_list(args.prefixes, "--prefixes"),
                           repeats=args.repeats, device=args.device, dtype=args.dtype,
                           attention=args.attention)
    if args.concurrent > 1:
        rows = profile_concurrently(spec, config, processes=args.concurrent,
                                    threads=torch.get_num_threads())
    else:
        rows = profile_model(spec, config, progress=None if args.quiet else print)
    write_profile_csv(rows, args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0
