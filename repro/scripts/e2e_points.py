"""The e2e-throughput points the search scripts (``bound_reach``, ``cap_audit``) read: the
best-layout rows of the 512-sample batch, grouped by point, and each point's batch."""

from __future__ import annotations

import pandas as pd

from repro.experiments.e2e_throughput import CONTEXT, GPUS, SAMPLES, workload_batch


def best_layout_points(path: str) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
    """((model, dataset, workload), rows) of every best-layout point at 512 samples."""
    records = pd.read_csv(path, low_memory=False)
    records = records[(records["protocol"] == "best layout")
                      & (records["token_budget"] == SAMPLES * CONTEXT)]
    return list(records.groupby(["model", "dataset", "workload"]))


def point_batch(model: str, dataset: str, workload: str):
    """The batch the experiment drew for the point."""
    return workload_batch({"model": model, "dataset": dataset, "context": CONTEXT,
                           "num_gpus": GPUS, "token_budget": SAMPLES * CONTEXT, "seed": 0,
                           "workload": workload})


def method_row(rows: pd.DataFrame, method: str) -> pd.Series | None:
    """The method's row of the point, or None when it has none or no step."""
    row = rows[rows["method"] == method]
    if row.empty or pd.isna(row.iloc[0]["step_time_s"]):
        return None
    return row.iloc[0]
