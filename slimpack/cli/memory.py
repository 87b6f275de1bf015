"""``slimpack memory``: peak memory of one pipeline rank from the analytic memory model."""

from __future__ import annotations

import argparse

from slimpack.cli.types import positive_int, preset_help
from slimpack.cost.memory import GIB, SCHEDULE_KINDS, estimate_memory
from slimpack.jsonio import strict_json
from slimpack.specs import ParallelSpec, hardware_preset, model_preset


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "memory",
        help="peak memory per pipeline rank for one sequence length and schedule",
        description=(
            "Estimate peak memory of a pipeline rank (rank 0 by default, the worst for "
            "activations) for micro-batches of one --seq-len-token sequence, using the "
            "SlimPipe artifact's activation formula a = 12h + 4*kv_dim + 6*ffn bytes per "
            "token per layer."
        ),
    )
    p.add_argument("--model", required=True, help=preset_help("model"))
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    p.add_argument("--cp", type=positive_int, default=1, help="context-parallel degree")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel degree")
    p.add_argument("--vpp", type=positive_int, default=1, help="virtual stages per pipeline rank")
    p.add_argument("--dp", type=positive_int, default=1, help="shards the distributed optimizer")
    p.add_argument("--slices", type=positive_int, default=1,
                   help="slices per sequence (slimpipe only)")
    p.add_argument("--schedule", choices=SCHEDULE_KINDS, default="1f1b",
                   help="pipeline schedule (default 1f1b)")
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                   help="activation recomputation (default none)")
    p.add_argument("--rank", type=int, default=0, help="pipeline rank to report")
    p.add_argument("--hardware", default=None,
                   help=preset_help("hardware") + "; adds a fits/OOM verdict")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # The estimate ignores these for other schedules; refusing beats printing "slices=4"
    # next to numbers computed for one slice.
    if args.slices != 1 and args.schedule != "slimpipe":
        raise ValueError(f"--slices {args.slices} applies only to --schedule slimpipe (got "
                         f"--schedule {args.schedule}); drop --slices or use slimpipe")
    if args.vpp != 1 and args.schedule == "1f1b":
        raise ValueError(f"--vpp {args.vpp} needs --schedule interleaved or slimpipe; 1f1b runs "
                         "one model chunk per rank")
    model = model_preset(args.model)
    ParallelSpec(tp=args.tp, cp=args.cp, pp=args.pp, dp=args.dp,
                 vpp=args.vpp).validate_for_model(model)
    est = estimate_memory(model, seq_len=args.seq_len, schedule=args.schedule, tp=args.tp,
                          cp=args.cp, pp=args.pp, vpp=args.vpp, slices=args.slices, dp=args.dp,
                          rank=args.rank, recompute=args.recompute)
    out: dict[str, object] = {
        "model": model.name, "schedule": args.schedule, "seq_len": args.seq_len,
        "tp": args.tp, "cp": args.cp, "pp": args.pp, "vpp": args.vpp, "dp": args.dp,
        "slices": args.slices, "rank": args.rank, "recompute": args.recompute,
        **{k: round(v, 6) for k, v in est.as_gib().items()},
        "inflight_units": est.inflight_units,
        "unit_gib": round(est.unit_bytes / GIB, 6),
    }
    if args.hardware:
        hw = hardware_preset(args.hardware)
        out["hardware"] = hw.name
        out["usable_gib"] = round(hw.usable_memory_bytes / GIB, 3)
        out["fits"] = est.peak_bytes <= hw.usable_memory_bytes
    if args.json:
        print(strict_json(out))
        return 0
    print(f"{model.name}, {args.schedule}, seq {args.seq_len:,} tokens, tp={args.tp} "
          f"cp={args.cp} pp={args.pp} vpp={args.vpp} slices={args.slices}, rank {args.rank}")
    rows = [
        ("activations", out["activation_gib"], f"{est.inflight_units} units in flight"),
        ("  of which KV cache", out["kv_cache_gib"], "K,V of in-flight slices"),
        ("KV-gradient buffers", out["kv_grad_gib"], "dK/dV of later slices"),
        ("model states", out["model_state_gib"], "bf16 params, fp32 grads, sharded Adam"),
        ("logits", out["logits_gib"], "fp32"),
        ("peak", out["peak_gib"], ""),
    ]
    for name, gib, note in rows:
        print(f"  {name:<22}{gib:>10.2f} GiB  {note}")
    if args.hardware:
        verdict = "fits" if out["fits"] else "OUT OF MEMORY"
        print(f"  {out['hardware']}: {out['usable_gib']} GiB usable -> {verdict}")
    return 0
