"""Exact moments of a profile's inverse CDF (piecewise log-linear body + point-mass records).

Used to report what a parametric profile achieves against the facts it was fitted to, with no
sampling noise: on a knot interval Q(u) = q0 * exp(b (u - p0)), whose integral is closed-form.
"""

from __future__ import annotations

import numpy as np

from slimpack.data.profile import Profile


def _segments(profile: Profile) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    p = profile.probabilities
    q = profile.quantile_lengths.astype(np.float64)
    width = np.diff(p)
    log_ratio = np.log(q[1:] / q[:-1])
    rate = log_ratio / width
    flat = log_ratio == 0
    # Segment integrals of q0 * exp(rate * (u - p0)).
    safe_rate = np.where(flat, 1.0, rate)
    integral = np.where(flat, q[:-1] * width, (q[1:] - q[:-1]) / safe_rate)
    return p, q, rate, integral


def share_at_least(profile: Profile, threshold: float) -> tuple[float, float]:
    """(fraction of documents, fraction of tokens) in documents of length >= threshold."""
    p, q, rate, integral = _segments(profile)
    total = float(integral.sum() + profile.top_records.sum() * profile.top_record_mass)
    top = profile.top_records[profile.top_records >= threshold]
    docs = top.size * profile.top_record_mass
    tokens = float(top.sum()) * profile.top_record_mass
    if threshold <= q[0]:
        return profile.body_mass + docs, (float(integral.sum()) + tokens) / total
    if threshold > q[-1]:
        return docs, tokens / total
    j = int(np.searchsorted(q, threshold, side="left")) - 1  # q[j] < threshold <= q[j+1]
    u_cross = p[j] + np.log(threshold / q[j]) / rate[j]
    partial = (q[j + 1] - threshold) / rate[j]
    docs += profile.body_mass - u_cross
    tokens += partial + float(integral[j + 1 :].sum())
    return float(docs), tokens / total


def quantile_at(profile: Profile, probability: float) -> float:
    return float(profile.quantile(np.array([probability]))[0])
