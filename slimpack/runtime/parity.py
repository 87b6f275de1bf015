"""How far a run's loss and gradients are from the unsliced single-process reference.

The issue's bounds (fp32 on CPU): loss within 1e-6 relative, every parameter gradient within
1e-5 norm-relative (max over parameters). Sharded parameters are compared whole: the executor
gathers tensor-parallel shards before returning gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

LOSS_REL_TOL = 1e-6
GRAD_REL_TOL = 1e-5


@dataclass(frozen=True, kw_only=True)
class Parity:
    loss_rel: float
    max_grad_rel: float
    """Max over parameters of ||g - g_ref|| / ||g_ref||."""
    worst: str
    """The parameter with the largest error."""
    missing: tuple[str, ...]
    """Reference parameters the run returned no gradient for (or extra ones)."""

    @property
    def ok(self) -> bool:
        return (not self.missing and self.loss_rel <= LOSS_REL_TOL
                and self.max_grad_rel <= GRAD_REL_TOL)

    def describe(self) -> str:
        return (f"loss rel {self.loss_rel:.1e}, max grad rel {self.max_grad_rel:.1e} "
                f"({self.worst}), missing {list(self.missing)}")


def parity(loss: float, grads: Mapping[str, torch.Tensor], ref_loss: float,
           ref_grads: Mapping[str, torch.Tensor]) -> Parity:
    missing = tuple(sorted(set(ref_grads) ^ set(grads)))
    errors = {name: float((grads[name].float() - want).norm() / want.norm())
              for name, want in ref_grads.items() if name in grads}
    worst = max(errors, key=errors.get) if errors else ""
    return Parity(loss_rel=abs(loss - ref_loss) / abs(ref_loss),
                  max_grad_rel=errors.get(worst, float("inf")), worst=worst, missing=missing)
