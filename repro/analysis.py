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
