"""``make gpu-check``: the runtime's one-shot check on a CUDA machine (target < 10 min).

    python -m slimpack.cli.gpu_check [--out results/gpu] [--skip-profile]

1. parity on CUDA, fp32 and bf16: the three example plans (SlimPipe-, SlimPack- and
   packed-style; one with virtual stages) against the unsliced fp32 reference, plus the
   attention backend chosen for bf16 against the dense reference;
2. ``slimpack profile`` of one model (llama-7b layer shapes, 4 layers) in bf16;
3. the example plans scaled up, run and simulated with the calibrated cost model: simulated
   vs measured step time and peak memory. With two or more GPUs the plans also run with pp=2.

Writes parity.csv, calib.csv, sim_vs_real.csv and summary.json under ``--out``. Without CUDA
it prints why and exits with status 2 (nothing was checked).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}
"""Norm-relative gradient error allowed against the fp32 reference: fp32 CUDA kernels sum in
other orders than the reference (TF32 is off); bf16 keeps 8 mantissa bits per activation."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m slimpack.cli.gpu_check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/gpu", help="output folder (default results/gpu)")
    p.add_argument("--scale", type=int, default=128,
                   help="token multiplier of the timed example plans (default 128)")
    p.add_argument("--skip-profile", action="store_true",
                   help="parity only (no profile, no sim-vs-real)")
    args = p.parse_args(argv)
    if args.scale < 1:
        p.error(f"--scale must be >= 1, got {args.scale}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); nothing was "
              "checked. Run it on a GPU machine.", file=sys.stderr)
        return 2
    import torch.distributed as dist

    from slimpack.runtime.launch import free_port

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    started = time.perf_counter()
    summary: dict = {"device": torch.cuda.get_device_name(0),
                     "num_gpus": torch.cuda.device_count(), "torch": torch.__version__}
    try:
        summary["parity"] = _parity(out)
        if not args.skip_profile:
            summary["sim_vs_real"] = _sim_vs_real(out, args.scale)
    finally:
        dist.destroy_process_group()
    summary["wall_s"] = time.perf_counter() - started
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    failed = [r for r in summary["parity"] if not r["ok"]]
    print(f"gpu_check: {len(summary['parity']) - len(failed)}/{len(summary['parity'])} parity "
          f"checks passed in {summary['wall_s']:.0f} s; results in {out}/")
    return 1 if failed else 0


def _parity(out: Path) -> list[dict]:
    import torch

    from slimpack.runtime.attention import (
        VarlenLayout,
        choose_backend,
        dense_reference_attention,
        varlen_causal_attention,
    )
    from slimpack.runtime.config import RuntimeConfig
    from slimpack.runtime.examples import EXAMPLES
    from slimpack.runtime.launch import run_in_process_group
    from slimpack.runtime.reference import reference_step
    from slimpack.specs import model_preset

    spec = model_preset("tiny")
    rows = []
    dev = torch.device("cuda", 0)
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        backend = choose_backend(dev, dtype)
        layout = VarlenLayout(q_lens=(100, 37, 1), k_lens=(300, 37, 64))
        gen = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(sum(layout.q_lens), 8, 64, device=dev, dtype=dtype, generator=gen)
        k = torch.randn(sum(layout.k_lens), 2, 64, device=dev, dtype=dtype, generator=gen)
        v = torch.randn_like(k)
        got = varlen_causal_attention(q, k, v, layout, backend=backend).float()
        want = dense_reference_attention(q.float(), k.float(), v.float(), layout)
        err = float((got - want).norm() / want.norm())
        rows.append({"check": f"attention-{backend}", "dtype": dtype_name, "loss_error": 0.0,
                     "max_grad_error": err, "ok": err < TOLERANCE[dtype_name]})
        for name, make in EXAMPLES.items():
            plan = make(pp=1, dp=1, vpp=2 if name == "slimpack" else 1)
            config = RuntimeConfig(device="cuda", dtype=dtype_name, dist_backend="nccl")
            res = run_in_process_group(plan, spec, config, rank=0, local_rank=0,
                                       return_grads=True)
            ref = reference_step(spec, plan.sequence_lengths, device="cuda")
            grads = res.grads()
            worst = max(float((grads[n] - g).norm() / g.norm()) for n, g in ref.grads.items())
            loss_err = abs(res.loss - ref.loss) / abs(ref.loss)
            ok = worst < TOLERANCE[dtype_name] and loss_err < TOLERANCE[dtype_name]
            rows.append({"check": f"{name}-plan", "dtype": dtype_name, "loss_error": loss_err,
                         "max_grad_error": worst, "ok": ok})
            print(f"parity {name:9s} {dtype_name}: loss err {loss_err:.2e}, worst grad err "
                  f"{worst:.2e} {'ok' if ok else 'FAIL'}")
    _write_csv(out / "parity.csv", rows)
    return rows


def _hardware_for(device_name: str):
    from slimpack.specs import hardware_preset

    for key in ("h200", "h100", "h800", "a100"):
        if key in device_name.lower():
            return hardware_preset(key)
    return hardware_preset("h100")


def _sim_vs_real(out: Path, scale: int) -> list[dict]:
    import torch

    from slimpack.cost.calibrated import CalibratedCostModel, load_profile
    from slimpack.runtime.config import RuntimeConfig
    from slimpack.runtime.examples import EXAMPLES
    from slimpack.runtime.launch import run_in_process_group, run_plan
    from slimpack.runtime.profiler import ProfileConfig, profile_model, write_profile_csv
    from slimpack.specs import model_preset
    from slimpack.validation.simulated_vs_measured import compare_with_simulator

    spec = replace(model_preset("llama-7b"), name="llama-7b-4l", num_layers=4)
    hardware = _hardware_for(torch.cuda.get_device_name(0))
    rows = profile_model(spec, ProfileConfig(tokens=(256, 512, 1024, 2048, 4096, 8192),
                                             prefixes=(0, 4096, 16384), repeats=3,
                                             device="cuda", dtype="bf16"))
    write_profile_csv(rows, out / "calib.csv")
    cost = CalibratedCostModel(model=spec, hardware=hardware, table=load_profile(out / "calib.csv"))
    config = RuntimeConfig(device="cuda", dtype="bf16", dist_backend="nccl", warmup_steps=2)
    results = []
    layouts = [(1, None)] + ([(2, "spawn")] if torch.cuda.device_count() >= 2 else [])
    for pp, how in layouts:
        for name, make in EXAMPLES.items():
            plan = make(pp=pp, dp=1, scale=scale)
            if how is None:
                res = run_in_process_group(plan, spec, config, rank=0, local_rank=0,
                                           hardware=hardware)
            else:
                res = run_plan(plan, spec, config, hardware=hardware)
            cmp = compare_with_simulator(res.record, plan, spec, cost)
            row = {"plan": name, "pp": pp, "tokens": plan.num_tokens, **cmp,
                   "mfu": res.record.mfu}
            results.append(row)
            print(f"sim-vs-real {name:9s} pp={pp}: measured {cmp['real_step_s'] * 1e3:8.2f} ms, "
                  f"simulated {cmp['sim_step_s'] * 1e3:8.2f} ms ({cmp['step_error'] * 100:+.1f}%)"
                  f"; peak {cmp['real_peak_bytes'] / 2**30:.2f} GiB measured, "
                  f"{cmp['sim_peak_bytes'] / 2**30:.2f} GiB simulated "
                  f"({cmp['memory_error'] * 100:+.1f}%)")
    _write_csv(out / "sim_vs_real.csv", results)
    return results


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
