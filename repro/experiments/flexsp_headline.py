"""FlexSP's own headline results (arXiv 2412.01523) on its own kind of setting.

* Sequence bucketing: pricing every sequence at its bucket's bound over-estimates the batch's
  tokens by 0.5-2.3% with FlexSP's DP bucketing (Q = 16) but 8.8-22.1% with fixed-width
  buckets; we measure both on batches of the three length profiles.
* Throughput: "up to 1.98x" over Megatron-style static sequence parallelism; we run FlexSP and
  Megatron-LM (each at its best parallel configuration) on 64 A100-80G GPUs, 7B and 13B,
  128K context, 512 sequences.
* Solver time: 5-15 s with SCIP in the paper; our HiGHS MILP runs under a time limit.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.analysis import scalar, select
from repro.experiment import Check, Claim, Experiment, Point, Row, between
from repro.experiments.common import TIMING_COLUMNS, compare_rows, draw_batch, speedups
from repro.figures import new_figure, placeholder, save

HARDWARE, GPUS, CONTEXT = "a100-80g", 64, 128 * 1024
DATASETS = ("commoncrawl", "github", "wikipedia")
MODELS, QUICK_MODELS = ("llama-7b", "llama-13b"), ("llama-7b",)
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)
SOURCE = "FlexSP arXiv 2412.01523"
MICROBATCHES = 8
"""Micro-batches the bucketing is measured over, as FlexSP's planner buckets each one."""


def points(quick: bool) -> list[Point]:
    out: list[Point] = [{"kind": "bucketing", "dataset": d, "context": CONTEXT, "global_batch": 512,
                         "seed": s} for d in DATASETS for s in (QUICK_SEEDS if quick else SEEDS)]
    out += [{"kind": "throughput", "model": m, "dataset": d, "context": CONTEXT, "num_gpus": GPUS,
             "global_batch": 512, "seed": 0, "hardware": HARDWARE,
             "methods": ["megatron", "flexsp"]}
            for m in (QUICK_MODELS if quick else MODELS)
            for d in (DATASETS if not quick else DATASETS[:1])]
    return out


def run_point(point: Point) -> list[Row]:
    if point["kind"] == "throughput":
        return compare_rows(point, tuple(point["methods"]), "flexsp-headline")
    from baselines.flexsp import bucketing
    from slimpack.planning.packing import contiguous_partition

    lengths = draw_batch(point, "flexsp-headline").lengths
    rows = [{"scheme": "dp-q16", "scope": "batch", "error_pct": 100 * bucketing.token_estimate_error(
                lengths, bucketing.dp_buckets(lengths, 16))},
            {"scheme": "fixed-2048", "scope": "batch", "error_pct": 100 * bucketing.token_estimate_error(
                lengths, bucketing.fixed_width_buckets(lengths, 2048))}]
    # As the planner buckets: per micro-batch of sorted consecutive sequences (8 of them).
    ordered = sorted(lengths)
    runs = [[ordered[i] for i in run] for run in contiguous_partition(ordered, MICROBATCHES) if run]
    for scheme, make in (("dp-q16", lambda xs: bucketing.dp_buckets(xs, 16)),
                         ("fixed-2048", lambda xs: bucketing.fixed_width_buckets(xs, 2048))):
        estimate = sum(b.bound * b.count for run in runs for b in make(run))
        rows.append({"scheme": scheme, "scope": "per-microbatch",
                     "error_pct": 100 * (estimate / sum(lengths) - 1)})
    return rows


