"""Reading records back for figures and claims: pandas frames, never the raw CSV text."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from repro.runner import records_path


def load_records(results_dir: Path, experiment: str) -> pd.DataFrame:
    """The experiment's records (an empty frame when it has not run)."""
    path = records_path(results_dir, experiment)
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame()
    return pd.read_csv(path)


def select(records: pd.DataFrame, **equal: object) -> pd.DataFrame:
    """Rows whose columns equal the given values (missing column: no rows)."""
    if records.empty:
        return records
    mask = pd.Series(True, index=records.index)
    for column, value in equal.items():
        if column not in records.columns:
            return records.iloc[0:0]
        mask &= records[column] == value
    return records[mask]


def scalar(frame: pd.DataFrame, column: str, how: str = "mean") -> float:
    """One number from a column (NaN when there are no rows), so claims work on empty data."""
    if frame.empty or column not in frame.columns:
        return math.nan
    values = pd.to_numeric(frame[column], errors="coerce").dropna()
    if values.empty:
        return math.nan
    return float(getattr(values, how)())


T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}
"""Two-sided 95% quantiles of Student's t by degrees of freedom (any statistics table)."""


def mean_ci95(values: pd.Series | list[float]) -> tuple[float, float, float]:
    """Mean and 95% confidence interval (Student's t) of a small sample: (mean, low, high).

    One value gives (v, nan, nan): no spread can be claimed from one batch. Beyond 15 degrees
    of freedom the normal quantile 1.96 is used.
    """
    data = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    if data.empty:
        return math.nan, math.nan, math.nan
    mean = float(data.mean())
    if len(data) < 2:
        return mean, math.nan, math.nan
    half = T95.get(len(data) - 1, 1.96) * float(data.std(ddof=1)) / math.sqrt(len(data))
    return mean, mean - half, mean + half
