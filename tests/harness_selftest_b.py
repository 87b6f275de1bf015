"""Second self-test experiment (see :mod:`harness_selftest`): same sweep, other name."""

from __future__ import annotations

from dataclasses import replace

from harness_selftest import EXPERIMENT as _A

EXPERIMENT = replace(_A, name="selftest-b", description="Harness self-test sweep B.")
