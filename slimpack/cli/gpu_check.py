"""``make gpu-check``: the runtime's one-shot check on a CUDA machine (target < 10 min).

    python -m slimpack.cli.gpu_check [--out results/gpu] [--skip-profile]

1. attention: flash-attn's varlen kernel (and torch's, when present) against the exact
   per-document SDPA path, bf16, forward output and dQ/dK/dV, documents of 1 to 8K tokens
   with and without a KV prefix;
2. parity on CUDA: the parity matrix's single-rank cases in fp32 (slices with KV cache,
   asymmetric units, virtual stages, every recompute mode, offload, tied embeddings; a single
   GPU runs no multi-rank case: those stay on the CPU gloo matrix) and the three example
   plans in bf16, against the unsliced fp32 reference;
3. ``slimpack profile`` of one model (llama-7b layer shapes, 4 layers) in bf16, then the
   example plans scaled up, run and simulated with the calibrated cost model: simulated vs
   measured step time and peak memory (with two or more GPUs the plans also run with pp=2);
4. MFU: Megatron-LM's and SlimPack's plans of one batch of 8 x 16K tokens for a 1.2B model
   (Llama 3.2 1B shapes), executed in bf16 and priced by the default kernel-level model;
5. kernels: GEMM (bf16, fp8), attention (torch's flash, cuDNN and memory-efficient SDPA),
   packed varlen attention over real document mixes, and memory sweeps beside the
   kernel-level cost model's prediction of each row (:mod:`slimpack.runtime.kernel_bench`).

Writes attention.csv, parity.csv, calib.csv, sim_vs_real.csv, mfu.csv, kernels.csv (and
kernels.png), summary.json and summary.md (the tables) under ``--out``. Each part runs on its
own: a part that raises is recorded (``summary.json``, ``errors``) and the others still run;
the exit status is 1 when a check fails or a part raised. ``--reprice`` prices an earlier
run's kernels.csv with the current constants (no GPU needed). Installs nothing: on a
machine without a network, run it from the checkout with the machine's own torch
(``PYTHONPATH=. python3 -m slimpack.cli.gpu_check``). Without CUDA it prints why and exits
with status 2 (nothing was checked).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

AS_RUN = "as run: no optimizer state, bf16 gradients"
"""The ``sim_recipe`` of a row whose simulation priced the run as the runtime executes it."""
PARTS = ("attention", "kernels", "parity", "sim_vs_real", "mfu")
"""The parts, in the order they run by default (the cheapest and the kernel data first)."""

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
                   help="attention and parity only (no profile, sim-vs-real or MFU)")
    p.add_argument("--mfu-micro-batches", type=int, default=MFU_MICRO_BATCHES,
                   help=f"micro-batches of {MFU_CONTEXT} tokens in the MFU batch (default "
                        f"{MFU_MICRO_BATCHES})")
    p.add_argument("--reprice", action="store_true",
                   help="no GPU: price OUT/kernels.csv of an earlier run with the current cost "
                        "model and rewrite its model columns and OUT/summary.md")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated parts to run, in this order (default {','.join(PARTS)})")
    args = p.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        p.error(f"--parts must name some of {', '.join(PARTS)}; got {unknown or 'nothing'}")
    if args.skip_profile:
        args.parts = [part for part in args.parts if part in ("attention", "parity")]
    if args.scale < 1:
        p.error(f"--scale must be >= 1, got {args.scale}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reprice:
        return reprice(Path(args.out))
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
    runners = {"attention": lambda: _attention(out), "parity": lambda: _parity(out),
               "kernels": lambda: _kernels(out), "sim_vs_real": lambda: _sim_vs_real(out, args.scale),
               "mfu": lambda: _mfu(out, args.mfu_micro_batches)}
    summary["errors"] = {}
    try:
        for part in args.parts:
            part_started = time.perf_counter()
            try:
                summary[part] = runners[part]()
            except Exception:  # one broken part must not hide the others' results
                summary["errors"][part] = traceback.format_exc()
                print(f"gpu_check: part {part} raised:\n{summary['errors'][part]}",
                      file=sys.stderr)
            print(f"gpu_check: part {part} took {time.perf_counter() - part_started:.0f} s",
                  flush=True)
            _write_summary(out, summary, started)
    finally:
        dist.destroy_process_group()
    _write_summary(out, summary, started)
    checks = summary.get("attention", []) + summary.get("parity", [])
    failed = [r for r in checks if r["ok"] is False]
    checked = [r for r in checks if r["ok"] is not None]
    print(f"gpu_check: {len(checked) - len(failed)}/{len(checked)} checks passed "
          f"({len(checks) - len(checked)} not checked), {len(summary['errors'])} part(s) "
          f"raised, in {summary['wall_s']:.0f} s; results in {out}/ (summary.md)")
    return 1 if failed or summary["errors"] else 0


def _write_summary(out: Path, summary: dict, started: float) -> None:
    summary["wall_s"] = time.perf_counter() - started
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(summary_markdown(summary))


def summary_markdown(summary: dict) -> str:
    """The check's one table per part, for people (summary.json keeps every field)."""
    lines = [f"# GPU check on {summary['device']} (torch {summary['torch']}, "
             f"{summary['num_gpus']} GPU(s) visible)", "",
             "Single-rank cases only: the multi-rank parity matrix runs on CPU gloo "
             "(`python -m slimpack.runtime.parity_matrix`).", "",
             "| check | dtype | error | verdict | detail |", "|---|---|---|---|---|"]
    for row in summary.get("attention", []) + summary.get("parity", []):
        verdict = {True: "pass", False: "FAIL", None: "not checked"}[row["ok"]]
        error = "" if row["error"] is None else f"{row['error']:.1e}"
        lines.append(f"| {row['check']} | {row['dtype']} | {error} | {verdict} | "
                     f"{row['note']} |")
    if summary.get("sim_vs_real"):
        lines += ["", "| example plan | pp | measured ms | simulated ms (calibrated) | step error "
                  "| measured GiB | simulated GiB |", "|---|---|---|---|---|---|---|"]
        for r in summary["sim_vs_real"]:
            lines.append(f"| {r['plan']} | {r['pp']} | {r['real_step_s'] * 1e3:.2f} | "
                         f"{r['sim_step_s'] * 1e3:.2f} | {r['step_error'] * 100:+.1f}% | "
                         f"{r['real_peak_bytes'] / 2**30:.2f} | {r['sim_peak_bytes'] / 2**30:.2f} |")
    if summary.get("mfu"):
        tokens = summary["mfu"][0]["tokens"]
        lines += ["", f"| method ({MFU_MODEL}, {tokens:,} tokens in {MFU_CONTEXT}-token "
                  "micro-batches) | "
                  "attention | measured MFU | goal | simulated MFU | step error | measured GiB "
                  "| simulated GiB |", "|---|---|---|---|---|---|---|---|"]
        for r in summary["mfu"]:
            lines.append(f"| {r['method']} | {r['attention']} | {r['mfu'] * 100:.1f}% | "
                         f">= {r['goal_mfu'] * 100:.0f}% | {r['sim_mfu'] * 100:.1f}% | "
                         f"{r['step_error'] * 100:+.1f}% | {r['measured_peak_gib']:.2f} | "
                         f"{r['sim_peak_gib']:.2f} |")
        lines += ["", "The runtime takes no optimizer step: both peaks hold no optimizer "
                  "state (simulated under `as_run_training`, bf16 gradients)."
                  if all(r.get("sim_recipe") == AS_RUN for r in summary["mfu"]) else
                  "The runtime takes no optimizer step, so its measured peak holds no Adam "
                  "states; the simulated peak includes them (ZeRO-1 over dp = 1; rows written "
                  "before the simulator priced the run as executed)."]
    if summary.get("kernels"):
        lines += ["", "| kernel sweep | dtype | pass | rows | median TFLOP/s or TB/s | "
                  "model / measured: median | min | max |", "|---|---|---|---|---|---|---|---|"]
        for r in summary["kernels"]:
            lines.append(f"| {r['kernel']} | {r['dtype']} | {r['pass'] or '-'} | {r['rows']} | "
                         f"{r['median_rate']:.2f} | {r['median_ratio']:.2f} | "
                         f"{r['min_ratio']:.2f} | {r['max_ratio']:.2f} |")
        lines += ["", "Every row, and the cost model's prediction of it: `kernels.csv` "
                  "(`slimpack.runtime.kernel_bench`); at a glance: `kernels.png`.", "",
                  "![kernel-level cost model vs measured](kernels.png)"]
    for part, error in summary.get("errors", {}).items():
        lines += ["", f"Part `{part}` raised:", "", "```", error.rstrip(), "```"]
    if summary.get("note"):
        lines += ["", summary["note"]]
    lines += ["", f"Wall time: {summary.get('wall_s', 0.0):.0f} s.", ""]
    return "\n".join(lines)


