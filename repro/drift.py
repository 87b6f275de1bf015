"""Compare freshly computed records with reference (committed) ones: ``repro compare``.

Point keys hash the code digest, so a fresh run's keys never equal the committed ones; rows
are matched by their point's config instead (every config column of the experiment's full
sweep, as stored in the CSV), then row by row within the point's block. Every other column is
compared except the wall-clock ones (``plan_seconds``, columns named ``*wall*``), which measure the
machine, not the method: numbers by relative difference, JSON cells element by element, text
exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.registry import resolve_experiment
from repro.runner import RunOptions, flatten_config, point_key, records_path, sweep
from repro.store import LEAD_COLUMNS, RecordStore, cell

DEFAULT_RTOL = 1e-3
"""Drift allowed before ``repro compare`` fails: 0.1% of any non-wall-clock number."""


def is_wall_clock(name: str) -> bool:
    """Columns (and JSON keys) that time the machine: they differ on every run."""
    return name in ("plan_seconds", "seconds") or "wall" in name


@dataclass(kw_only=True)
class Drift:
    experiment: str
    points: int = 0
    """Points present in both the fresh and the reference records."""
    identical: int = 0
    no_reference: int = 0
    """Points computed now that the reference does not hold (a new point)."""
    max_rel: float = 0.0
    where: str = ""
    """Column and point of ``max_rel``."""
    notes: list[str] = field(default_factory=list)

    def ok(self, rtol: float) -> bool:
        return self.max_rel <= rtol


def rel_diff(a: str, b: str) -> tuple[float, str]:
    """Largest relative difference between two CSV cells, and the JSON path where it is."""
    if a == b:
        return 0.0, ""
    return _diff(_parse(a), _parse(b), "")


def _parse(text: str) -> Any:
    if text == "":
        return None
    try:
        return json.loads(text)  # numbers, and the JSON lists/objects of list columns
    except ValueError:
        pass
    try:
        return float(text)  # 'nan', 'inf' (repr of floats) are not JSON
    except ValueError:
        return text


def _diff(a: Any, b: Any, path: str) -> tuple[float, str]:
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return (0.0, "") if a == b else (math.inf, path)
    if isinstance(a, int | float) and isinstance(b, int | float):
        a, b = float(a), float(b)
        if a == b or (math.isnan(a) and math.isnan(b)):
            return 0.0, ""
        if not (math.isfinite(a) and math.isfinite(b)):
            return math.inf, path
        return abs(a - b) / max(abs(a), abs(b)), path
    if isinstance(a, dict) and isinstance(b, dict):
        worst = (0.0 if set(a) == set(b) else math.inf, path)
        for key in set(a) & set(b):
            if not is_wall_clock(key):
                worst = max(worst, _diff(a[key], b[key], f"{path}.{key}"), key=lambda x: x[0])
        return worst
    if isinstance(a, list) and isinstance(b, list):
        worst = (0.0 if len(a) == len(b) else math.inf, path)
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            worst = max(worst, _diff(x, y, f"{path}[{i}]"), key=lambda x: x[0])
        return worst
    return (0.0, "") if a == b else (math.inf, path)


def _blocks(rows: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """Rows grouped by point (``point_key``), in file order."""
    out: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        out.setdefault(row["point_key"], []).append(row)
    return list(out.values())


def _holds(block: list[dict[str, str]], column: str, value: str) -> bool:
    """Every row of ``block`` that fills ``column`` has ``value`` there, and one does (a
    method that failed leaves its step's columns, ``model`` among them, empty)."""
    cells = [r.get(column, "") for r in block]
    return value in cells and all(c in ("", value) for c in cells)


def _matching(blocks: list[list[dict[str, str]]], config: dict[str, str]
              ) -> list[list[dict[str, str]]]:
    return [b for b in blocks if all(_holds(b, k, v) for k, v in config.items())]


def _key(name: str, config: dict[str, Any]) -> str:
    return point_key(name, config)


def compare_experiment(name: str, fresh_dir: Path, reference_dir: Path, *,
                       registry: str = "repro.registry", backend: str = "sim") -> Drift | None:
    """Drift of ``name`` between the two directories; None when it was not run fresh."""
    fresh = RecordStore(records_path(fresh_dir, name)).read()[1]
    if not fresh:
        return None
    reference = RecordStore(records_path(reference_dir, name)).read()[1]
    drift = Drift(experiment=name)
    experiment = resolve_experiment(name, registry)
    options = RunOptions(backend=backend, quick=False, results_dir=fresh_dir, registry=registry,
                         progress=False)
    fresh_blocks, reference_blocks = _blocks(fresh), _blocks(reference)
    for _, config in sweep(experiment, options):
        text = {k: cell(v) for k, v in flatten_config(config).items()}
        found = _matching(fresh_blocks, {k: text[k] for k in ("backend",) if k in text})
        new = next((b for b in found if b[0]["point_key"] == _key(experiment.name, config)), None)
        if new is None:
            continue  # not run now (a quick sweep, an interrupted one)
        # A row may overwrite a config column with what it actually used (``parallel``: the
        # layout chosen); match on the columns the fresh rows kept, compare the others.
        kept = {k: v for k, v in text.items() if _holds(new, k, v)}
        old_blocks = _matching(reference_blocks, kept)
        if not old_blocks:
            drift.no_reference += 1
            continue
        drift.points += 1
        label = json.dumps({k: v for k, v in config.items() if k != "backend"}, sort_keys=True)
        if len(old_blocks) > 1:
            drift.notes.append(f"{len(old_blocks)} reference points match {label}; "
                               "compared with the first")
        old = old_blocks[0]
        if len(new) != len(old):
            drift.max_rel, drift.where = math.inf, f"row count {len(old)} -> {len(new)} at {label}"
            continue
        point_max = 0.0
        for n_row, o_row in zip(new, old, strict=True):
            for column in sorted(set(n_row) | set(o_row)):
                if column in LEAD_COLUMNS or column in kept or is_wall_clock(column):
                    continue
                value, path = rel_diff(n_row.get(column, ""), o_row.get(column, ""))
                point_max = max(point_max, value)
                if value > drift.max_rel:
                    drift.max_rel = value
                    drift.where = (f"{column}{path} = {o_row.get(column, '')[:60]!r} -> "
                                   f"{n_row.get(column, '')[:60]!r} at {label}")
        drift.identical += point_max == 0.0
    if not reference:
        drift.notes.append("no reference records")
    return drift


def format_drift(drift: Drift, rtol: float) -> str:
    status = "ok" if drift.ok(rtol) else f"DRIFT beyond rtol {rtol:g}"
    line = (f"{drift.experiment}: {drift.identical} of {drift.points} points identical, "
            f"max relative difference {drift.max_rel:.3g} ({status})")
    if drift.no_reference:
        line += f"; {drift.no_reference} point(s) have no reference"
    if drift.max_rel > 0:
        line += f"\n  largest: {drift.where}"
    for note in drift.notes:
        line += f"\n  note: {note}"
    return line
