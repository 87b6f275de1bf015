"""Planning time per method against the global batch size (log-log).

Planning must fit inside a training step (it overlaps the previous one), so its cost as the
batch grows decides whether a method is usable. llama-13b, Common Crawl lengths at 256K, 256
H800 GPUs at one parallel configuration (tp 8 pp 4), global batches 256 to 4096 sequences.
Plan times are wall-clock measurements: they vary run to run (timing columns).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import seaborn as sns

from repro.analysis import select
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import (
    SLIMPACK_SOURCE,
    TIMING_COLUMNS,
    all_methods,
    compare_rows,
    draw_batch,
)
from repro.figures import method_order, new_figure, placeholder, save

if TYPE_CHECKING:
    from slimpack.methods import MethodRegistry

HARDWARE, MODEL, DATASET, CONTEXT, GPUS = "h800-80g", "llama-13b", "commoncrawl", 256 * 1024, 256
PARALLEL = {"tp": 8, "pp": 4}
BATCHES, QUICK_BATCHES = (256, 512, 1024, 2048, 4096), (512, 2048)


def points(quick: bool, registry: MethodRegistry | None = None) -> list[Point]:
    """Every compared method of ``registry`` (None: the suite's) at each batch size."""
    return [{"model": MODEL, "dataset": DATASET, "context": CONTEXT, "num_gpus": GPUS,
             "global_batch": gb, "seed": 0, "hardware": HARDWARE, "parallel": PARALLEL,
             "methods": list(all_methods(registry))} for gb in (QUICK_BATCHES if quick else BATCHES)]


def run_point(point: Point, registry: MethodRegistry | None = None) -> list[Row]:
    return compare_rows(point, tuple(point["methods"]), "solver-overhead",
                               registry=registry, batch=draw_batch(point, "solver-overhead"))


def plot(records: pd.DataFrame, out_dir: Path,
         registry: MethodRegistry | None = None) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "plan_time.png", "no records: run solver-overhead")]
    fig, axes = new_figure(1, width=6.0)
    ax = axes[0][0]
    sns.lineplot(records, x="global_batch", y="plan_seconds", hue="method", marker="o",
                 hue_order=method_order(records["method"].unique(), registry), ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("global batch (sequences)")
    ax.set_ylabel("planning time (s)")
    ax.set_title(f"{MODEL}, {DATASET} {CONTEXT // 1024}K, {GPUS} GPUs, tp8 pp4", fontsize=9)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return [save(fig, out_dir, "plan_time.png")]


def claims(records: pd.DataFrame) -> list[Claim]:
    slim = select(records, method="slimpack")
    ratio = float("nan")
    if not slim.empty:
        ratio = float((slim["plan_seconds"] / slim["step_time_s"]).max())
    return [Claim(claim_id="plan-within-step", text="SlimPack planning time / simulated step time "
                  "(worst over batch sizes)", source=SLIMPACK_SOURCE,
                  paper_value="hidden behind the training step", reproduced=ratio, unit="x",
                  check=Check(kind="at_most", target=1.0, reason=(
                      "'hidden' = planning the next step takes no longer than running this one")),
                  hardware=HARDWARE, golden_rel_tol=None)]


EXPERIMENT = Experiment(
    name="solver-overhead",
    description=("Planning time of each method vs global batch size (log-log; wall-clock, so it "
                 "varies between runs): llama-13b, 256K, 256 H800 GPUs, tp 8 pp 4."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("slimpack.compare", "slimpack.data"), timing_columns=TIMING_COLUMNS,
)
