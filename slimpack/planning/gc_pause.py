"""Pause Python's cyclic garbage collector around allocation-heavy planning work.

A paper-scale plan allocates ~10^5-10^6 small objects (segments, slices, units, ops, heap
entries) that stay alive until the plan is returned. Each 700 allocations trigger a
young-generation collection, and every tenth of those an older one that walks the live
objects again: measured, about a fifth of the SlimPack planner's time on a 134M-token batch.
These objects form no reference cycles, so nothing is lost by collecting them later.

On leaving the block, everything it left alive sits in the youngest generation, and the first
allocation after re-enabling the collector would scan all of it at once (about 0.1 s after a
134M-token plan). Those survivors are the plan: long-lived by design. They are moved straight
to the oldest generation instead (``gc.freeze`` then ``gc.unfreeze``: two list splices), where
the collector's next full collection will see them, as it would have after promoting them.
This is skipped when the process has frozen objects of its own (``gc.get_freeze_count``):
unfreezing would hand those back to the collector.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block (nesting-safe: the outermost block that
    found it enabled turns it back on, after moving the block's survivors to the oldest
    generation)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
