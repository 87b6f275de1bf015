"""Weights & Biases logging that can never cost a local result.

Offline by default (no network, no account: runs land in ``results/wandb/``, git-ignored by the
``wandb/`` pattern, and ``wandb sync results/wandb/offline-run-*`` uploads them later);
``online`` syncs live; ``disabled`` writes nothing. Logging happens only after the records are
safely on disk, and every wandb error is caught and reported as a warning line.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

WANDB_MODES = ("offline", "online", "disabled")
PROJECT = "slimpack-suite"


def log_to_wandb(*, mode: str, results_dir: Path, experiment: str, job_type: str,
                 config: dict[str, Any], records: pd.DataFrame | None = None,
                 figures: Sequence[Path] = (), summary: dict[str, float] | None = None,
                 claims: pd.DataFrame | None = None) -> str:
    """Log one W&B run; return '' on success or a one-line warning (never raises)."""
    if mode not in WANDB_MODES:
        raise ValueError(f"wandb mode must be one of {WANDB_MODES}, got {mode!r}")
    if mode == "disabled":
        return ""
    try:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        wandb_dir = results_dir / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        # One run id per experiment and job: its offline directories end in the id, so the
        # older ones can be pruned and only the latest run per experiment stays on disk.
        run_id = f"{experiment}-{job_type}"
        run = wandb.init(project=PROJECT, group=experiment, job_type=job_type, id=run_id,
                         resume="allow",
                         name=f"{experiment}-{job_type}", mode=mode, dir=str(results_dir),
                         config=config, reinit="finish_previous",
                         settings=wandb.Settings(silent=True, init_timeout=60,
                                                 console="off"))
        try:
            payload: dict[str, Any] = {}
            if records is not None and not records.empty:
                payload["records"] = wandb.Table(dataframe=_loggable(records))
            if claims is not None and not claims.empty:
                payload["claims"] = wandb.Table(dataframe=_loggable(claims))
            for path in figures:
                payload[f"figures/{path.stem}"] = wandb.Image(str(path))
            if payload:
                run.log(payload)
            for key, value in (summary or {}).items():
                if isinstance(value, float) and not math.isfinite(value):
                    continue
                run.summary[key] = value
        finally:
            run.finish()
        if mode == "offline":
            _keep_latest(wandb_dir, run_id)
        return ""
    except Exception as exc:  # noqa: BLE001 - W&B must never lose or block local results
        return f"W&B logging for {experiment} ({job_type}) failed, local results are intact: " \
               f"{type(exc).__name__}: {exc}"


def _keep_latest(wandb_dir: Path, run_id: str) -> None:
    """Delete every offline run directory of ``run_id`` but the newest (names sort by time)."""
    runs = sorted(wandb_dir.glob(f"offline-run-*-{run_id}"))
    for old in runs[:-1]:
        shutil.rmtree(old, ignore_errors=True)


def _loggable(frame: pd.DataFrame) -> pd.DataFrame:
    # W&B tables reject pandas 3's string dtype in some versions; plain objects always work.
    out = frame.copy()
    for column in out.columns:
        if not pd.api.types.is_numeric_dtype(out[column]) and not pd.api.types.is_bool_dtype(out[column]):
            out[column] = out[column].astype(object)
    return out
