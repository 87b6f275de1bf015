"""A test registry whose second experiment fails on some points: ``--registry
harness_selftest_fail`` (see :mod:`harness_selftest` for how subprocesses find it).

``selftest-flaky`` is sweep A under another name, raising on every point whose index is 2 mod 5
(5 of 24), with cost hints so its points share the pool with ``selftest-a``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from harness_selftest import EXPERIMENT as _A
from harness_selftest import run_point as _run_point

from repro.experiment import Point, Row

EXPERIMENTS: Mapping[str, str] = MappingProxyType({
    "selftest-a": "harness_selftest",
    "selftest-flaky": "harness_selftest_fail",
})
REGISTRY = "harness_selftest_fail"
FAILING = frozenset(i for i in range(24) if i % 5 == 2)


def run_point(point: Point) -> list[Row]:
    if point["index"] in FAILING:
        raise RuntimeError(f"flaky point {point['index']}")
    return _run_point(point)


EXPERIMENT = replace(_A, name="selftest-flaky", description="Harness self-test with failures.",
                     run_point=run_point, point_cost=lambda point: float(point["size"]))
