"""Reading the 1M-line Wikipedia sample and computing its stats (under 2 s).

A benchmark, not a timed test: ``make bench`` reports the time; with --benchmark-disable it
runs once as a plain test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slimpack.data import compute_stats, read_lengths


def wiki_sample() -> Path:
    override = os.environ.get("SLIMPACK_SHARED_DIR")
    base = Path(override) if override else Path(__file__).resolve().parents[3] / "shared"
    folder = base / "length_distributions" if (base / "length_distributions").is_dir() else base
    path = folder / "flexsp_wikipedia_sample_1M.txt"
    if not path.exists():
        pytest.skip(f"raw length sample {path} not available (set SLIMPACK_SHARED_DIR)")
    return path


def test_bench_read_and_stats_1m_lines(benchmark):
    path = wiki_sample()
    stats = benchmark(lambda: compute_stats(read_lengths(path).lengths))
    assert stats.count == 1_000_000  # summary_stats.json n


def test_bench_sample_4m_token_batch(benchmark):
    from slimpack.data import sample_batch

    batch = benchmark(
        lambda: sample_batch("wikipedia", token_budget=4 * 1024 * 1024, context=32768, seed=0)
    )
    assert batch.num_tokens == 4 * 1024 * 1024