ATTENTION_LAYOUT = {"q_lens": (4096, 1000, 37, 1), "k_lens": (8192, 1000, 37, 513)}
"""Documents of very different lengths, two with a KV prefix (bottom-right causal masks)."""
ATTENTION_SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128}
"""Llama-3-style GQA heads (head_dim 128, the FlashAttention kernels' common case)."""
MFU_MODEL, MFU_CONTEXT, MFU_MICRO_BATCHES = "llama3.2-1b", 16384, 8
MFU_METHODS = ("megatron", "slimpack")
MFU_GOAL = 0.45
"""Issue 23's goal for one H200, a 1-3B model and 8K-32K tokens per micro-batch with
flash-attn varlen."""


def _attention(out: Path) -> list[dict]:
    """Each fast varlen backend present against the exact per-document SDPA path, bf16,
    forward output and dQ/dK/dV; a backend that is not installed is a row saying so."""
    import torch

    from slimpack.runtime.attention import VarlenLayout, _flash_varlen, _torch_varlen
    from slimpack.runtime.attention_check import backend_agreement

    dev = torch.device("cuda", 0)
    layout = VarlenLayout(**ATTENTION_LAYOUT)
    present = {"flash": _flash_varlen() is not None, "torch-varlen": _torch_varlen() is not None}
    rows = []
    for backend, available in present.items():
        if not available:
            rows.append({"check": f"attention {backend} vs sdpa", "dtype": "bf16",
                         "error": None, "ok": None,
                         "note": "not installed" + (" (pip install -e '.[gpu]')"
                                                    if backend == "flash" else "")})
            continue
        agree = backend_agreement(layout, **ATTENTION_SHAPE, backend=backend, reference="sdpa",
                                  device=dev, dtype=torch.bfloat16)
        rows.append({"check": f"attention {backend} vs sdpa", "dtype": "bf16",
                     "error": agree.worst, "ok": agree.worst < TOLERANCE["bf16"],
                     "note": f"out {agree.out_rel:.1e}, " + ", ".join(
                         f"{k} {v:.1e}" for k, v in agree.grad_rel.items())})
        print(f"attention {backend:12s} vs sdpa: {rows[-1]['note']}")
    _write_csv(out / "attention.csv", rows)
    return rows


