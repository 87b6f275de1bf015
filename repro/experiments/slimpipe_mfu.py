"""SlimPipe's MFU against Megatron-LM's 1F1B and interleaved 1F1B as the context grows.

SlimPipe (arXiv 2504.14519): up to 1.57x MFU over the best Megatron-LM configuration at 512K
on llama-70b, and above 45% MFU at 2048K on 256 Hopper 80 GB GPUs. Workload: fixed-length
sequences of the context (16M tokens per step), 128 H800 GPUs, contexts 64K-512K, for
llama-70b, llama-150b and mixtral-8x7b; each schedule at its best parallel configuration
(plain 1F1B restricted to vpp = 1, interleaved to vpp > 1), plus the 2048K llama-70b point on
256 GPUs for SlimPipe alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.analysis import scalar, select
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import SLIMPIPE_SOURCE, TIMING_COLUMNS, best_record_rows
from repro.figures import new_figure, placeholder, save

HARDWARE, GPUS, TOKENS_PER_STEP = "h800-80g", 128, 16 * 1024 * 1024
MODELS = ("llama-70b", "llama-150b", "mixtral-8x7b")
CONTEXTS = (64 * 1024, 128 * 1024, 256 * 1024, 512 * 1024)
QUICK = {"model": ("llama-70b",), "context": (512 * 1024,)}
METHODS = {"megatron:1f1b": "megatron-1f1b", "megatron:interleaved": "megatron-interleaved",
           "slimpipe": "slimpipe"}
LONG_POINT = {"model": "llama-70b", "context": 2048 * 1024, "num_gpus": 256,
              "methods": ["slimpipe"]}


def points(quick: bool) -> list[Point]:
    out = []
    for model in MODELS:
        for context in CONTEXTS:
            if quick and (model not in QUICK["model"] or context not in QUICK["context"]):
                continue
            out.append({"model": model, "context": context, "num_gpus": GPUS,
                        "hardware": HARDWARE, "methods": list(METHODS)})
    out.append({**LONG_POINT, "hardware": HARDWARE})
    return out


def candidate_filter(method: str, candidate) -> bool:  # noqa: ANN001 - a planning Candidate
    if method == "megatron:1f1b":
        return candidate.parallel.vpp == 1
    if method == "megatron:interleaved":
        return candidate.parallel.vpp > 1
    return True


def run_point(point: Point) -> list[Row]:
    from slimpack.batch import Batch

    context = point["context"]
    batch = Batch.from_lengths([context] * max(1, TOKENS_PER_STEP // context), seed=0,
                               source=f"fixed-{context}")
    rows = best_record_rows(point, tuple(point["methods"]), "slimpipe-mfu", batch=batch,
                            candidate_filter=candidate_filter, labels=METHODS)
    # Thousands of slices per step: the per-unit lists would dominate the committed CSV and
    # nothing here reads them.
    return [{k: v for k, v in row.items() if k not in ("unit_forward_s", "unit_backward_s")}
            for row in rows]


def plot(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "mfu.png", "no records: run slimpipe-mfu")]
    frame = records[records["num_gpus"] == GPUS].assign(
        context_k=lambda f: f["context"] // 1024, mfu_pct=lambda f: 100 * f["mfu"])
    models = [m for m in MODELS if m in set(frame["model"])]
    fig, axes = new_figure(max(1, len(models)), width=4.6, sharey=True)
    for ax, model in zip(axes[0], models, strict=False):
        sub = frame[frame["model"] == model]
        sns.lineplot(sub, x="context_k", y="mfu_pct", hue="method", marker="o", ax=ax,
                     hue_order=[m for m in METHODS.values() if m in set(sub["method"])])
        for _, row in sub[sub["oom"].astype(str) == "True"].iterrows():
            ax.annotate("OOM", (row["context_k"], row["mfu_pct"]), fontsize=7, color="red")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (K tokens)")
        ax.set_ylabel("MFU (%)")
        ax.set_title(f"{model}, {GPUS} GPUs", fontsize=9)
        ax.legend(fontsize=7)
    return [save(fig, out_dir, "mfu.png")]


def _extra(row: pd.Series) -> dict:
    extra = row.get("extra", None)
    if isinstance(extra, str):
        try:
            return json.loads(extra)
        except ValueError:
            return {}
    return extra if isinstance(extra, dict) else {}


def _fits(frame: pd.DataFrame) -> pd.DataFrame:
    if not frame.empty and "oom" in frame.columns:
        frame = frame[frame["oom"].astype(str) != "True"]
    return frame


def _describe(row: pd.Series) -> str:
    """One record's MFU, configuration and where its time goes, from its columns."""
    par = row["parallel"]
    par = json.loads(par) if isinstance(par, str) else dict(par)
    degrees = " ".join(f"{k}{par[k]}" for k in ("tp", "cp", "pp", "vpp", "dp", "ep")
                       if k in par and (k != "ep" or par[k] > 1))
    parts = [f"{100 * row['mfu']:.1f}% MFU at {degrees}", f"recompute {row.get('recompute')}"]
    offload = row.get("offload", 0.0)
    if isinstance(offload, float) and offload > 0:
        parts.append(f"activations offloaded {100 * offload:.0f}%")
    parts.append(f"bubble {100 * row['bubble_fraction']:.1f}%")
    moved = _extra(row).get("attention_redistribution")
    if moved:
        parts.append(f"attention redistribution took the forward imbalance between concurrent "
                     f"pipeline ranks from {moved['fwd_imbalance_before']:.2f} to "
                     f"{moved['fwd_imbalance_after']:.3f} (backward "
                     f"{moved['bwd_imbalance_before']:.2f} to "
                     f"{moved['bwd_imbalance_after']:.3f}), its exposed transfers "
                     f"{moved['transfer_s'] / max(moved['moved_s'], 1e-12):.0%} of the "
                     f"attention time it moved")
    return ", ".join(parts)


