"""FlexSP's own headline results (arXiv 2412.01523) on its own kind of setting.

* Sequence bucketing: pricing every sequence at its bucket's bound over-estimates the batch's
  tokens by 0.5-2.3% with FlexSP's DP bucketing (Q = 16) but 8.8-22.1% with fixed-width
  buckets; we measure both on batches of the three length profiles.
* Throughput: "outperforms state-of-the-art training frameworks by up to 1.98x" (abstract): its
  paper compares against DeepSpeed-Ulysses at one static SP degree and against batch-adaptive
  SP (one degree per step), both with ZeRO-3, and against Megatron-LM. We run all four, each
  at its best parallel configuration, on 64 A100-80G GPUs, 7B and 13B, 128K context, 512
  sequences, priced by the kernel-level cost model: FlexSP and the two Ulysses baselines with
  ZeRO-3 (``TrainingSpec(zero_stage=3)``, as its paper ran them), Megatron-LM with its own
  distributed optimizer (ZeRO-1). The 1.98x is checked against static Ulysses (DeepSpeed) and
  against Megatron-LM; batch-adaptive SP has no published factor we could read, so FlexSP must
  only not lose to it.
* Solver time: 5-15 s with SCIP in the paper; our HiGHS MILP is bounded by a node limit
  (deterministic work) with a wall-clock safety net (docs/methods.md).
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
SP_METHODS = ("flexsp", "ulysses-static", "ulysses-adaptive")
"""FlexSP and the two baselines of its paper: ZeRO-3, as the paper ran them."""
BASELINES = ("megatron", "ulysses-static", "ulysses-adaptive")
SP_ZERO_STAGE, MEGATRON_ZERO_STAGE = 3, 1
MICROBATCHES = 8
"""Micro-batches the bucketing is measured over, as FlexSP's planner buckets each one."""
FIXED_WIDTH = 2048
"""Width of the fixed buckets the paper compares DP bucketing with (2K tokens)."""
PAPER_FIXED_RANGE = (8.8, 22.1)


def points(quick: bool) -> list[Point]:
    out: list[Point] = [{"kind": "bucketing", "dataset": d, "context": CONTEXT, "global_batch": 512,
                         "seed": s} for d in DATASETS for s in (QUICK_SEEDS if quick else SEEDS)]
    out += [{"kind": "throughput", "model": m, "dataset": d, "context": CONTEXT, "num_gpus": GPUS,
             "global_batch": 512, "seed": 0, "hardware": HARDWARE, "cost_model": "kernel",
             "methods": ["megatron", *SP_METHODS], "sp_zero_stage": SP_ZERO_STAGE}
            for m in (QUICK_MODELS if quick else MODELS)
            for d in (DATASETS if not quick else DATASETS[:1])]
    return out


def run_point(point: Point) -> list[Row]:
    if point["kind"] == "throughput":
        return _throughput_rows(point)
    from baselines.flexsp import bucketing
    from slimpack.planning.packing import contiguous_partition

    lengths = draw_batch(point, "flexsp-headline").lengths
    # What the analysis of the fixed-width claim reads: a 2K bucket rounds each sequence up.
    stats = {"mean_length": sum(lengths) / len(lengths),
             "short_share": sum(n < FIXED_WIDTH for n in lengths) / len(lengths)}
    rows = [{"scheme": "dp-q16", "scope": "batch", "error_pct": 100 * bucketing.token_estimate_error(
                lengths, bucketing.dp_buckets(lengths, 16))},
            {"scheme": "fixed-2048", "scope": "batch", "error_pct": 100 * bucketing.token_estimate_error(
                lengths, bucketing.fixed_width_buckets(lengths, FIXED_WIDTH))}]
    # As the planner buckets: per micro-batch of sorted consecutive sequences (8 of them).
    ordered = sorted(lengths)
    runs = [[ordered[i] for i in run] for run in contiguous_partition(ordered, MICROBATCHES) if run]
    for scheme, make in (("dp-q16", lambda xs: bucketing.dp_buckets(xs, 16)),
                         ("fixed-2048", lambda xs: bucketing.fixed_width_buckets(xs, FIXED_WIDTH))):
        estimate = sum(b.bound * b.count for run in runs for b in make(run))
        rows.append({"scheme": scheme, "scope": "per-microbatch",
                     "error_pct": 100 * (estimate / sum(lengths) - 1)})
    return [{**row, **stats} for row in rows]


