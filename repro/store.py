"""The records CSV of one experiment: crash-safe appends, resumability, a canonical final form.

Invariants that make a killed sweep resumable with nothing lost and nothing duplicated:

* every row carries its point's ``point_key`` and ``point_rows`` (rows in the point's block);
* a point's block is appended in one ``write`` and fsynced before the point counts as done;
* on open, a trailing partial line and any block with fewer rows than ``point_rows`` (a write
  cut by a kill) are dropped, so a point is done iff its whole block is in the file;
* ``finalize`` rewrites the file atomically (temp file + ``os.replace``) in the sweep's point
  order with a canonical (lead, then alphabetical) column order, so the bytes do not depend
  on completion order, jobs, or where a run was interrupted.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

LEAD_COLUMNS = ("experiment", "point_key", "point_rows", "repro_version", "backend")
KEPT_WHEN_EMPTY = ("runtime_refusal",)
"""Columns a finished file keeps although every row leaves them empty (others are dropped):
an empty ``runtime_refusal`` says the runtime executes the plan, and a missing column would
read as "records written before the check existed" (``repro.executability``)."""

# Per-unit and per-stage lists are JSON in one cell and can exceed the csv module's 128 KiB.
csv.field_size_limit(2**31 - 1)


def cell(value: Any) -> str:
    """CSV text of a value: repr-exact floats, '' for None."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


class StoreLockedError(RuntimeError):
    pass


@contextlib.contextmanager
def locked_dir(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` so two sweeps never write one CSV at once."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLockedError(
                f"another `repro run` is writing {directory}; wait for it or stop it"
            ) from None
        yield
    finally:
        os.close(fd)  # closing releases the flock


class RecordStore:
    """``results/NAME/records.csv``; strings in, strings out (pandas parses for analysis)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._header: list[str] | None = None
        """Cached header, so appends do not re-read a growing file (one writer holds the lock)."""

    # -- reading -----------------------------------------------------------------------------
    def read(self) -> tuple[list[str], list[dict[str, str]]]:
        """Header and complete rows (partial trailing line and cut blocks dropped)."""
        if not self.path.exists():
            return [], []
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]  # a kill mid-line: drop the fragment
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = list(reader.fieldnames or [])
        rows = [row for row in reader if None not in row and None not in row.values()]
        return header, _complete_blocks(rows)

    def done_keys(self) -> set[str]:
        return {row["point_key"] for row in self.read()[1]}

    def repair(self) -> None:
        """Rewrite the file without fragments of interrupted writes (no-op when clean)."""
        if not self.path.exists():
            return
        header, rows = self.read()
        if _render(header, rows) != self.path.read_text(encoding="utf-8"):
            self._replace(header, rows)

    # -- writing -----------------------------------------------------------------------------
    def append_block(self, rows: Sequence[dict[str, Any]]) -> None:
        """Append one point's rows durably; rewrite the header if new columns appear."""
        if not rows:
            raise ValueError("append_block: a point must produce at least one row")
        if self._header is None:
            self._header = self.read()[0]
        header = self._header
        new_columns = [c for row in rows for c in row if c not in header]
        text_rows = [{k: cell(v) for k, v in row.items()} for row in rows]
        if not header or new_columns:
            merged = _merge_columns(header, [c for row in rows for c in row])
            self._replace(merged, self.read()[1] + text_rows)
            return
        buffer = io.StringIO(newline="")
        writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n", restval="")
        writer.writerows(text_rows)
        with self.path.open("a", encoding="utf-8", newline="") as handle:
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())

    def finalize(self, order: Sequence[str], version: str, *, valid_keys: set[str] | None = None,
                 backend: str | None = None) -> None:
        """Sort blocks into sweep order, drop stale rows, canonical columns, atomically.

        Stale: another harness version, or (with ``valid_keys``) a point of ``backend`` that
        the experiment's full sweep no longer contains. Rows of points outside ``order`` but
        still valid (the full sweep after a quick one, another backend) are kept after the
        ordered ones, in their existing relative order.
        """
        header, rows = self.read()
        if not rows:
            return
        rows = [r for r in rows if r.get("repro_version") == version
                and (valid_keys is None or r.get("backend") != backend
                     or r["point_key"] in valid_keys)]
        rank = {key: i for i, key in enumerate(order)}
        rows.sort(key=lambda r: rank.get(r["point_key"], len(rank)))  # stable sort
        # Header order during a run follows completion order; the final one must not.
        columns = sorted(c for c in header if c in KEPT_WHEN_EMPTY or any(r.get(c) for r in rows))
        ordered = [c for c in LEAD_COLUMNS if c in columns]
        header = ordered + [c for c in columns if c not in LEAD_COLUMNS]
        self._replace(header, [{c: row.get(c, "") for c in header} for row in rows])

    def _replace(self, header: list[str], rows: list[dict[str, str]]) -> None:
        self._header = list(header)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8", newline="") as handle:
            handle.write(_render(header, rows))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)


def _render(header: list[str], rows: Iterable[dict[str, str]]) -> str:
    if not header:
        return ""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _merge_columns(first: list[str], more: Iterable[str]) -> list[str]:
    out = list(first)
    seen = set(out)
    for c in more:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _complete_blocks(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Keep a point's rows only when all ``point_rows`` of them are present, once."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.get("point_key", "")] = counts.get(row.get("point_key", ""), 0) + 1
    keep = []
    for row in rows:
        key = row.get("point_key", "")
        try:
            expected = int(row.get("point_rows", ""))
        except ValueError:
            continue
        if key and counts[key] == expected:
            keep.append(row)
    return keep
