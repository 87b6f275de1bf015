"""Activation recompute modes: the one list every planner, the cost model and the IR share.

* ``none``: every activation a layer's backward needs is kept.
* ``selective``: the cheap-to-recompute, memory-heavy part of each layer is dropped and
  recomputed in backward (Korthikanti et al. 2022, arXiv 2205.05198, section 4.2).
* ``full``: only each layer's input is kept; the whole layer forward runs again in backward.

Listed cheapest first: Megatron-LM users turn on selective, then full, only when memory
forces them to, and planners that choose "when memory forces it" walk this order.
"""

from __future__ import annotations

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
"""Cheapest (most memory) first."""

AUTO = "auto"
"""Planner option value: the cheapest mode that fits memory."""


def recompute_layers_problem(recompute_layers: object, recompute: str) -> str | None:
    """What is wrong with a ``recompute_layers`` count (full recompute of only the first
    this many layers of each model chunk, Megatron-Core's block method) beside ``recompute``,
    or None: it must be None or an integer >= 1, and only with ``full``."""
    if recompute_layers is None:
        return None
    if isinstance(recompute_layers, bool) or not isinstance(recompute_layers, int) \
            or recompute_layers < 1:
        return f"recompute_layers must be an integer >= 1 or null, got {recompute_layers!r}"
    if recompute != "full":
        return (f"recompute_layers needs recompute='full' (the layers it names are fully "
                f"recomputed), got recompute={recompute!r}")
    return None


def check_recompute(owner: str, value: str, *, allow_auto: bool = False) -> str:
    """``value`` if it names a mode (or ``auto`` where allowed); ValueError naming ``owner``."""
    allowed = ((AUTO,) if allow_auto else ()) + RECOMPUTE_MODES
    if value not in allowed:
        raise ValueError(f"{owner}: recompute must be one of {', '.join(allowed)}; got {value!r}")
    return value
