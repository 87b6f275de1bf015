"""A test registry for the pooled run: the two self-test sweeps plus one with cost hints.

``--registry harness_selftest_pool`` (see :mod:`harness_selftest` for how subprocesses find
it). ``selftest-costly`` is sweep A under another name whose ``point_cost`` is the point's
``size`` (1-16), so the pool's queue interleaves its points with the other two experiments'
instead of running the experiments one after another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from harness_selftest import EXPERIMENT as _A

EXPERIMENTS: Mapping[str, str] = MappingProxyType({
    "selftest-a": "harness_selftest",
    "selftest-b": "harness_selftest_b",
    "selftest-costly": "harness_selftest_pool",
})
REGISTRY = "harness_selftest_pool"

EXPERIMENT = replace(_A, name="selftest-costly", description="Harness self-test with cost hints.",
                     point_cost=lambda point: float(point["size"]))
