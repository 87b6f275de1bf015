"""Summary statistics of a length distribution, in the shape of shared/summary_stats.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# Bins are (lo, hi] with powers of two as edges and everything <= 128 in the first bin,
# the convention of shared/length_distributions/summary_stats.json (verified against it).
FIRST_BIN_EDGE = 128
TOP_FRACTION = 0.01


@dataclass(frozen=True, kw_only=True)
class HistogramBin:
    lo: int
    hi: int
    pct_docs: float
    pct_tokens: float


@dataclass(frozen=True, kw_only=True)
class LengthStats:
    count: int
    total_tokens: int
    mean: float
    std: float
    min: int
    median: float
    p90: float
    p99: float
    p99_9: float
    max: int
    token_share_top1pct: float
    """Percent of all tokens in the longest 1% of documents."""
    attn_share_top1pct: float
    """Percent of attention work (sum of L^2) in the longest 1% of documents."""
    log2_hist: tuple[HistogramBin, ...]
    """Non-empty bins only."""

    def to_dict(self) -> dict:
        return asdict(self)


def compute_stats(lengths: np.ndarray) -> LengthStats:
    """Statistics of positive integer lengths; percentiles use numpy's linear interpolation."""
    values = np.sort(np.asarray(lengths, dtype=np.int64))
    if values.size == 0:
        raise ValueError("cannot compute statistics of an empty set of lengths")
    as_float = values.astype(np.float64)
    total = float(as_float.sum())
    squares = as_float * as_float
    top_count = max(1, int(round(values.size * TOP_FRACTION)))
    median, p90, p99, p99_9 = np.percentile(values, [50, 90, 99, 99.9])
    return LengthStats(
        count=int(values.size),
        total_tokens=int(values.sum()),
        mean=total / values.size,
        std=float(as_float.std()),
        min=int(values[0]),
        median=float(median),
        p90=float(p90),
        p99=float(p99),
        p99_9=float(p99_9),
        max=int(values[-1]),
        token_share_top1pct=100.0 * float(as_float[-top_count:].sum()) / total,
        attn_share_top1pct=100.0 * float(squares[-top_count:].sum()) / float(squares.sum()),
        log2_hist=log2_histogram(values),
    )


def log2_histogram(lengths: np.ndarray) -> tuple[HistogramBin, ...]:
    values = np.asarray(lengths, dtype=np.int64)
    top = max(int(values.max()), FIRST_BIN_EDGE)
    edges = [FIRST_BIN_EDGE]
    while edges[-1] < top:
        edges.append(edges[-1] * 2)
    # side="left": a length equal to an edge belongs to the bin that edge closes.
    bin_index = np.searchsorted(np.array(edges), values, side="left")
    docs = np.bincount(bin_index, minlength=len(edges))
    tokens = np.bincount(bin_index, weights=values.astype(np.float64), minlength=len(edges))
    lows = [0, *edges[:-1]]
    total_tokens = tokens.sum()
    return tuple(
        HistogramBin(
            lo=lows[i],
            hi=edges[i],
            pct_docs=100.0 * docs[i] / values.size,
            pct_tokens=100.0 * tokens[i] / total_tokens,
        )
        for i in range(len(edges))
        if docs[i]
    )


def format_stats(stats: LengthStats, *, source: str, method: str) -> str:
    """Human-readable report for ``slimpack data stats``."""
    lines = [
        f"source: {source}",
        f"lengths: {method}",
        f"count {stats.count:,}   tokens {stats.total_tokens:,}",
        f"mean {stats.mean:,.1f}   std {stats.std:,.1f}   min {stats.min:,}   max {stats.max:,}",
        f"median {stats.median:,.0f}   p90 {stats.p90:,.0f}   p99 {stats.p99:,.0f}   "
        f"p99.9 {stats.p99_9:,.0f}",
        f"top 1% longest documents: {stats.token_share_top1pct:.1f}% of tokens, "
        f"{stats.attn_share_top1pct:.1f}% of attention work (sum L^2)",
        "",
        f"{'length bin':>23}  {'% docs':>8}  {'% tokens':>8}",
    ]
    for b in stats.log2_hist:
        lines.append(f"{f'({b.lo:,}, {b.hi:,}]':>23}  {b.pct_docs:8.3f}  {b.pct_tokens:8.2f}")
    return "\n".join(lines)