def _parity(out: Path) -> list[dict]:
    """The parity matrix's single-rank cases in fp32 (a single GPU runs no more ranks than it
    has: the multi-rank cases stay on the CPU gloo matrix), then the example plans in bf16,
    each against the unsliced fp32 reference on the same device."""
    from slimpack.runtime.config import RuntimeConfig
    from slimpack.runtime.examples import EXAMPLES
    from slimpack.runtime.launch import run_in_process_group
    from slimpack.runtime.parity_matrix import run_single_rank_case, single_rank_cases
    from slimpack.runtime.reference import reference_step
    from slimpack.specs import model_preset

    rows = []
    fp32 = RuntimeConfig(device="cuda", dtype="fp32", dist_backend="nccl")
    for case in single_rank_cases():
        check = run_single_rank_case(case, fp32)
        worst = max(check.loss_rel, check.max_grad_rel)
        rows.append({"check": f"matrix: {case.name}", "dtype": "fp32", "error": worst,
                     "ok": not check.missing and worst < TOLERANCE["fp32"],
                     "note": check.describe()})
        print(f"parity {case.name}: {check.describe()}")
    spec = model_preset("tiny")
    bf16 = RuntimeConfig(device="cuda", dtype="bf16", dist_backend="nccl")
    for name, make in EXAMPLES.items():
        plan = make(pp=1, dp=1, vpp=2 if name == "slimpack" else 1)
        res = run_in_process_group(plan, spec, bf16, rank=0, local_rank=0, return_grads=True)
        ref = reference_step(spec, plan.sequence_lengths, device="cuda")
        grads = res.grads()
        worst = max(float((grads[n] - g).norm() / g.norm()) for n, g in ref.grads.items())
        loss_err = abs(res.loss - ref.loss) / abs(ref.loss)
        rows.append({"check": f"{name} example plan", "dtype": "bf16",
                     "error": max(worst, loss_err),
                     "ok": max(worst, loss_err) < TOLERANCE["bf16"],
                     "note": f"loss {loss_err:.1e}, worst grad {worst:.1e}"})
        print(f"parity {name} example bf16: {rows[-1]['note']}")
    _write_csv(out / "parity.csv", rows)
    return rows


