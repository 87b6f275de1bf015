"""gc_paused: the collector is off inside, back on after, and nothing is leaked or unfrozen."""

from __future__ import annotations

import gc
import weakref

from slimpack.planning.gc_pause import gc_paused


class _Node:
    def __init__(self) -> None:
        self.other = self


def _cycle() -> weakref.ref:
    return weakref.ref(_Node())  # a self-referencing object: only the collector frees it


def test_collector_is_off_inside_and_on_after():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner block leaves it off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_cycle_made_inside_is_still_collected_after():
    with gc_paused():
        dead = _cycle()  # garbage left for the collector when the block ends
        alive = _Node()
        kept = weakref.ref(alive)
        del alive.other  # no cycle: refcounting frees it when the name goes
    assert gc.get_freeze_count() == 0  # nothing left in the permanent generation
    gc.collect()
    assert dead() is None
    assert kept() is not None  # a live object stays alive


def test_survivors_go_to_the_oldest_generation_unscanned():
    """The block's survivors skip the young generations (whose scan would otherwise run on
    the first allocation after the block, over all of them)."""
    with gc_paused():
        keep = [[i] for i in range(50_000)]
    oldest = gc.get_objects(generation=2)
    assert any(obj is keep for obj in oldest)
    assert len(keep) == 50_000


def test_objects_the_process_froze_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            [[i] for i in range(1000)]
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()