def gap_notes(records: pd.DataFrame) -> tuple[str, str]:
    """Measured analyses of the 512K ratio and the 2048K MFU, from the records alone."""
    needed = {"method", "model", "context", "num_gpus", "mfu", "bubble_fraction", "parallel"}
    if records.empty or not needed <= set(records.columns):
        return "", ""
    sp = _fits(select(records, method="slimpipe", model="llama-70b", context=512 * 1024,
                      num_gpus=GPUS))
    megatron = _fits(records[(records["model"] == "llama-70b")
                             & (records["context"] == 512 * 1024)
                             & (records["num_gpus"] == GPUS)
                             & records["method"].isin(["megatron-1f1b",
                                                       "megatron-interleaved"])])
    gain_note = ""
    if not sp.empty and not megatron.empty:
        sp_row = sp.iloc[0]
        best = megatron.loc[megatron["mfu"].idxmax()]
        ratio = sp_row["mfu"] / best["mfu"]
        gain_note = (f"SlimPipe: {_describe(sp_row)}. Best Megatron-LM ({best['method']}): "
                     f"{_describe(best)}. Their ratio is {ratio:.2f}x; 1.57x would need "
                     f"Megatron-LM at {100 * sp_row['mfu'] / 1.57:.1f}% MFU (ours reaches "
                     f"{100 * best['mfu']:.1f}% even with full recompute) or SlimPipe at "
                     f"{100 * best['mfu'] * 1.57:.1f}%. ")
        idle = sp_row["bubble_fraction"]
        gain_note += (f"SlimPipe's GPUs idle only {100 * idle:.1f}% of its step, so what "
                      f"remains is mostly the baseline's efficiency (the paper's Megatron-LM "
                      f"MFU at 512K is not known here)." if idle < 0.05 else
                      f"SlimPipe still idles {100 * idle:.1f}% of its step.")
        frame = _fits(records[records["num_gpus"] == GPUS])
        table = frame.pivot_table(index=["model", "context"], columns="method", values="mfu")
        if "slimpipe" in table.columns:
            base = table[[c for c in table.columns if c != "slimpipe"]].max(axis=1)
            ratios = (table["slimpipe"] / base).dropna()
            if not ratios.empty:
                top = ratios.idxmax()
                gain_note += (f" Over the {len(ratios)} setting(s) with both methods the "
                              f"ratio spans {ratios.min():.2f}x-{ratios.max():.2f}x, highest "
                              f"for {top[0]} at {top[1] // 1024}K.")
    long = _fits(select(records, method="slimpipe", model="llama-70b", context=2048 * 1024,
                        num_gpus=256))
    long_note = f"SlimPipe at 2048K: {_describe(long.iloc[0])}." if not long.empty else ""
    return gain_note, long_note


def claims(records: pd.DataFrame) -> list[Claim]:
    def mfu(method: str, model: str, context: int, gpus: int = GPUS) -> float:
        frame = select(records, method=method, model=model, context=context, num_gpus=gpus)
        if not frame.empty and "oom" in frame.columns:
            frame = frame[frame["oom"].astype(str) != "True"]
        return scalar(frame, "mfu")

    ctx = 512 * 1024
    gain_note, long_note = gap_notes(records)
    best_megatron = max(mfu("megatron-1f1b", "llama-70b", ctx), mfu("megatron-interleaved", "llama-70b", ctx))
    return [
        Claim(claim_id="mfu-gain-512k-70b", text="SlimPipe / best Megatron-LM MFU, llama-70b, 512K",
              source=SLIMPIPE_SOURCE, paper_value="up to 1.57x",
              reproduced=mfu("slimpipe", "llama-70b", ctx) / best_megatron, unit="x",
              check=Check(kind="within", target=1.57, rel_tol=0.25, reason=(
                  "'up to': a maximum over the paper's settings; 25% allows our cost "
                  "model's kernel efficiencies to differ from the paper's cluster")),
              hardware=HARDWARE, analysis=gain_note),
        Claim(claim_id="mfu-2048k-70b", text="SlimPipe MFU, llama-70b, 2048K, 256 GPUs",
              source=SLIMPIPE_SOURCE, paper_value="above 45%",
              reproduced=100 * mfu("slimpipe", "llama-70b", 2048 * 1024, 256), unit="%",
              check=Check(kind="at_least", target=45.0, reason=(
                  "the paper's own bound ('above 45%'): no tolerance")), hardware=HARDWARE,
              analysis=long_note),
    ]


EXPERIMENT = Experiment(
    name="slimpipe-mfu",
    description=("MFU of SlimPipe vs Megatron-LM 1F1B and interleaved 1F1B for 64K-512K "
                 "fixed-length sequences on 128 H800 GPUs (llama-70b, llama-150b, "
                 "mixtral-8x7b), each at its best parallel configuration; plus SlimPipe at "
                 "2048K on 256 GPUs (llama-70b)."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("slimpack.compare", "slimpack.sim"), timing_columns=TIMING_COLUMNS,
)
