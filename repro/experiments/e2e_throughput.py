"""End-to-end training throughput of every method, normalised to Megatron-LM.

The SlimPack paper's setting (arXiv 2509.26246): Llama 7B-150B; Common Crawl, GitHub and
Wikipedia length distributions; 64K-256K contexts; 128-256 GPUs; global batches 512-2048;
Megatron-LM as the main baseline; "up to 2.8x" training throughput. Each point draws one global
batch (4 sequences per GPU: 512 on 128 GPUs, 1024 on 256) and runs every method through
``slimpack.compare`` on the simulator, each at its own best parallel configuration.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.analysis import scalar, select
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import (
    ALL_METHODS,
    SLIMPACK_SOURCE,
    TIMING_COLUMNS,
    bracket_speedups,
    compare_rows,
    speedups,
)
from repro.figures import (
    batch_tokens_text,
    format_tokens,
    label_bars,
    method_order,
    new_figure,
    placeholder,
    save,
    with_status,
)

HARDWARE = "h800-80g"
MODELS = ("llama-7b", "llama-13b", "llama-70b", "llama-150b")
DATASETS = ("commoncrawl", "github", "wikipedia")
CONTEXTS = (64 * 1024, 128 * 1024, 256 * 1024)
GPUS = (128, 256)
LARGE_GPUS_CONTEXTS = (256 * 1024,)
"""256-GPU points only at 256K: the full grid at both sizes does not fit the 15-minute budget
of `make reproduce` on a 2-core machine."""
SEQUENCES_PER_GPU = 4
SEARCH_TOP_K = {"naive": 6, "megatron": 12, "megatron-causal": 12, "megatron-dcp": 6,
                "wlb-llm": 3, "flexsp": 2, "slimpipe": 3, "slimpack": 3}
"""Layouts simulated per method and point, in the estimate's order (the lower bound prunes the
rest of an uncapped search). The 48-point sweep cannot afford exhaustive searches on 2 cores
(records say which finished: ``search_exhaustive``), so Megatron-LM, whose planner is fast,
gets its 12 best-estimated layouts and the slow planners 2-6; the ``paper-scale`` experiment
searches Megatron-LM exhaustively. A count, not a time budget, so every machine gets the same
answer."""
QUICK = {"model": ("llama-7b", "llama-70b"), "dataset": ("commoncrawl",),
         "context": (256 * 1024,), "num_gpus": (128,)}
KEYS = ["model", "dataset", "context", "num_gpus", "global_batch", "seed"]


def points(quick: bool) -> list[Point]:
    out = []
    for model in MODELS:
        for dataset in DATASETS:
            for context in CONTEXTS:
                for gpus in GPUS:
                    if gpus != GPUS[0] and context not in LARGE_GPUS_CONTEXTS:
                        continue
                    point = {"model": model, "dataset": dataset, "context": context,
                             "num_gpus": gpus, "global_batch": SEQUENCES_PER_GPU * gpus,
                             "seed": 0, "hardware": HARDWARE, "methods": list(ALL_METHODS),
                             "search_top_k": SEARCH_TOP_K}
                    if quick and not all(point[k] in v for k, v in QUICK.items()):
                        continue
                    out.append(point)
    return out


FLEXSP_OPTIONS = {"milp_counts": 0}
"""FlexSP without its MILP in this sweep: a node-limited HiGHS root costs 25-50 s per plan on
these 32-64-slot pools (docs/methods.md), 72 plans would take the sweep far past its budget,
and the old 2 s wall-clock limit gave nearly the greedy answer anyway. flexsp-headline runs
FlexSP with its MILP."""


def run_point(point: Point) -> list[Row]:
    return compare_rows(point, tuple(point["methods"]), "e2e-throughput",
                        auto_parallel_top_k=point["search_top_k"], search_budget_s=None,
                        method_options={"flexsp": FLEXSP_OPTIONS})


def panel_title(dataset: str, gpus: int, frame: pd.DataFrame) -> str:
    """A panel's title: its setting and its global batch in tokens (the batch counts
    documents, so its token size differs per setting; the x labels give each one)."""
    return (f"{dataset}, {gpus} GPUs ({HARDWARE}), {batch_tokens_text(frame, KEYS)}; "
            "tokens/s / megatron")


def plot(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "throughput.png", "no records: run e2e-throughput")]
    frame = with_status(speedups(records, KEYS), "speedup")
    frame["setting"] = frame["model"] + "\n" + (frame["context"] // 1024).astype(str) + "K"
    if "num_tokens" in frame.columns:
        tokens = frame.groupby(KEYS)["num_tokens"].transform("max")
        frame["setting"] = frame["setting"] + "\n" + tokens.map(format_tokens) + " tok"
    paths = []
    for gpus, per_gpus in frame.groupby("num_gpus"):
        datasets = [d for d in DATASETS if d in set(per_gpus["dataset"])]
        fig, axes = new_figure(1, len(datasets), width=max(8.0, 1.3 * per_gpus["setting"].nunique()),
                               height=3.4)
        for ax, dataset in zip(axes[:, 0], datasets, strict=True):
            sub = per_gpus[per_gpus["dataset"] == dataset]
            by_size = sub.assign(_m=sub["model"].map({m: i for i, m in enumerate(MODELS)}))
            order = list(dict.fromkeys(by_size.sort_values(["_m", "context"])["setting"]))
            hue_order = method_order(sub["method"].unique())
            sns.barplot(sub, x="setting", y="speedup", hue="method", order=order,
                        hue_order=hue_order, ax=ax, errorbar=None)
            label_bars(ax, sub, x="setting", hue="method", order=order, hue_order=hue_order,
                       value="speedup")
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_title(panel_title(dataset, gpus, sub), fontsize=9)
            ax.set_xlabel("")
            ax.set_ylabel("normalised throughput")
            ax.tick_params(axis="x", labelsize=8)
            sns.move_legend(ax, "upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, title=None)
        paths.append(save(fig, out_dir, f"throughput_{gpus}gpus.png"))
    return paths


def _slimpack(frame: pd.DataFrame, **equal: object) -> pd.DataFrame:
    return select(frame, method="slimpack", **equal)


def claims(records: pd.DataFrame) -> list[Claim]:
    frame = speedups(records, KEYS)
    max_speedup = bracket_speedups(records, KEYS,
                                   lambda f: scalar(_slimpack(f), "speedup", "max"))
    cc_256k = bracket_speedups(records, KEYS, lambda f: scalar(
        _slimpack(f, context=256 * 1024, dataset="commoncrawl"), "speedup"))
    wins = float("nan")
    wins_note = cc_note = ""
    if not frame.empty:
        best = frame.loc[frame.groupby("point_key")["tokens_per_s"].idxmax(), "method"]
        wins = float((best == "slimpack").mean())
        counts = best.value_counts()
        wins_note = ("Fastest method per setting: " + ", ".join(
            f"{m} {n}" for m, n in counts.items()) + f" (of {len(best)}).")
        cc = select(frame, context=256 * 1024, dataset="commoncrawl")
        megatron, slimpack = select(cc, method="megatron"), select(cc, method="slimpack")
        needed = {"num_tokens", "step_over_ideal", "bubble_fraction"}
        if not megatron.empty and not slimpack.empty and needed <= set(cc.columns):
            samples = cc["num_tokens"].mean() / (256 * 1024)
            cc_note = (f"These batches hold 4 documents per GPU, about {samples:.0f} samples of "
                       f"256K; Megatron-LM's step is {megatron['step_over_ideal'].mean():.2f}x "
                       f"its ideal (bubble fraction {100 * megatron['bubble_fraction'].mean():.0f}%)"
                       f" against SlimPack's {slimpack['step_over_ideal'].mean():.2f}x. At the "
                       "papers' batch size (512 samples, the `paper-scale` experiment) the lead "
                       "is smaller.")
    return [
        Claim(claim_id="max-speedup", text="Largest SlimPack / Megatron-LM throughput ratio",
              source=SLIMPACK_SOURCE, paper_value="up to 2.8x", reproduced=max_speedup[0][1],
              bracket=max_speedup, unit="x", check=Check(kind="within", target=2.8, rel_tol=0.3, reason=(
                  "a maximum over the paper's own (unpublished) setting grid, not a point: 30% "
                  "allows a different grid to find a somewhat different maximum")),
              hardware=HARDWARE),
        Claim(claim_id="cc-256k-speedup", text="SlimPack / Megatron-LM, Common Crawl, 256K (mean "
              "over models and GPU counts)", source=SLIMPACK_SOURCE, paper_value="up to 2.8x",
              reproduced=cc_256k[0][1], bracket=cc_256k, unit="x",
              check=Check(kind="at_least", target=2.0, reason=(
                  "the headline setting of an 'up to 2.8x' claim: a mean below 2x there "
                  "would not be the same effect")), hardware=HARDWARE, analysis=cc_note),
        Claim(claim_id="slimpack-wins", text="Share of settings where SlimPack has the highest "
              "throughput", source=SLIMPACK_SOURCE, paper_value="all settings",
              reproduced=wins, unit="", check=Check(kind="at_least", target=1.0, reason=(
                  "'all settings' means every one: no tolerance")), hardware=HARDWARE,
              analysis=wins_note),
    ]


EXPERIMENT = Experiment(
    name="e2e-throughput",
    description=("Training throughput (tokens/s) of every method normalised to Megatron-LM: "
                 "llama-7b/13b/70b/150b, Common Crawl / GitHub / Wikipedia lengths, 64K-256K "
                 "contexts on 128 H800 GPUs and 256K on 256 GPUs, 4 sequences per GPU (global batch "
                 "512/1024); each method at its best-estimated parallel configuration."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("slimpack.compare", "slimpack.data"), timing_columns=TIMING_COLUMNS,
)