def _throughput_rows(point: Point) -> list[Row]:
    """One compare per ZeRO stage on the same batch and cost model: Megatron-LM with its
    distributed optimizer, the SP methods with ZeRO-3 (the simulator takes the ZeRO stage from
    the cost model, one per compare). ``speedup_vs_first`` is over Megatron-LM."""
    from slimpack.cost.kernel_model import KernelCostModel
    from slimpack.specs import hardware_preset, model_preset
    from slimpack.specs.training import TrainingSpec

    model, hardware = model_preset(point["model"]), hardware_preset(point["hardware"])
    batch = draw_batch(point, "flexsp-headline")
    rows = []
    for stage, methods in ((MEGATRON_ZERO_STAGE, ("megatron",)),
                           (point["sp_zero_stage"], SP_METHODS)):
        cost = KernelCostModel(model=model, hardware=hardware,
                               training=TrainingSpec(zero_stage=stage))
        group = [m for m in methods if m in point["methods"]]
        if group:
            rows += [{**row, "zero_stage": stage} for row in compare_rows(
                point, tuple(group), "flexsp-headline", batch=batch, cost=cost)]
    base = next((r["step_time_s"] for r in rows if r["method"] == "megatron"), None)
    for row in rows:
        step = row.get("step_time_s")
        row["speedup_vs_first"] = base / step if base and step else None
    return rows


def flexsp_speedups(thr: pd.DataFrame) -> pd.DataFrame:
    """FlexSP's tokens/s over each baseline's in the same point: one row per (point, baseline)."""
    keys = ["model", "dataset", "seed"]
    frames = []
    for baseline in BASELINES:
        speed = speedups(thr, keys, baseline=baseline)
        speed = speed[speed["method"] == "flexsp"].assign(baseline=baseline)
        frames.append(speed)
    return pd.concat(frames, ignore_index=True) if frames else thr


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
        frame = flexsp_speedups(thr)
        frame = frame.assign(setting=frame["model"] + " " + frame["dataset"])
        sns.barplot(frame, x="setting", y="speedup", hue="baseline", ax=axes[0][1],
                    errorbar=None)
        axes[0][1].axhline(1.98, color="black", linestyle="--", label="paper: up to 1.98x")
        axes[0][1].axhline(1.0, color="grey", linewidth=0.8)
        axes[0][1].set_ylabel("FlexSP / baseline tokens/s")
        axes[0][1].tick_params(axis="x", labelrotation=30, labelsize=7)
        axes[0][1].set_title(f"{GPUS}x {HARDWARE}, {CONTEXT // 1024}K; SP methods ZeRO-3",
                             fontsize=9)
        axes[0][1].legend(fontsize=7)
    return [save(fig, out_dir, "flexsp.png")]


def fixed_bucketing_analysis(buckets: pd.DataFrame) -> str:
    """Why 2K-wide buckets miss the paper's 8.8-22.1%: the error is the round-up per sequence
    over the mean sequence length, so it is set by the batch's lengths."""
    fixed = select(buckets, scheme="fixed-2048", scope="per-microbatch")
    if fixed.empty:
        return ""
    per = fixed.groupby("dataset")["error_pct"].agg(["min", "max"]).sort_values("min")
    parts = [f"{d} {r['min']:.1f}-{r['max']:.1f}%" for d, r in per.iterrows()]
    dp = select(buckets, scheme="dp-q16", scope="per-microbatch")
    dp_lo, dp_hi = scalar(dp, "error_pct", "min"), scalar(dp, "error_pct", "max")
    text = (f"Fixed 2K buckets over-estimate the tokens per micro-batch by {', '.join(parts)} "
            f"over {fixed['seed'].nunique()} seeds; DP bucketing (Q = 16) by "
            f"{dp_lo:.1f}-{dp_hi:.1f}% on the same batches"
            + (" (the paper: 0.5-2.3%)." if dp_hi == dp_hi else "."))
    if "mean_length" not in fixed.columns or fixed["mean_length"].isna().all():
        return text + (" A 2K bucket rounds every sequence up to the next multiple of 2,048 "
                       "tokens, so the error is about half a bucket per sequence over the mean "
                       "length: it is set by the batch's lengths (rerun the experiment for the "
                       "mean lengths).")
    frame = fixed.assign(roundup=fixed["error_pct"] / 100 * fixed["mean_length"])
    by = frame.groupby("dataset").agg(mean_length=("mean_length", "mean"),
                                      short=("short_share", "mean"), roundup=("roundup", "mean"))
    lo, hi = PAPER_FIXED_RANGE
    roundup = float(frame["roundup"].mean())
    return text + (
        " The over-estimate is the round-up per sequence over the mean length: measured "
        + ", ".join(f"{d} {r['roundup']:,.0f} tokens per sequence on a mean of "
                    f"{r['mean_length']:,.0f} ({100 * r['short']:.0f}% of sequences under 2K)"
                    for d, r in by.iterrows())
        + f". At the measured {roundup:,.0f} tokens per sequence, the paper's "
        f"{lo}-{hi}% means mean lengths of about {roundup / (hi / 100):,.0f}-"
        f"{roundup / (lo / 100):,.0f} tokens: its batches hold longer sequences than ours, which "
        "draw documents uniformly (a token-weighted draw, as a token-level loader sees them, "
        "gives 8-23% on the FlexSP Wikipedia sample: tests/test_baseline_flexsp.py).")


