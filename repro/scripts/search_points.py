"""The points the search scripts (``bound_reach``, ``cap_audit``) read: the best-layout rows
of an experiment's largest batch (512 context-length samples), grouped by point, and each
point's batch, for the two experiments whose headline ratios come from a layout search
(``e2e-throughput``, ``paper-scale``)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from repro.experiments import e2e_throughput, paper_scale
from repro.experiments.common import DOCUMENTS_WORKLOAD as DOCUMENTS
from repro.experiments.common import workload_batch

# DOCUMENTS: the workload of a point whose records have no ``workload`` column (paper-scale:
# every method trains the documents drawn).


@dataclass(frozen=True, kw_only=True)
class SearchedExperiment:
    """An experiment whose best-layout records the scripts re-search: where its records are
    and the setting its points share."""

    name: str
    hardware: str
    gpus: int
    context: int
    samples: int

    @property
    def records(self) -> str:
        return f"results/{self.name}/records.csv"

    def points(self, path: str | None = None) -> list[tuple[tuple[str, str, str], pd.DataFrame]]:
        """((model, dataset, workload), rows) of every best-layout point of the largest batch
        (read from ``path``, default: the committed records)."""
        records = pd.read_csv(path or self.records, low_memory=False)
        if "protocol" in records.columns:
            records = records[records["protocol"] == "best layout"]
        records = records[records["token_budget"] == self.samples * self.context]
        if "workload" not in records.columns:
            records = records.assign(workload=DOCUMENTS)
        return list(records.groupby(["model", "dataset", "workload"]))

    def batch(self, model: str, dataset: str, workload: str):
        """The batch the experiment drew for the point."""
        point = {"model": model, "dataset": dataset, "context": self.context,
                 "num_gpus": self.gpus, "token_budget": self.samples * self.context,
                 "seed": 0, "workload": workload}
        if self.name != e2e_throughput.EXPERIMENT.name and workload != DOCUMENTS:
            raise ValueError(f"{self.name}: workload must be {DOCUMENTS!r}, got {workload!r}")
        return workload_batch(point, self.name)


EXPERIMENTS = {
    e.name: e for e in (
        SearchedExperiment(name=e2e_throughput.EXPERIMENT.name, hardware=e2e_throughput.HARDWARE,
                           gpus=e2e_throughput.GPUS, context=e2e_throughput.CONTEXT,
                           samples=e2e_throughput.SAMPLES),
        SearchedExperiment(name=paper_scale.EXPERIMENT.name, hardware=paper_scale.HARDWARE,
                           gpus=paper_scale.GPUS, context=paper_scale.CONTEXT,
                           samples=paper_scale.SAMPLES),
    )
}


def method_row(rows: pd.DataFrame, method: str) -> pd.Series | None:
    """The method's row of the point, or None when it has none or no step."""
    row = rows[rows["method"] == method]
    if row.empty or pd.isna(row.iloc[0]["step_time_s"]):
        return None
    return row.iloc[0]
