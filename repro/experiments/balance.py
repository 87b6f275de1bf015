"""Balance: per-unit forward and backward times of each method (violin plots).

A pipeline runs at the pace of its slowest unit (micro-batch or MicroPack); variable-length
batches make units unequal, which is what SlimPack's MicroPacks and asymmetric forward/backward
partitioning address (arXiv 2509.26246). Common Crawl-like lengths at 256K, llama-13b on 128
GPUs, each method at its best parallel configuration; three batches (seeds) in the full sweep.

Beside each full-sweep batch, the same batch cut into Megatron-LM's sample pieces
(``workload`` "sample pieces") for SlimPack and the methods that cut documents at sample
boundaries (``repro.diagnosis.CUTS_DOCUMENTS``) only: the sibling that lets the report tell a
SlimPipe win from its cuts (less attention work) from one of SlimPack's planning. These points
are not settings of their own: the figure, the claims and the report's count of settings read
the documents only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import seaborn as sns

from repro.analysis import scalar, select
from repro.diagnosis import CHALLENGER, CUTS_DOCUMENTS
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import (
    DOCUMENTS_WORKLOAD,
    MEGATRON_BRACKET,
    SAMPLE_PIECES_WORKLOAD,
    SLIMPACK_SOURCE,
    TIMING_COLUMNS,
    all_methods,
    best_record_rows,
    documents_only,
    workload_batch,
)
from repro.figures import method_order, new_figure, placeholder, save

if TYPE_CHECKING:
    from slimpack.methods import MethodRegistry

HARDWARE, MODEL, DATASET, CONTEXT, GPUS = "h800-80g", "llama-13b", "commoncrawl", 256 * 1024, 128
SEEDS, QUICK_SEEDS = (0, 1, 2), (0,)


def points(quick: bool, registry: MethodRegistry | None = None) -> list[Point]:
    """Every compared method of ``registry`` (None: the suite's) at each seed on the documents;
    in the full sweep, each seed's sample pieces for SlimPack and the registry's methods that
    cut documents (module docstring), where it holds SlimPack and one of them."""
    methods = list(all_methods(registry))

    def point(seed: int, workload: str, names: list[str]) -> Point:
        return {"model": MODEL, "dataset": DATASET, "context": CONTEXT, "num_gpus": GPUS,
                "global_batch": 4 * GPUS, "seed": seed, "hardware": HARDWARE,
                "workload": workload, "methods": names}

    documents = [point(seed, DOCUMENTS_WORKLOAD, methods)
                 for seed in (QUICK_SEEDS if quick else SEEDS)]
    siblings = [m for m in methods if m == CHALLENGER or m in CUTS_DOCUMENTS]
    if quick or CHALLENGER not in siblings or len(siblings) < 2:
        return documents
    return documents + [point(seed, SAMPLE_PIECES_WORKLOAD, siblings) for seed in SEEDS]


def run_point(point: Point, registry: MethodRegistry | None = None) -> list[Row]:
    return best_record_rows(point, tuple(point["methods"]), "balance",
                            batch=workload_batch(point, "balance"), registry=registry)


def unit_times(records: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per (method, pass, unit), times normalised to the method's mean."""
    rows = []
    for _, rec in records.iterrows():
        for column, name in (("unit_forward_s", "forward"), ("unit_backward_s", "backward")):
            cell = rec.get(column)
            if not isinstance(cell, str) or not cell:
                continue
            times = json.loads(cell)
            mean = sum(times) / len(times) if times else 0.0
            rows += [{"method": rec["method"], "pass": name, "seconds": t,
                      "relative": t / mean if mean else float("nan")} for t in times]
    return pd.DataFrame(rows)


def plot(records: pd.DataFrame, out_dir: Path,
         registry: MethodRegistry | None = None) -> list[Path]:
    records = documents_only(records)
    long = unit_times(records) if not records.empty else pd.DataFrame()
    if long.empty:
        return [placeholder(out_dir, "unit_times.png", "no records: run balance")]
    order = method_order(long["method"].unique(), registry)
    fig, axes = new_figure(2, width=6.5, sharey=True)
    for ax, name in zip(axes[0], ("forward", "backward"), strict=True):
        sns.violinplot(long[long["pass"] == name], x="method", y="relative", order=order, ax=ax,
                       cut=0, density_norm="width", inner="quart", linewidth=0.8)
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_title(f"{name} time per unit / method mean\n{MODEL}, {DATASET} {CONTEXT // 1024}K, "
                     f"{GPUS} GPUs", fontsize=9)
        ax.set_xlabel("")
        ax.set_ylabel("unit time / mean unit time")
        ax.tick_params(axis="x", rotation=30)
    return [save(fig, out_dir, "unit_times.png")]


def claims(records: pd.DataFrame) -> list[Claim]:
    records = documents_only(records)
    slim = scalar(select(records, method="slimpack"), "imbalance_degree")
    bracket = tuple((base, slim / scalar(select(records, method=base), "imbalance_degree"))
                    for base in MEGATRON_BRACKET)
    return [Claim(claim_id="imbalance-vs-megatron", text="Imbalance degree (max unit forward time "
                  "x units / total), SlimPack over Megatron-LM, Common Crawl 256K",
                  source=SLIMPACK_SOURCE, paper_value="better balanced (below 1)",
                  reproduced=bracket[0][1], bracket=bracket, unit="x",
                  check=Check(kind="at_most", target=1.0, reason=(
                      "'better balanced' = a lower imbalance degree than Megatron-LM's")),
                  hardware=HARDWARE)]


EXPERIMENT = Experiment(
    name="balance",
    description=("Per-unit forward and backward times of each method relative to its mean unit "
                 "(violins): llama-13b, Common Crawl lengths, 256K context, 128 H800 GPUs, each "
                 "method at its best parallel configuration. Each batch also as Megatron-LM's "
                 "sample pieces for SlimPack and the methods that cut documents (the diagnosis "
                 "of a SlimPipe win; not in the violins or the claims)."),
    points=points, run_point=run_point, plot=plot, claims=claims,
    needs=("slimpack.compare", "slimpack.sim", "slimpack.data"), timing_columns=TIMING_COLUMNS,
)
