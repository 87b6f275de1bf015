"""WLB-LLM's own headline (arXiv 2503.17924, Table 2) on its own setting.

7B model, 128K context, WLB-LLM's length distribution (the shipped ``wlb-llm`` profile), 64
GPUs at tp 8, cp 2, pp 4, 8 micro-batches (1M tokens) per iteration, 12 iterations streamed
through the planner (the outlier queues carry documents across iterations). The
paper reports the imbalance degree (slowest micro-batch x count / total) falling from 1.44 for
the original fixed-length packing to 1.24 / 1.05 / 1.05 with 1 / 2 / 3 outlier-delay queues, at
8 / 20 / 23 ms of packing time. Our reading: "original" is Megatron-LM's fixed-length packing;
queue thresholds are 1/2 of the context (1 queue), 1/4 and 1/2 (2 queues, the planner's
default), 1/8, 1/4 and 1/2 (3 queues). The imbalance is the planner's estimate per
iteration after two warm-up iterations, as the wlb-llm baseline's own test measures it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.analysis import scalar, select
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import TIMING_COLUMNS
from repro.figures import new_figure, placeholder, save

HARDWARE, MODEL, DATASET, CONTEXT, GPUS = "h100-80g", "llama-7b", "wlb-llm", 128 * 1024, 64
PARALLEL = {"tp": 8, "cp": 2, "pp": 4}
MICROBATCHES = 8
"""1M tokens per iteration: the paper's setting as the wlb-llm baseline's tests read it."""
ITERATIONS, WARMUP = 12, 2
SOURCE = "WLB-LLM arXiv 2503.17924 (Table 2)"
VARIANTS = {  # label -> (outlier queue thresholds or None for fixed-length, paper imbalance, ms)
    "original": (None, 1.44, None),
    "1 queue": ((CONTEXT // 2,), 1.24, 8.0),
    "2 queues": ((CONTEXT // 4, CONTEXT // 2), 1.05, 20.0),
    "3 queues": ((CONTEXT // 8, CONTEXT // 4, CONTEXT // 2), 1.05, 23.0),
}
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)


def points(quick: bool) -> list[Point]:
    return [{"model": MODEL, "dataset": DATASET, "context": CONTEXT, "num_gpus": GPUS,
             "hardware": HARDWARE, "parallel": PARALLEL, "microbatches": MICROBATCHES,
             "iterations": ITERATIONS, "variant": variant, "seed": seed}
            for seed in (QUICK_SEEDS if quick else SEEDS) for variant in VARIANTS]


def iteration_batches(point: Point) -> list[list[tuple[int, int]]]:
    """(seq_id, length) documents per iteration, ids unique across the stream."""
    from slimpack import data

    out, next_id = [], 0
    for it in range(point["iterations"]):
        batch = data.sample_batch(point["dataset"], token_budget=point["microbatches"] * CONTEXT,
                                  context=CONTEXT, seed=1000 * point["seed"] + it)
        out.append([(next_id + i, n) for i, n in enumerate(batch.lengths)])
        next_id += len(batch.lengths)
    return out


def run_point(point: Point) -> list[Row]:
    """Stream the iterations through the variant; one row per iteration after warm-up."""
    import baselines.wlb_llm as wlb
    from baselines.common import fixed_length as fixed
    from slimpack import planning
    from slimpack.batch import Batch, Sequence
    from slimpack.compare import plan_method
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.specs import ParallelSpec, hardware_preset, model_preset

    model, hardware = model_preset(point["model"]), hardware_preset(point["hardware"])
    cost = default_cost_model(model, hardware)
    par = ParallelSpec.for_world(point["num_gpus"], **point["parallel"])
    thresholds = VARIANTS[point["variant"]][0]
    state = None if thresholds is None else wlb.OutlierQueues(thresholds=thresholds)
    carried: list[tuple[int, int]] = []
    arrivals: dict[int, int] = {}
    rows: list[Row] = []
    for it, docs in enumerate(iteration_batches(point)):
        batch = Batch(sequences=tuple(Sequence(seq_id=i, length=n) for i, n in carried + docs))
        started = time.perf_counter()
        if thresholds is None:
            samples = fixed.fixed_length_samples(batch, CONTEXT).samples
            imbalance = planning.imbalance_degree([
                planning.microbatch_stage_times(cost, [s.num_tokens for s in smp], tp=par.tp,
                                                cp=par.cp, pp=par.pp).forward_s for smp in samples])
        else:
            plan = plan_method("wlb-llm", batch, model, hardware, par, cost, context=CONTEXT,
                               s_max=CONTEXT, num_microbatches=point["microbatches"],
                               queue_state=state, iteration=it, arrivals=arrivals)
            imbalance = plan.metadata["imbalance_degree_estimate"]
            state = plan.metadata["queue_state"]
            carried = [tuple(d) for d in plan.metadata["carried"]]
            for seq_id, _ in carried:
                arrivals.setdefault(seq_id, it)
        seconds = time.perf_counter() - started
        if it >= WARMUP:  # let the queues fill, as the paper's steady state
            lengths = batch.lengths
            rows.append({"iteration": it, "imbalance_degree": imbalance, "plan_seconds": seconds,
                         # What the 1-queue analysis reads: documents in each queue's band.
                         "docs": len(lengths), "longest_tokens": max(lengths),
                         "docs_over_half": sum(n >= CONTEXT // 2 for n in lengths),
                         "docs_quarter_to_half": sum(CONTEXT // 4 <= n < CONTEXT // 2
                                                     for n in lengths),
                         "carried_docs": len(carried) if thresholds is not None else 0})
    return rows


def plot(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "table2.png", "no records: run wlb-table2")]
    fig, axes = new_figure(2, width=4.8)
    paper = pd.DataFrame([{"variant": v, "imbalance_degree": spec[1]} for v, spec in VARIANTS.items()])
    both = pd.concat([records[["variant", "imbalance_degree"]].assign(source="reproduced"),
                      paper.assign(source="paper")])
    sns.barplot(both, x="variant", y="imbalance_degree", hue="source", order=list(VARIANTS),
                ax=axes[0][0], errorbar=None)
    axes[0][0].set_ylim(1.0, None)
    axes[0][0].set_title(f"imbalance degree, {MODEL} {CONTEXT // 1024}K", fontsize=9)
    ms = records.assign(plan_ms=1000 * records["plan_seconds"])
    sns.barplot(ms, x="variant", y="plan_ms", order=list(VARIANTS), ax=axes[0][1], errorbar=None,
                color="tab:blue")
    axes[0][1].scatter([v for v, s in VARIANTS.items() if s[2]], [s[2] for s in VARIANTS.values() if s[2]],
                       color="black", marker="D", zorder=3, label="paper")
    axes[0][1].set_ylabel("planning time (ms)")
    axes[0][1].legend()
    for ax in axes[0]:
        ax.set_xlabel("")
    return [save(fig, out_dir, "table2.png")]


def one_queue_analysis(records: pd.DataFrame) -> str:
    """What sets the 1-queue imbalance: how much of the original's excess one queue removes,
    and (where the records carry it) the imbalance of iterations with and without a document
    of 1/4-1/2 of the context, which only a second queue's threshold would delay."""
    one = select(records, variant="1 queue")
    if one.empty:
        return ""
    means = {v: scalar(select(records, variant=v), "imbalance_degree") for v in VARIANTS}
    value = pd.to_numeric(one["imbalance_degree"])
    paper_orig, paper_one = VARIANTS["original"][1], VARIANTS["1 queue"][1]
    others = [f"{label} {means[label]:.3f}" for label in ("original", "2 queues", "3 queues")
              if means[label] == means[label]]
    text = (f"One queue: mean {means['1 queue']:.3f} over {len(one)} iterations of "
            f"{one['seed'].nunique()} seeds (range {value.min():.3f}-{value.max():.3f})"
            + (f"; on the same batches {', '.join(others)}." if others else "."))
    if means["original"] > 1:
        removed = (means["original"] - means["1 queue"]) / (means["original"] - 1)
        text += (f" One queue removes {100 * removed:.0f}% of the original's excess over 1 "
                 f"(the paper's {paper_one} from {paper_orig}: "
                 f"{100 * (paper_orig - paper_one) / (paper_orig - 1):.0f}%).")
    if "docs_quarter_to_half" not in one.columns or one["docs_quarter_to_half"].isna().all():
        return text + (" Rerun the experiment for the per-iteration document counts that say "
                       "which documents one queue leaves in place.")
    band = pd.to_numeric(one["docs_quarter_to_half"]) > 0
    with_band, without = value[band], value[~band]
    lo, hi = CONTEXT // 4 // 1024, CONTEXT // 2 // 1024
    text += (f" With one queue (threshold {hi}K), iterations holding a document of {lo}K-{hi}K "
             f"tokens, which only a second queue ({lo}K) would delay, average "
             f"{with_band.mean():.3f} ({len(with_band)} iterations), those without "
             f"{without.mean():.3f} ({len(without)}): the residual imbalance is these documents, "
             f"and how often a batch holds one ({100 * band.mean():.0f}% of our iterations) "
             "decides the 1-queue value.")
    if with_band.mean() < paper_one:
        text += (f" Even those iterations stay below the paper's {paper_one}: its batches or "
                 "its packing leave more imbalance than ours (its seed and loader are not "
                 "published).")
    else:
        text += " The paper's batches (seed and loader not published) may hold them more often."
    return text