def _mfu(out: Path, micro_batches: int = MFU_MICRO_BATCHES) -> list[dict]:
    """MFU of real plans on this GPU: each method in ``MFU_METHODS`` plans the same batch
    (``MFU_MICRO_BATCHES`` x ``MFU_CONTEXT`` tokens of Common Crawl lengths) for one GPU, the
    runtime executes it in bf16 with the fastest attention backend, and the simulator prices
    the same plan with the default (uncalibrated) kernel-level cost model."""
    import torch

    from slimpack import data
    from slimpack.compare import plan_method
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.runtime.capabilities import as_run_training
    from slimpack.runtime.config import RuntimeConfig
    from slimpack.runtime.launch import run_in_process_group
    from slimpack.sim import simulate
    from slimpack.specs import ParallelSpec, model_preset

    model = model_preset(MFU_MODEL)
    hardware = _hardware_for(torch.cuda.get_device_name(0))
    cost = default_cost_model(model, hardware)
    # Planned under the default recipe, priced as the runtime runs it (no optimizer state).
    as_run = default_cost_model(model, hardware, as_run_training("bf16"))
    batch = data.sample_batch("commoncrawl", token_budget=micro_batches * MFU_CONTEXT,
                              context=MFU_CONTEXT, seed=0)
    config = RuntimeConfig(device="cuda", dtype="bf16", dist_backend="nccl", warmup_steps=2,
                           measured_steps=3, record_ops=False)
    rows = []
    for method in MFU_METHODS:
        plan = plan_method(method, batch, model, hardware, ParallelSpec(), cost,
                           context=MFU_CONTEXT, time_limit_s=None)
        measured = run_in_process_group(plan, model, config, rank=0, local_rank=0,
                                        hardware=hardware).record
        simulated = simulate(plan, model=model, hardware=hardware, cost=as_run).record
        rows.append({"method": method, "model": MFU_MODEL, "tokens": plan.num_tokens,
                     "attention": measured.extra.get("attention_backend", ""),
                     "measured_step_s": measured.step_time_s, "mfu": measured.mfu,
                     "sim_step_s": simulated.step_time_s, "sim_mfu": simulated.mfu,
                     "step_error": (simulated.step_time_s - measured.step_time_s)
                     / measured.step_time_s,
                     "measured_peak_gib": max(measured.peak_memory_bytes) / 2**30,
                     "sim_peak_gib": max(simulated.peak_memory_bytes) / 2**30,
                     "goal_mfu": MFU_GOAL, "sim_recipe": AS_RUN})
        print(f"mfu {method}: {measured.mfu * 100:.1f}% measured "
              f"({measured.step_time_s * 1e3:.1f} ms), simulated {simulated.mfu * 100:.1f}% "
              f"({rows[-1]['step_error'] * 100:+.1f}% step error)")
    _write_csv(out / "mfu.csv", rows)
    return rows


