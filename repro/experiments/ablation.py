"""Ablation of SlimPack's components, added one at a time on top of slicing.

Variants (``slimpack.slimpack_planner`` switches): slicing only (no asymmetric partitioning, no DP-aware
phase 1, no DP-Merge); + asymmetric forward/backward MicroPacks; + DP-aware phase 1; + DP-Merge
(SlimPack's components in full; the search's mirrored-MicroPack fallback and its uniform
candidate, SlimPipe's plan shape, stay off in every variant, so each step measures SlimPack's
MicroPacks, not a choice between them and another shape).
Megatron-LM at the same parallel configuration is the reference. llama-13b, Common Crawl and
GitHub lengths at 256K, 128 H800 GPUs, tp 8 pp 4 (dp 4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.analysis import mean_ci95, select
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import SLIMPACK_SOURCE, TIMING_COLUMNS, simulate_planner
from repro.figures import JITTER_SEED, fixed_jitter, new_figure, placeholder, save

HARDWARE, MODEL, CONTEXT, GPUS = "h800-80g", "llama-13b", 256 * 1024, 128
PARALLEL = {"tp": 8, "pp": 4}
DATASETS, QUICK_DATASETS = ("commoncrawl", "github"), ("commoncrawl",)
SEEDS, QUICK_SEEDS = (0, 1, 2, 3, 4, 5), (0,)
"""Six batches per dataset: the issue asks for a mean and 95% interval over at least five."""
NO_UNIFORM = {"uniform_candidate": False}
"""Every variant plans SlimPack's MicroPacks: the search's uniform candidate
(``SlimPackOptions.uniform_candidate``, SlimPipe's plan shape) would stand in for them wherever
it is faster."""
ONLY_ASYMMETRIC = {"search_mirrored": False, **NO_UNIFORM}
"""The variants with asymmetric MicroPacks keep them: the search's mirrored fallback (our
addition, ``SlimPackOptions.search_mirrored``) would pick mirrored MicroPacks wherever they are
faster and make the asymmetric step's gain >= 1 by construction."""
VARIANTS = {  # label -> (planner, options), cumulative order
    "megatron": ("megatron", {}),
    "slicing": ("slimpack", {"no_asymmetric": True, "no_dp_aware": True, "no_dp_merge": True,
                             **NO_UNIFORM}),
    "+asymmetric": ("slimpack", {"no_dp_aware": True, "no_dp_merge": True, **ONLY_ASYMMETRIC}),
    "+dp-aware": ("slimpack", {"no_dp_merge": True, **ONLY_ASYMMETRIC}),
    "+dp-merge (slimpack)": ("slimpack", {**ONLY_ASYMMETRIC}),
}
STEPS = list(VARIANTS)[1:]


def points(quick: bool) -> list[Point]:
    return [{"model": MODEL, "dataset": dataset, "context": CONTEXT, "num_gpus": GPUS,
             "global_batch": 4 * GPUS, "seed": seed, "hardware": HARDWARE, "parallel": PARALLEL}
            for dataset in (QUICK_DATASETS if quick else DATASETS)
            for seed in (QUICK_SEEDS if quick else SEEDS)]


def run_point(point: Point) -> list[Row]:
    from repro.experiments.common import draw_batch

    batch = draw_batch(point, "ablation")
    rows = []
    for label, (planner, options) in VARIANTS.items():
        row = simulate_planner(point, planner, "ablation", batch=batch, **options)
        row.update(variant=label, planner=planner)
        rows.append(row)
    return rows


COMPONENTS = {"+asymmetric": "slicing", "+dp-aware": "+asymmetric",
              "+dp-merge (slimpack)": "+dp-aware"}
"""Each component's step: the variant that adds it -> the variant it is added to."""


def with_speedup(records: pd.DataFrame) -> pd.DataFrame:
    base = records[records["variant"] == "megatron"][["point_key", "tokens_per_s"]]
    merged = records.merge(base.rename(columns={"tokens_per_s": "_base"}), on="point_key")
    return merged.assign(speedup=merged["tokens_per_s"] / merged["_base"]).drop(columns="_base")


