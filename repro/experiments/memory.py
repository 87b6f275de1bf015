"""Per-stage peak memory of each method, with out-of-memory plans marked.

Each method at its best parallel configuration (llama-70b, Common Crawl-like lengths, 256K,
128 H800 GPUs); the simulator's per-stage peak (activations, KV, model states, logits) against
the GPU's usable memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.ticker import MaxNLocator

from repro.analysis import select
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import (
    SLIMPACK_SOURCE,
    TIMING_COLUMNS,
    all_methods,
    best_record_rows,
    fits_memory,
)
from repro.figures import method_order, new_figure, placeholder, save

if TYPE_CHECKING:
    from slimpack.methods import MethodRegistry

HARDWARE, MODEL, DATASET, GPUS = "h800-80g", "llama-70b", "commoncrawl", 128
CONTEXTS, QUICK_CONTEXTS = (128 * 1024, 256 * 1024), (256 * 1024,)


def points(quick: bool, registry: MethodRegistry | None = None) -> list[Point]:
    """Every compared method of ``registry`` (None: the suite's) at each context."""
    return [{"model": MODEL, "dataset": DATASET, "context": context, "num_gpus": GPUS,
             "global_batch": 4 * GPUS, "seed": 0, "hardware": HARDWARE,
             "methods": list(all_methods(registry))} for context in (QUICK_CONTEXTS if quick else CONTEXTS)]


def run_point(point: Point, registry: MethodRegistry | None = None) -> list[Row]:
    return best_record_rows(point, tuple(point["methods"]), "memory", registry=registry)


def plot(records: pd.DataFrame, out_dir: Path,
         registry: MethodRegistry | None = None) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "peak_memory.png", "no records: run memory")]
    from slimpack.specs import hardware_preset

    usable = hardware_preset(HARDWARE).usable_memory_bytes / 2**30
    contexts = sorted(records["context"].unique())
    fig, axes = new_figure(len(contexts), width=5.5, sharey=True)
    for ax, context in zip(axes[0], contexts, strict=True):
        frame = records[records["context"] == context]
        for method in method_order(frame["method"].unique(), registry):
            rec = frame[frame["method"] == method].iloc[0]
            cell = rec.get("peak_memory_bytes")
            if not isinstance(cell, str):
                continue
            peaks = [b / 2**30 for b in json.loads(cell)]
            oom = str(rec.get("oom")) == "True"
            ax.plot(range(len(peaks)), peaks, marker="x" if oom else "o", markersize=6 if oom else 4,
                    linestyle="--" if oom else "-", label=f"{method}{' (OOM)' if oom else ''}")
        ax.axhline(usable, color="red", linewidth=1, label=f"usable {usable:.0f} GiB")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("pipeline stage")
        ax.set_ylabel("peak memory (GiB)")
        ax.set_title(f"{MODEL}, {DATASET} {context // 1024}K, {GPUS} GPUs", fontsize=9)
        ax.legend(fontsize=6)
    return [save(fig, out_dir, "peak_memory.png")]


def claims(records: pd.DataFrame) -> list[Claim]:
    slim = select(records, method="slimpack")
    fits = float("nan") if slim.empty else float(fits_memory(slim).mean())
    return [Claim(claim_id="slimpack-fits", text="Share of memory points where SlimPack's plan "
                  "fits GPU memory (a planning error counts as not fitting)",
                  source=SLIMPACK_SOURCE, paper_value="always (memory-capped MicroPacks)",
                  reproduced=fits, unit="", check=Check(kind="at_least", target=1.0, reason=(
                      "'always' = every point: no tolerance")), hardware=HARDWARE)]


EXPERIMENT = Experiment(
    name="memory",
    description=("Peak memory per pipeline stage for each method (llama-70b, Common Crawl "
                 "lengths, 128 H800 GPUs); dashed lines with crosses are plans that do not fit."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("slimpack.compare", "slimpack.sim", "slimpack.data"), timing_columns=TIMING_COLUMNS,
)
