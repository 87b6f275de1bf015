"""W&B offline logging keeps only the latest run per experiment on disk (real wandb, offline)."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from repro.wandb_log import log_to_wandb


def test_offline_runs_are_pruned_to_the_latest_per_experiment(tmp_path: Path):
    for i in range(2):
        warning = log_to_wandb(mode="offline", results_dir=tmp_path, experiment="exp-a",
                               job_type="run", config={"i": i},
                               records=pd.DataFrame({"x": [i]}))
        assert warning == ""
        time.sleep(1.1)  # offline directories are named by the second they start
    log_to_wandb(mode="offline", results_dir=tmp_path, experiment="exp-b", job_type="run",
                 config={}, records=pd.DataFrame({"x": [0]}))
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    assert sum(name.endswith("-exp-a-run") for name in runs) == 1