def claims(records: pd.DataFrame) -> list[Claim]:
    out = []
    for label, (_, paper_imbalance, paper_ms) in VARIANTS.items():
        frame = select(records, variant=label)
        out.append(Claim(claim_id=f"imbalance-{label.replace(' ', '-')}",
                         text=f"Imbalance degree, {label}", source=SOURCE,
                         paper_value=f"{paper_imbalance:.2f}", reproduced=scalar(frame, "imbalance_degree"),
                         unit="", check=Check(kind="within", target=paper_imbalance, rel_tol=0.1, reason=(
                             "the paper's one batch (seed unpublished) cannot be redrawn: 10% "
                             "allows another batch of the same length profile")),
                         hardware=HARDWARE,
                         analysis=one_queue_analysis(records) if label == "1 queue" else ""))
        if paper_ms is not None:
            out.append(Claim(claim_id=f"plan-ms-{label.replace(' ', '-')}",
                             text=f"Packing time, {label}", source=SOURCE,
                             paper_value=f"{paper_ms:.0f} ms",
                             reproduced=1000 * scalar(frame, "plan_seconds"), unit="ms",
                             check=Check(kind="at_most", target=5 * paper_ms, reason=(
                                 "Python on a shared 2-core CPU vs the authors' machine: the "
                                 "claim is the order of magnitude (5x)")), hardware=HARDWARE,
                             golden_rel_tol=None))
    return out


EXPERIMENT = Experiment(
    name="wlb-table2",
    description=("WLB-LLM Table 2 on its own setting (7B, 128K, WLB-LLM length profile): "
                 "imbalance degree and packing time with 0-3 outlier-delay queues; packing "
                 "times are wall-clock on this machine (rule: within 5x of the paper's)."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("baselines.wlb_llm", "baselines.common", "slimpack.planning"),
    timing_columns=TIMING_COLUMNS,
)
