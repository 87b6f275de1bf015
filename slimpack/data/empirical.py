"""Build an empirical profile (quantile table + exact top records) from real lengths."""

from __future__ import annotations

import math

import numpy as np

from slimpack.data.profile import Profile
from slimpack.data.stats import compute_stats

DEFAULT_BODY_QUANTILES = 2048
"""Evenly spaced body knots; enough that interpolation error is far below sampling noise."""
DEFAULT_TAIL_KNOTS = 512
"""Extra knots log-spaced in 1-p, so the 1%..0.1% tail is as fine as the body."""
TOP_RECORD_FRACTION = 0.001
MAX_TOP_RECORDS = 2000


def default_top_records(n: int) -> int:
    """The longest 0.1% (at least 16, at most 2,000) are kept exactly."""
    return min(n - 1, MAX_TOP_RECORDS, max(16, math.ceil(n * TOP_RECORD_FRACTION)))


def build_empirical_profile(
    lengths: np.ndarray,
    *,
    name: str,
    description: str,
    provenance: str,
    licence: str,
    default_truncation: str = "split",
    truncation_note: str = "",
    body_quantiles: int = DEFAULT_BODY_QUANTILES,
    top_records: int | None = None,
) -> Profile:
    values = np.sort(np.asarray(lengths, dtype=np.int64))
    n = int(values.size)
    if n < 2:
        raise ValueError(f"profile {name!r}: needs at least 2 lengths, got {n}")
    if body_quantiles < 2:
        raise ValueError(f"body_quantiles must be >= 2, got {body_quantiles}")
    k = default_top_records(n) if top_records is None else top_records
    if not 0 <= k < n:
        raise ValueError(f"top_records must be in [0, {n - 1}], got {k}")
    body_n = n - k
    # Knot j represents sorted record j at the centre of its probability cell (j + 0.5) / n;
    # the two ends pin the table to the body's minimum and maximum.
    uniform = np.linspace(0, body_n - 1, body_quantiles)
    tail = body_n - np.logspace(np.log10(body_n * 0.1), 0, DEFAULT_TAIL_KNOTS)
    idx = np.unique(np.clip(np.round(np.concatenate([uniform, tail])), 0, body_n - 1))
    idx = idx.astype(np.int64)
    probs = (idx + 0.5) / n
    probs = np.concatenate([[0.0], probs, [body_n / n]])
    qs = np.concatenate([[values[0]], values[idx], [values[body_n - 1]]]).astype(np.float64)
    stats = compute_stats(values)
    return Profile(
        name=name,
        kind="empirical",
        description=description,
        provenance=provenance,
        licence=licence,
        n_source=n,
        probabilities=probs,
        quantile_lengths=qs,
        top_records=values[body_n:].copy(),
        top_record_mass=1.0 / n,
        default_truncation=default_truncation,
        truncation_note=truncation_note,
        source_stats=_stats_summary(stats),
    )


def _stats_summary(stats) -> dict:
    return {
        "count": stats.count,
        "mean": round(stats.mean, 2),
        "median": stats.median,
        "p90": stats.p90,
        "p99": stats.p99,
        "p99_9": stats.p99_9,
        "max": stats.max,
        "token_share_top1pct": round(stats.token_share_top1pct, 3),
        "attn_share_top1pct": round(stats.attn_share_top1pct, 3),
    }
