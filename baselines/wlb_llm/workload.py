"""WLB-LLM's per-document workload ``W(d) = W_a(d) + W_l(d)`` (arXiv 2503.17924, section 4.1):
quadratic attention plus everything linear in the token count, in seconds of one layer's
forward, fitted to the shared cost model so the packer and the simulator agree."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimpack.cost.model import CostModel

FIT_LENGTHS = (8192, 32768, 131072)
"""Long enough that kernels are saturated: the fit is the asymptotic a*l^2 + b*l (+ c)."""


@dataclass(frozen=True, kw_only=True)
class Workload:
    attention_s_per_token2: float
    """W_a(d) = attention_s_per_token2 * len^2."""
    linear_s_per_token: float
    """W_l(d) = linear_s_per_token * len."""

    def __call__(self, length: int | float) -> float:
        return self.attention_s_per_token2 * length * length + self.linear_s_per_token * length

    def of_lengths(self, lengths: np.ndarray) -> np.ndarray:
        """``self(n)`` for every entry of an integer array: the same float64 operations in
        the same order, so the same bits as calling it per document."""
        return self.attention_s_per_token2 * lengths * lengths + self.linear_s_per_token * lengths


def fit_workload(cost: CostModel, *, tp: int = 1, cp: int = 1) -> Workload:
    """Fit ``a*l^2 + b*l + c`` to one layer's forward time of a whole document on one CP rank
    (1/cp of the work), dropping the constant (kernel launches are paid once per micro-batch,
    not per document)."""
    xs = np.array(FIT_LENGTHS, dtype=float)
    ys = np.array([cost.layer_times([(int(n), 0)], tp=tp).forward_s for n in FIT_LENGTHS])
    a, b, _ = np.linalg.solve(np.vstack([xs**2, xs, np.ones_like(xs)]).T, ys)
    return Workload(attention_s_per_token2=max(float(a), 0.0) / cp,
                    linear_s_per_token=max(float(b), 0.0) / cp)