def _kernels(out: Path) -> list[dict]:
    """GEMM, attention and memory sweeps (``kernels.csv``, every row beside the kernel-level
    model's prediction); the summary keeps one line per kernel, dtype and pass."""
    import torch

    from slimpack.runtime import kernel_bench
    from slimpack.runtime.attention import _torch_varlen

    name = torch.cuda.get_device_name(0)
    hardware = _hardware_for(name)
    rows = []
    sweeps = [kernel_bench.memory_sweep, kernel_bench.gemm_sweep, kernel_bench.attention_sweep]
    if _torch_varlen() is not None:
        sweeps.append(kernel_bench.varlen_sweep)
    for sweep in sweeps:
        rows += sweep(hardware, name)
        kernel_bench.write_rows(rows, out / "kernels.csv")
    plot_kernels(rows, out / "kernels.png")
    return kernel_bench.summarize(rows)


def plot_kernels(rows: list, path: Path) -> Path:
    """Model against measured time, one panel per sweep kind: the kernel table at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("GEMM", lambda r: r.sweep == "gemm", lambda r: r.dtype),
              ("attention (SDPA, 16K tokens per call)", lambda r: r.sweep == "attention",
               lambda r: f"{r.kernel} {r.pass_}"),
              ("packed varlen attention (real documents)", lambda r: r.sweep == "varlen",
               lambda r: f"{r.kernel} {r.pass_}")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0))
    for ax, (title, keep, label) in zip(axes, panels, strict=True):
        chosen = [r for r in rows if keep(r)]
        for name in sorted({label(r) for r in chosen}):
            group = [r for r in chosen if label(r) == name]
            ax.scatter([r.measured_s * 1e3 for r in group], [r.model_s * 1e3 for r in group],
                       s=10, alpha=0.7, label=name)
        if chosen:
            lo = min(min(r.measured_s, r.model_s) for r in chosen) * 1e3
            hi = max(max(r.measured_s, r.model_s) for r in chosen) * 1e3
            ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("measured ms")
        ax.set_ylabel("cost model ms")
    device = rows[0].device if rows else "?"
    fig.suptitle(f"Kernel-level cost model vs {device} (on the line: exact)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def reprice(out: Path) -> int:
    """``--reprice``: price the kernels of an earlier run (``kernels.csv`` under ``out``) with
    the current cost model, rewrite the CSV's model columns and the summary's kernel table. No
    GPU needed: after a change of the kernel constants, the committed measurements say at once
    how far the model now is from them."""
    from slimpack.runtime import kernel_bench

    path = out / "kernels.csv"
    if not path.is_file():
        print(f"gpu_check --reprice: {path} does not exist (run the kernels part on a GPU first)",
              file=sys.stderr)
        return 2
    rows = kernel_bench.read_rows(path)
    rows = kernel_bench.reprice(rows, _hardware_for(rows[0].device))
    kernel_bench.write_rows(rows, path)
    plot_kernels(rows, out / "kernels.png")
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {
        "device": rows[0].device, "num_gpus": 1, "torch": "?"}
    summary["kernels"] = kernel_bench.summarize(rows)
    summary_path.write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(summary_markdown(summary))
    print(f"gpu_check --reprice: {len(rows)} kernel rows of {path} priced by the current model")
    return 0


def _hardware_for(device_name: str):
    from slimpack.specs import hardware_preset

    for key in ("h200", "h100", "h800", "a100"):
        if key in device_name.lower():
            return hardware_preset(key)
    return hardware_preset("h100")


def _sim_vs_real(out: Path, scale: int) -> list[dict]:
    import torch

    from slimpack.cost.calibrated import CalibratedCostModel, load_profile
    from slimpack.runtime.capabilities import as_run_training
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
    cost = CalibratedCostModel(model=spec, hardware=hardware, table=load_profile(out / "calib.csv"),
                               training=as_run_training("bf16"))
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