def gains(records: pd.DataFrame) -> pd.DataFrame:
    """One row per batch and component: throughput with the component / without it (the same
    batch and layout), plus the whole of SlimPack over slicing alone."""
    if records.empty:
        return pd.DataFrame(columns=["dataset", "seed", "component", "gain", "tokens"])
    wide = records.pivot_table(index=["dataset", "seed"], columns="variant",
                               values="tokens_per_s")
    tokens = records.groupby(["dataset", "seed"])["num_tokens"].first()
    steps = {**COMPONENTS, "+dp-merge (slimpack)/slicing": None}
    rows = []
    for (dataset, seed), per in wide.iterrows():
        for label, before in steps.items():
            if before is None:
                gain = per["+dp-merge (slimpack)"] / per["slicing"]
                name = "all (slimpack / slicing)"
            else:
                gain = per[label] / per[before]
                name = label.split(" ")[0].lstrip("+")
            rows.append({"dataset": dataset, "seed": seed, "component": name,
                         "gain": float(gain), "tokens": int(tokens[(dataset, seed)])})
    return pd.DataFrame(rows)


def gain_table(records: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    frame = gains(records)
    rows = []
    for (component, dataset), part in frame.groupby(["component", "dataset"], sort=False):
        mean, low, high = mean_ci95(part["gain"])
        rows.append({"component": component, "dataset": dataset, "batches": len(part),
                     "mean tokens per batch": f"{part['tokens'].mean() / 1e6:.2f}M",
                     "mean gain": mean, "95% low": low, "95% high": high,
                     "min": float(part["gain"].min()), "max": float(part["gain"].max())})
    title = (f"Component gains with spread (throughput with / without the component on the "
             f"same batch; mean and Student-t 95% interval over batches; {MODEL}, "
             f"{CONTEXT // 1024}K context, {GPUS} GPUs, tp8 pp4 dp4)")
    return [(title, pd.DataFrame(rows))]


def plot(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "ablation.png", "no records: run ablation")]
    frame = with_speedup(records)
    fig, axes = new_figure(2, width=11.0)
    ax = axes[0][0]
    sns.barplot(frame, x="variant", y="speedup", hue="dataset", order=list(VARIANTS), ax=ax,
                errorbar=None)
    for container in ax.containers:
        ax.bar_label(container, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("throughput / megatron (mean over batches)")
    ax.set_xlabel("")
    tokens = records["num_tokens"].mean() / 1e6
    samples = tokens * 1e6 / (CONTEXT * GPUS // (PARALLEL["tp"] * PARALLEL["pp"]))
    ax.set_title(f"SlimPack ablation: {MODEL}, {CONTEXT // 1024}K, {GPUS} GPUs, tp8 pp4, "
                 f"~{tokens:.1f}M tokens per batch\n(megatron at the same layout gets "
                 f"~{samples:.1f} {CONTEXT // 1024}K samples per replica: a deep bubble)",
                 fontsize=9)
    ax.tick_params(axis="x", rotation=15)
    sns.move_legend(ax, "upper left", fontsize=8)
    ax = axes[0][1]
    per_batch = gains(records)
    with fixed_jitter():
        sns.stripplot(per_batch, x="component", y="gain", hue="dataset", dodge=True, ax=ax,
                      size=4, legend=False)
    sns.pointplot(per_batch, x="component", y="gain", hue="dataset", dodge=0.4,
                  errorbar=("ci", 95), seed=JITTER_SEED, linestyle="none", markers="_",
                  ax=ax)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("gain on the same batch (each dot one batch)")
    ax.set_xlabel("")
    ax.set_title("Each component's gain and its spread over batches", fontsize=9)
    ax.tick_params(axis="x", rotation=15)
    return [save(fig, out_dir, "ablation.png")]


def _cv(cell: object) -> float:
    times = json.loads(cell) if isinstance(cell, str) else list(cell)
    mean = sum(times) / len(times) if times else 0.0
    return (sum((t - mean) ** 2 for t in times) / len(times)) ** 0.5 / mean if mean else float("nan")


def _asymmetric_why(records: pd.DataFrame) -> str:
    """Why asymmetric partitioning gains (or not): unit-time spread and bubbles from the
    records, plus the bound measured when the component was rebuilt (issue 13 item 4)."""
    text = ""
    columns = {"variant", "unit_forward_s", "unit_backward_s", "bubble_fraction"}
    if columns <= set(records.columns):
        stats = {}
        for variant in ("slicing", "+asymmetric"):
            part = records[records["variant"] == variant]
            if part.empty:
                return ""
            stats[variant] = (part["unit_forward_s"].map(_cv).mean(),
                              part["unit_backward_s"].map(_cv).mean(),
                              part["bubble_fraction"].mean())
        (f0, b0, u0), (f1, b1, u1) = stats["slicing"], stats["+asymmetric"]
        text = (f" From these records: MicroPack time CV over all MicroPacks of a step, forward "
                f"{f0:.2f} -> {f1:.2f}, backward {b0:.2f} -> {b1:.2f} (mirrored -> asymmetric); "
                f"bubble fraction {u0:.3f} -> {u1:.3f}.")
    return text + (
        " Why it cannot pay much (measured with repro/scripts/asym_gain.py, issue 13 item 4): "
        "the simulated step is already within 0.2-1.8% (this setting) and 4% (an "
        "attention-heavy mix: llama-7b, 8 x 256K + 3,000 short documents) of its busiest "
        "stage's compute plus a (p-1)-step fill and drain, which no grouping of the same "
        "slices can beat; the spread left is between rounds (long-sequence steps run "
        "backward/forward 1.8, short-document steps 1.3), which a within-round re-deal cannot "
        "move. Regrouping long-sequence sub-slices on backward cost (option regroup_long) "
        "cuts the backward CV inside long rounds from 0.11 to 0.03 but moves the step by "
        "-1% to +0.03%; giving each round's first backward its last forward (round_warmup) "
        "gains 1.9% on the heavy mix and 0.2% here but loses 8% on the e2e llama-7b point; "
        "a reserve for short documents in long rounds (short_reserve) gains nothing. All "
        "three are off by default.")


def claims(records: pd.DataFrame) -> list[Claim]:
    frame = gains(records)
    out = []
    why = {"asymmetric": _asymmetric_why(records),
           "dp-merge": (" DP-Merge is kept only where the simulator finds it faster, so a batch "
                        "without an outlier that needs it gains exactly 1.")}
    for component in ("asymmetric", "dp-aware", "dp-merge"):
        part = select(frame, component=component)["gain"] if not frame.empty else frame
        mean, low, high = mean_ci95(part) if not frame.empty else (float("nan"),) * 3
        moved = int(((part - 1).abs() > 0.001).sum()) if len(part) else 0
        note = (f"It moves the step by more than 0.1% (either way) on {moved} of {len(part)} "
                f"batches (range {part.min():.3f}-{part.max():.3f})."
                + why.get(component, "")) if len(part) else ""
        out.append(Claim(
            claim_id=f"gain-{component}",
            text=(f"Gain of adding {component} (same batch, with / without), lower end of the "
                  f"95% interval over all batches (mean {mean:.3f}, interval "
                  f"[{low:.3f}, {high:.3f}])"),
            source=SLIMPACK_SOURCE, paper_value="each component helps", reproduced=low,
            unit="x", check=Check(kind="at_least", target=1.0, reason=(
                "'helps' means a gain above 1 beyond the spread between batches: the lower "
                "end of its 95% interval")), hardware=HARDWARE, analysis=note))
    mean, low, high = mean_ci95(select(frame, component="all (slimpack / slicing)")["gain"]) \
        if not frame.empty else (float("nan"),) * 3
    out.append(Claim(
        claim_id="full-over-slicing",
        text=(f"Full SlimPack / slicing only, lower end of the 95% interval over all batches "
              f"(mean {mean:.3f}, interval [{low:.3f}, {high:.3f}])"),
        source=SLIMPACK_SOURCE, paper_value="> 1 (components add up)", reproduced=low,
        unit="x", check=Check(kind="at_least", target=1.0, reason=(
            "the components together must gain beyond the spread between batches: the lower "
            "end of the 95% interval")), hardware=HARDWARE))
    merge = select(frame, component="dp-merge")["gain"] if not frame.empty else frame
    out.append(Claim(
        claim_id="dp-merge-no-loss", text="Smallest per-batch gain of adding DP-Merge",
        source=SLIMPACK_SOURCE, paper_value="(by construction)",
        reproduced=float(merge.min()) if len(merge) else float("nan"), unit="x",
        check=Check(kind="at_least", target=1.0, reason=(
            "true by construction: SlimPack's search simulates the unmerged plan too and keeps "
            "the faster")), hardware=HARDWARE, kind="consistency"))
    return out


EXPERIMENT = Experiment(
    name="ablation",
    description=("SlimPack components added one at a time (slicing; + asymmetric MicroPacks; + "
                 "DP-aware phase 1; + DP-Merge), throughput relative to Megatron-LM at the same "
                 "parallel configuration (llama-13b, 256K, 128 GPUs, tp 8 pp 4), six batches of 512 "
                 "documents per dataset. A component's claim is the lower end of its gain's 95% "
                 "interval, so it is reproduced only if the gain is above 1 beyond the spread "
                 "between batches."),
    points=points, run_point=run_point, plot=plot, claims=claims, tables=gain_table,
    needs=("slimpack.methods", "slimpack.slimpack_planner", "slimpack.sim"), timing_columns=TIMING_COLUMNS,
)