def megatron_speedup_analysis(thr: pd.DataFrame, speed: pd.DataFrame) -> str:
    """What the records say about FlexSP over Megatron-LM: where the best ratio comes from
    (MFU, Megatron's recompute) and how much of it batch-adaptive SP already has."""
    vs = select(speed, baseline="megatron").dropna(subset=["speedup"])
    if vs.empty:
        return ""
    best = vs.loc[vs["speedup"].idxmax()]
    key = {"model": best["model"], "dataset": best["dataset"], "seed": best["seed"]}
    here = select(thr, **key)

    def row(method: str) -> pd.Series | None:
        rows = here[here["method"] == method]
        return rows.iloc[0] if not rows.empty else None

    flex, mega, adaptive = row("flexsp"), row("megatron"), row("ulysses-adaptive")
    text = (f"FlexSP / Megatron-LM ranges {vs['speedup'].min():.2f}-{vs['speedup'].max():.2f}x "
            f"over {len(vs)} settings (below 1x on {int((vs['speedup'] < 1).sum())}); the best "
            f"is {best['model']} {best['dataset']}")
    if flex is not None and mega is not None and "mfu" in here.columns:
        text += (f", where FlexSP reaches {100 * float(flex['mfu']):.0f}% MFU against "
                 f"Megatron-LM's {100 * float(mega['mfu']):.0f}% (Megatron recompute "
                 f"{mega.get('recompute', 'n/a')}, FlexSP {flex.get('recompute', 'n/a')})")
    text += "."
    if adaptive is not None and flex is not None:
        over = float(flex["tokens_per_s"]) / float(adaptive["tokens_per_s"])
        text += (f" Batch-adaptive Ulysses (one SP degree per step, no per-sequence groups) "
                 f"gets {float(best['speedup']) / over:.2f}x of it there, FlexSP's "
                 f"heterogeneous groups the remaining {over:.2f}x.")
    return text + (
        " Our Megatron-LM is a strong baseline: document masks with per-document CP sharding "
        "(Transformer Engine's packed format) at its best searched layout, while the paper's "
        "configuration is not published.")


def static_speedup_analysis(thr: pd.DataFrame, speed: pd.DataFrame) -> str:
    """What the records say about FlexSP over static Ulysses SP: the range, and the MFU the
    static baseline would need at the best setting for the paper's ratio."""
    vs = select(speed, baseline="ulysses-static").dropna(subset=["speedup"])
    if vs.empty or "mfu" not in thr.columns:
        return ""
    best = vs.loc[vs["speedup"].idxmax()]
    here = select(thr, model=best["model"], dataset=best["dataset"], seed=best["seed"])
    mfu = {m: float(here[here["method"] == m]["mfu"].iloc[0])
           for m in ("flexsp", "ulysses-static", "megatron") if (here["method"] == m).any()}
    if not {"flexsp", "ulysses-static"} <= set(mfu):
        return ""
    text = (f"FlexSP / static Ulysses ranges {vs['speedup'].min():.2f}-"
            f"{vs['speedup'].max():.2f}x over {len(vs)} settings; the best is {best['model']} "
            f"{best['dataset']}, where FlexSP reaches {100 * mfu['flexsp']:.0f}% MFU and static "
            f"Ulysses {100 * mfu['ulysses-static']:.0f}%")
    if "step_over_ideal" in here.columns:
        over = {m: float(here[here["method"] == m]["step_over_ideal"].iloc[0])
                for m in ("ulysses-static", "flexsp")}
        text += (f" (static's step {over['ulysses-static']:.2f}x its balanced ideal, "
                 f"FlexSP's {over['flexsp']:.2f}x)")
    text += (f". The paper's 1.98x would need static Ulysses at "
             f"{100 * mfu['flexsp'] / 1.98:.0f}% MFU")
    if "megatron" in mfu:
        text += f", below Megatron-LM's {100 * mfu['megatron']:.0f}% in the same setting"
    return text + (
        ". Static Ulysses loses here by running every sequence at the degree the context's "
        "longest needs; what our 128K-context, 64-GPU settings do not reach is the paper's "
        "largest gains, whose settings (contexts, cluster, degrees) we do not have.")


