"""A stand-in registry for testing the harness itself: ``--registry harness_selftest``.

A test fixture, so it lives with the tests, not in the shipped ``repro`` package: in-process
tests import it from ``tests/`` (pytest puts that directory on ``sys.path``), subprocesses get
``tests/`` through ``PYTHONPATH`` (see ``fixture_env``).

Its experiments are slow enough (a sleep per point) to be killed mid-sweep, deterministic (each
row derives from a hash of its point), and awkward on purpose: points produce different numbers
of rows, and some add a column the others lack, which forces the CSV header to be rewritten.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from repro.experiment import Check, Claim, Experiment, Point, Row

EXPERIMENTS: Mapping[str, str] = MappingProxyType({
    "selftest-a": "harness_selftest",
    "selftest-b": "harness_selftest_b",
})
SLEEP_S = float(os.environ.get("SELFTEST_SLEEP_S", "0.1"))
"""Seconds each point sleeps; the kill tests raise it (through the environment of the run
they kill) to widen the window a kill must land in. Records do not depend on it."""
REGISTRY = "harness_selftest"
TESTS_DIR = Path(__file__).resolve().parent


def fixture_env() -> dict[str, str]:
    """The environment for a subprocess that must import this registry."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(TESTS_DIR) + (os.pathsep + path if path else "")}


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def points(quick: bool) -> list[Point]:
    n = 6 if quick else 24
    return [{"index": i, "size": 2 ** (i % 5), "method": ("x", "y", "z")[i % 3]} for i in range(n)]


def run_point(point: Point) -> list[Row]:
    time.sleep(SLEEP_S)
    rows: list[Row] = []
    for r in range(1 + point["index"] % 4):
        row: Row = {"replica": r, "value": _unit(point["index"], r) * point["size"],
                    "label": f"p{point['index']}-r{r}"}
        if point["index"] % 7 == 3:
            row["rare_column"] = _unit("rare", point["index"])
        rows.append(row)
    return rows


def claims(records) -> list[Claim]:  # noqa: ANN001 - a DataFrame
    from repro.analysis import scalar

    return [Claim(claim_id="mean-value", text="mean of value", source="selftest",
                  paper_value="0.5-ish", reproduced=scalar(records, "value"), unit="",
                  check=Check(kind="at_least", target=0.0, reason="a harness self-test"),
                  hardware="none")]


EXPERIMENT = Experiment(name="selftest-a", description="Harness self-test sweep A.",
                        points=points, run_point=run_point, claims=claims)
