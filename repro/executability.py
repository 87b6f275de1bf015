"""REPORT.md's section "Which plans the runtime executes": per method, how many of the records
behind the comparisons hold a plan that ``slimpack run`` executes, and which plan fields stop
the others (each record's ``runtime_refusal``, from the runtime's own check).

A ratio is worth printing only if the plan behind it runs; this section says, for every
method, whether it does today.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pandas as pd

from repro.diagnosis import SETTING_EXPERIMENTS
from slimpack.runtime.validate import refused_field


def executability(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per method over ``frames`` (experiment -> records): records with a plan (no
    planning error), how many of them the runtime executes, and the refused fields with their
    counts. Records written before the column existed are left out (``unknown``)."""
    counts: dict[str, Counter] = {}
    for frame in frames.values():
        if frame.empty or "method" not in frame.columns:
            continue
        has_column = "runtime_refusal" in frame.columns
        for _, row in frame.iterrows():
            if isinstance(row.get("error"), str) and row["error"]:
                continue
            tally = counts.setdefault(row["method"], Counter())
            if not has_column:
                tally["unknown"] += 1
                continue
            refusal = row["runtime_refusal"]
            refusal = refusal if isinstance(refusal, str) else ""
            tally["runs" if not refusal else f"refused: {refused_field(refusal)}"] += 1
    rows = []
    for method, tally in counts.items():
        planned = sum(tally.values())
        refused = sorted((k.removeprefix("refused: "), n) for k, n in tally.items()
                         if k.startswith("refused: "))
        rows.append({"method": method, "records": planned, "executed": tally["runs"],
                     "share executed": tally["runs"] / planned if planned else float("nan"),
                     "refused fields": ", ".join(f"{f} ({n})" for f, n in refused) or "-",
                     "unknown": tally["unknown"]})
    return pd.DataFrame(rows)


def report_lines(records_of: Callable[[str], pd.DataFrame],
                 method_order: Callable[[list[str]], list[str]] | None = None) -> list[str]:
    """The report's section over the experiments that compare methods in a setting."""
    table = executability({name: records_of(name) for name in SETTING_EXPERIMENTS})
    if table.empty:
        return []
    if method_order is not None:
        order = method_order(list(table["method"]))
        table = table.set_index("method").loc[order].reset_index()
    known = table[table["records"] > table["unknown"]]
    lines = ["## Which plans the runtime executes", "",
             "For every record behind the comparisons above (the experiments of the previous "
             "section), whether the PyTorch runtime executes the plan the method emitted "
             "(`slimpack run PLAN.json`; each record's `runtime_refusal`, from "
             "`slimpack.runtime.validate.runtime_refusal`), and the plan field it refuses "
             "otherwise. A refused plan's numbers are simulated only.", "",
             "| method | records | executed | refused (field: records) |", "|---|---|---|---|"]
    for _, r in known.iterrows():
        lines.append(f"| {r['method']} | {r['records'] - r['unknown']} | "
                     f"{r['executed']} ({100 * r['executed'] / (r['records'] - r['unknown']):.0f}%)"
                     f" | {r['refused fields']} |")
    if len(known) < len(table):
        lines += ["", "Records written before records carried `runtime_refusal`: "
                  + ", ".join(f"{r['method']} {r['unknown']}" for _, r in table.iterrows()
                              if r["unknown"]) + "."]
    return [*lines, ""]