def _flexsp_time_limit() -> float:
    """FlexSP's default time limit, read from its options (the experiment sets none)."""
    import dataclasses

    from slimpack.methods import get_method

    fields = {f.name: f for f in dataclasses.fields(get_method("flexsp").options)}
    return float(fields["time_limit_s"].default)


def claims(records: pd.DataFrame) -> list[Claim]:
    buckets = select(records, kind="bucketing")
    thr = select(records, kind="throughput")
    speed = flexsp_speedups(thr) if not thr.empty else thr.assign(baseline=pd.Series(dtype=str))
    flex = thr[thr["method"] == "flexsp"] if not thr.empty else thr
    vs = {b: select(speed, baseline=b) for b in BASELINES}
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
              check=between(*PAPER_FIXED_RANGE, reason=(
                  "the paper's published range over its datasets: both ends checked")),
              hardware="none", analysis=fixed_bucketing_analysis(buckets)),
        Claim(claim_id="speedup-vs-megatron", text="FlexSP / Megatron-LM throughput, best setting",
              source=SOURCE, paper_value="up to 1.98x",
              reproduced=scalar(vs["megatron"], "speedup", "max"),
              unit="x", check=Check(kind="within", target=1.98, rel_tol=0.3, reason=(
                  "'up to': a maximum over the paper's settings, matched only in kind (its "
                  "cluster, datasets and sampler are not ours)")), hardware=HARDWARE,
              analysis=megatron_speedup_analysis(thr, speed) if not thr.empty else ""),
        Claim(claim_id="speedup-vs-ulysses-static", text="FlexSP / static DeepSpeed-Ulysses SP "
              "(ZeRO-3) throughput, best setting", source=SOURCE + " (abstract)",
              paper_value="up to 1.98x",
              reproduced=scalar(vs["ulysses-static"], "speedup", "max"), unit="x",
              check=Check(kind="within", target=1.98, rel_tol=0.3, reason=(
                  "'up to': a maximum over the paper's settings, matched only in kind (its "
                  "cluster, datasets and sampler are not ours)")), hardware=HARDWARE,
              analysis=static_speedup_analysis(thr, speed) if not thr.empty else ""),
        # The paper's batch-adaptive factor was not available to us: FlexSP adapts per
        # sequence, a superset of per-batch choices, so it must at least not lose (can fail:
        # its micro-batches run as phases, adaptive SP's groups accumulate without barriers).
        Claim(claim_id="speedup-vs-ulysses-adaptive", text="FlexSP / batch-adaptive Ulysses SP "
              "(ZeRO-3) throughput, worst setting", source=SOURCE, paper_value="> 1x",
              reproduced=scalar(vs["ulysses-adaptive"], "speedup", "min"), unit="x",
              check=Check(kind="at_least", target=1.0, reason=(
                  "no published factor we could read: per-sequence degrees are a superset of "
                  "per-batch ones, so FlexSP must not lose")), hardware=HARDWARE),
        Claim(claim_id="solve-time", text="FlexSP planning time (worst point) within its "
              f"safety-net time limit ({limit:g} s) + 10%", source=SOURCE,
              paper_value="5-15 s (SCIP)", reproduced=scalar(flex, "plan_seconds", "max"), unit="s",
              check=Check(kind="at_most", target=1.1 * limit, reason=(
                  "our HiGHS MILP is bounded by a node limit (deterministic work) and a "
                  "wall-clock safety net; the paper's 5-15 s is SCIP on its machine, so the "
                  "check is that the net holds")),
              hardware=HARDWARE, golden_rel_tol=None, kind="consistency"),
    ]


EXPERIMENT = Experiment(
    name="flexsp-headline",
    description=("FlexSP's published results on its own setting: bucketing error of DP vs "
                 "fixed-width buckets, and FlexSP vs its paper's baselines (static and "
                 "batch-adaptive Ulysses SP, ZeRO-3) and Megatron-LM on 64 A100-80G GPUs."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("baselines.flexsp", "slimpack.compare", "slimpack.data"), timing_columns=TIMING_COLUMNS,
)