def plot(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "flexsp.png", "no records: run flexsp-headline")]
    fig, axes = new_figure(2, width=5.0)
    buckets = select(records, kind="bucketing")
    if not buckets.empty:
        shown = buckets.assign(scheme=buckets["scheme"] + " (" + buckets.get(
            "scope", pd.Series("batch", index=buckets.index)).fillna("batch") + ")")
        sns.barplot(shown, x="dataset", y="error_pct", hue="scheme", ax=axes[0][0], errorbar=None)
        for lo, hi, color in ((0.5, 2.3, "tab:blue"), (8.8, 22.1, "tab:orange")):
            axes[0][0].axhspan(lo, hi, color=color, alpha=0.12)
        axes[0][0].set_yscale("log")  # DP per micro-batch is ~1%, fixed-width up to ~150%
        axes[0][0].legend(fontsize=7, loc="upper left")
        axes[0][0].set_ylabel("token over-estimate (%, log)")
        axes[0][0].set_title("bucketing error (bands: paper ranges)", fontsize=9)
    thr = select(records, kind="throughput")
    if not thr.empty:
        frame = speedups(thr, ["model", "dataset", "seed"])
        frame = frame[frame["method"] == "flexsp"]
        sns.barplot(frame, x="dataset", y="speedup", hue="model", ax=axes[0][1], errorbar=None)
        axes[0][1].axhline(1.98, color="black", linestyle="--", label="paper: up to 1.98x")
        axes[0][1].axhline(1.0, color="grey", linewidth=0.8)
        axes[0][1].set_ylabel("FlexSP / Megatron-LM tokens/s")
        axes[0][1].set_title(f"{GPUS}x {HARDWARE}, {CONTEXT // 1024}K", fontsize=9)
        axes[0][1].legend(fontsize=7)
    return [save(fig, out_dir, "flexsp.png")]


def _flexsp_time_limit() -> float:
    """FlexSP's default time limit, read from its options (the experiment sets none)."""
    import dataclasses

    from slimpack.methods import get_method

    fields = {f.name: f for f in dataclasses.fields(get_method("flexsp").options)}
    return float(fields["time_limit_s"].default)


def claims(records: pd.DataFrame) -> list[Claim]:
    buckets = select(records, kind="bucketing")
    thr = select(records, kind="throughput")
    speed = speedups(thr, ["model", "dataset", "seed"]) if not thr.empty else thr
    flex = speed[speed["method"] == "flexsp"] if not speed.empty else speed
    limit = _flexsp_time_limit()
    return [
        Claim(claim_id="dp-bucketing-error", text="Token over-estimate of DP bucketing (Q=16) per "
              "micro-batch (8 sorted micro-batches), worst dataset", source=SOURCE,
              paper_value="0.5-2.3%",
              reproduced=scalar(select(buckets, scheme="dp-q16", scope="per-microbatch"),
                                "error_pct", "max"), unit="%",
              check=Check(kind="at_most", target=2.3, reason=(
                  "an over-estimate, lower is better: only the paper's worst (2.3%) bounds it")),
              hardware="none"),
        Claim(claim_id="fixed-bucketing-error", text="Token over-estimate of 2K-wide buckets per "
              "micro-batch, best dataset", source=SOURCE, paper_value="8.8-22.1%",
              reproduced=scalar(select(buckets, scheme="fixed-2048", scope="per-microbatch"),
                                "error_pct", "min"), unit="%",
              check=between(8.8, 22.1, reason=(
                  "the paper's published range over its datasets: both ends checked")),
              hardware="none"),
        Claim(claim_id="speedup-vs-megatron", text="FlexSP / Megatron-LM throughput, best setting",
              source=SOURCE, paper_value="up to 1.98x", reproduced=scalar(flex, "speedup", "max"),
              unit="x", check=Check(kind="within", target=1.98, rel_tol=0.3, reason=(
                  "'up to': a maximum over the paper's settings, found again on our grid")),
              hardware=HARDWARE),
        Claim(claim_id="solve-time", text="FlexSP planning time (worst point) within its "
              f"time limit ({limit:g} s) + 10%", source=SOURCE,
              paper_value="5-15 s (SCIP)", reproduced=scalar(flex, "plan_seconds", "max"), unit="s",
              check=Check(kind="at_most", target=1.1 * limit, reason=(
                  "our HiGHS MILP runs under a time limit, so the paper's 5-15 s (SCIP, no "
                  "limit) is not comparable: the check is that the limit holds")),
              hardware=HARDWARE, golden_rel_tol=None, kind="consistency"),
    ]


EXPERIMENT = Experiment(
    name="flexsp-headline",
    description=("FlexSP's published results on its own setting: bucketing error of DP vs "
                 "fixed-width buckets, and FlexSP vs Megatron-LM throughput on 64 A100-80G GPUs."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("baselines.flexsp", "slimpack.compare", "slimpack.data"), timing_columns=TIMING_COLUMNS,
)
