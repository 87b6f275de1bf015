"""A small Nelder-Mead minimiser (numpy only; SciPy is not a dependency of the suite)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def nelder_mead(
    objective: Callable[[np.ndarray], float],
    start: np.ndarray,
    *,
    step: float = 0.5,
    max_iterations: int = 4000,
    tolerance: float = 1e-12,
) -> np.ndarray:
    """Minimise ``objective`` from ``start`` with the standard reflect/expand/contract/shrink."""
    dim = start.size
    simplex = np.vstack([start] + [start + step * np.eye(dim)[i] for i in range(dim)])
    values = np.array([objective(x) for x in simplex])
    for _ in range(max_iterations):
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < tolerance:
            break
        centroid = simplex[:-1].mean(axis=0)
        reflected = centroid + (centroid - simplex[-1])
        f_reflected = objective(reflected)
        if f_reflected < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            f_expanded = objective(expanded)
            if f_expanded < f_reflected:
                simplex[-1], values[-1] = expanded, f_expanded
            else:
                simplex[-1], values[-1] = reflected, f_reflected
        elif f_reflected < values[-2]:
            simplex[-1], values[-1] = reflected, f_reflected
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            f_contracted = objective(contracted)
            if f_contracted < values[-1]:
                simplex[-1], values[-1] = contracted, f_contracted
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [objective(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]
