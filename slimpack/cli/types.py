"""argparse ``type=`` callables shared by the subcommands.

A bad number is refused while the command line is parsed (exit 2, the flag named by
argparse), so nothing is sampled, planned or spawned first. Upper bounds exist where a huge
value would otherwise allocate gigabytes or run for minutes before failing.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_GLOBAL_BATCH = 1_000_000
"""Documents per global batch (papers use at most a few thousand; 10^9 allocated 7.45 GiB)."""
MAX_TOKEN_BUDGET = 2**34
"""Tokens per global batch (~1.7e10; 2048 x 256K, the largest paper batch, is 5.4e8)."""


def positive_float(text: str) -> float:
    """A finite number > 0 (refuses -1, 0, nan, inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    # Accept "1e6" as long as it is a whole number: budgets are often written that way.
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}")
    return int(value)


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in [low, high] (no upper bound when ``high`` is None)."""
    allowed = f"in [{low}, {high:,}]" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        value = _integer(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {allowed}, got {text!r}")
        return value

    parse.__name__ = f"integer {allowed}"  # argparse names the type in some messages
    return parse


positive_int = int_range(1)


def preset_help(kind: str) -> str:
    """'model preset: llama-7b, ...' for --help, from the registry (never out of date)."""
    from slimpack.specs import HARDWARE_PRESETS, MODEL_PRESETS

    names = MODEL_PRESETS if kind == "model" else HARDWARE_PRESETS
    return f"{kind} preset: {', '.join(names)}"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
