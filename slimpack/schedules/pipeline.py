"""Schedule builders: a plan group -> one ordered op list per pipeline stage.

Every kind is the same construction with different warm-up lengths. All stages share one
forward order and one backward order (:mod:`slimpack.schedules.orders`); stage ``r`` runs
``count_r(j)`` forwards before its ``j``-th backward, where

    count_r(j) = min(total F, max(warmup_r + j, need(j), count_r(j-1)))

``need(j)`` is one past the position, in the forward order, of the last forward op the
``j``-th backward transitively needs on this stage: F of each of its slices on *every*
chunk (its gradient comes back through all later virtual stages). So a backward unit never
waits for a forward its own stage has not scheduled yet, whatever the unit partitions.

Warm-up (``warmup_r = need(0) + offset_r``), rank ``r`` of ``p``:

* ``gpipe``: all forwards, then all backwards.
* ``1f1b``: ``offset = p-1-r``, so rank r holds ``p - r`` micro-batches (Megatron-LM).
* ``interleaved``: ``offset = 2(p-1-r)``; with ``need(0) = (v-1)p + 1`` this is Megatron's
  ``2(p-1-r) + (v-1)p + 1`` chunk-micro-batches in flight.
* ``slimpipe``: ``offset = 2(p-1-r)``; the first backward is the *last* slice of the first
  sequence on the last chunk, so ``need(0) = n*v`` and rank r runs ``n*v + 2(p-1-r)``
  slice-chunks before its first backward (SlimPipe's rule).
* ``asymmetric`` (forward units != backward units): same as slimpipe. The first backward unit
  on the last stage may only start once every slice in it has been forwarded there, which
  ``need`` guarantees, and the shared backward order keeps the reverse-slice rule per
  sequence. The ``2(p-1-r)`` offset keeps rank r busy with forwards while the first gradient
  travels down and back up the pipeline (bubble-light, at SlimPipe's memory cost).

The result is checked for deadlock with :func:`progress`; for unusual asymmetric
partitions with virtual stages where the rule above is not enough, the stuck stages' warm-up
is doubled until it runs (GPipe, all forwards first, always does).
"""

from __future__ import annotations

import numpy as np

from slimpack.plan import Group
from slimpack.schedules.ops import OpArrays, OpList
from slimpack.schedules.orders import (
    backward_order_arrays,
    forward_groups,
    forward_order_arrays,
)
from slimpack.schedules.validate import ScheduleError, describe_stuck, progress, walk_op_arrays

MAX_REPAIRS = 64


def build_schedule(group: Group) -> list[OpList]:
    """One ordered op list per pipeline stage, for ``group.schedule``.

    Raises ScheduleError for a kind that cannot run this group (e.g. ``1f1b`` with vpp > 1).
    """
    kind = group.schedule
    p, v = group.pp, group.vpp
    if kind == "1f1b" and v > 1:
        raise ScheduleError(f"Group {group.group_id}: schedule '1f1b' needs vpp = 1, got {v}; "
                            f"use 'interleaved'")
    groups = forward_groups(group, p) if v > 1 else None
    # The orders as arrays: the lists are made of them (OpList), no op object is needed.
    f_unit, f_chunk = forward_order_arrays(group, groups)
    b_unit, b_chunk = backward_order_arrays(group, groups)
    codes = _OpCodes(f_unit, f_chunk, b_unit, b_chunk, v)
    nf = len(f_unit)
    if v == 1:
        # Without virtual stages these lists cannot deadlock, so the O(ops) check is
        # skipped (planners build ~10^5-op schedules per candidate). Stage r runs c_r(j)
        # forwards before B_j with c_r(j) >= c_{r+1}(j) (its offset is no smaller). A
        # stage stuck at F_i waits on stage r-1, whose ops before F_i are forwards and
        # backwards stage r has already passed, so r-1 can only be stuck at an earlier
        # forward, and so on down to stage 0, whose forwards need nothing: no stage is
        # stuck at a forward. A stage stuck at B_j waits on stage r+1; the highest such
        # stage waits on one that is stuck nowhere, so has finished: none is stuck.
        return [OpList(codes.arrays(_stage_order(nf, counts)))
                for counts in stage_forward_counts(group)]
    needs = _backward_needs(group, f_unit, b_unit)
    extra = [0] * p
    for _ in range(MAX_REPAIRS):
        orders = [_stage_order(nf, forward_counts(
                      needs, warmup_offset(kind, p, v, r) + extra[r], nf, kind == "gpipe"))
                  for r in range(p)]
        pos = codes.progress(orders)
        stuck_stages = [r for r in range(p) if pos[r] < len(orders[r])]
        if not stuck_stages:
            return [OpList(codes.arrays(order)) for order in orders]
        for r in stuck_stages:
            extra[r] = max(1, 2 * extra[r])
        # A stage may not hold fewer forwards than the one after it (the 1F1B invariant).
        for r in range(p - 2, -1, -1):
            extra[r] = max(extra[r], extra[r + 1])
    ops = [OpList(codes.arrays(order)) for order in orders]
    pos = progress(group, ops)
    raise ScheduleError(f"Group {group.group_id}: no deadlock-free {kind} schedule found; "
                        f"{describe_stuck(ops, pos, p)}")


def stage_forward_counts(group: Group) -> list[np.ndarray]:
    """For a group without virtual stages (``vpp`` 1), per stage: how many forwards it runs
    before each of its backwards, ``count_r(j)`` of the module docstring. This is the whole
    schedule (forward unit i precedes backward j exactly when i < count_r(j)); a memory walk
    needs nothing more, so planners read peaks from it without building ops."""
    if group.vpp != 1:
        raise ValueError(f"stage_forward_counts needs vpp = 1, got vpp = {group.vpp}")
    nf = len(group.forward_units)
    unit_of_slice: dict[int, int] = {}
    for u, unit in enumerate(group.forward_units):
        for sid in unit.slice_ids:
            unit_of_slice[sid] = u
    # Without chunks the forward order is the unit order, and backward j is unit j.
    needs = np.asarray(_unit_needs(group, unit_of_slice), dtype=np.int64)
    kind, p = group.schedule, group.pp
    return [forward_counts(needs, warmup_offset(kind, p, 1, r), nf, kind == "gpipe")
            for r in range(p)]


def forward_counts(needs: list[int] | np.ndarray, offset: int, total: int,
                   all_forwards_first: bool) -> np.ndarray:
    """``count(j)`` for each backward j: ``min(total, max(warmup + j, needs[j], count(j-1)))``
    with ``warmup = needs[0] + offset``, i.e. the running maximum of
    ``max(warmup + j, needs[j])`` capped at ``total``; ``total`` throughout for GPipe."""
    need = np.asarray(needs, dtype=np.int64)
    if all_forwards_first or not len(need):
        return np.full(len(need), total, dtype=np.int64)
    warmup = int(need[0]) + offset
    counts = np.maximum.accumulate(np.maximum(np.arange(warmup, warmup + len(need)), need))
    return np.minimum(counts, total)


def warmup_offset(kind: str, p: int, v: int, rank: int) -> int:
    """Forwards stage ``rank`` runs ahead of its first backward's own need (module docstring)."""
    if kind == "1f1b" or (kind == "interleaved" and v == 1):
        return p - 1 - rank
    return 2 * (p - 1 - rank)


def _backward_needs(group: Group, f_unit: np.ndarray, b_unit: np.ndarray) -> np.ndarray:
    """For each backward op (``b_unit``, in order): forwards that must precede it on a stage
    (all chunks), given the forward order's units ``f_unit``."""
    # A unit's last position in the forward order (its last chunk: chunks run in increasing
    # order), then each of its slices'.
    last_pos = np.full(len(group.forward_units), -1, dtype=np.int64)
    np.maximum.at(last_pos, f_unit, np.arange(len(f_unit), dtype=np.int64))
    last_pos_of_slice = {sid: pos for unit, pos in zip(group.forward_units, last_pos.tolist(),
                                                       strict=True)
                         for sid in unit.slice_ids}
    return np.asarray(_unit_needs(group, last_pos_of_slice), dtype=np.int64)[b_unit]


def _unit_needs(group: Group, last_pos_of_slice: dict[int, int]) -> list[int]:
    """Per backward unit: one past the last forward position (``last_pos_of_slice``) of any
    of its slices, i.e. how many forwards must run before it on a stage."""
    return [1 + max(map(last_pos_of_slice.__getitem__, unit.slice_ids))
            for unit in group.backward_units]


def _stage_order(num_forwards: int, counts: np.ndarray) -> np.ndarray:
    """One stage's interleaving as indices into ``fwd + bwd``: forward ``i`` sorts at ``2i + 1``,
    backward ``j`` at ``2 counts[j]`` (after the forwards it follows, before the next one);
    a stable sort keeps the backwards in order."""
    place = np.concatenate([np.arange(num_forwards, dtype=np.int64) * 2 + 1,
                            np.asarray(counts, dtype=np.int64) * 2])
    return np.argsort(place, kind="stable")


class _OpCodes:
    """The fields of the forward order followed by the backward order, as arrays: an order
    of indices into them is one stage's op list (:class:`OpList` of :meth:`arrays`), and the
    repair loop's deadlock check walks it (:func:`slimpack.schedules.validate.walk_op_arrays`,
    the walk of :func:`progress`) without building anything else."""

    def __init__(self, f_unit: np.ndarray, f_chunk: np.ndarray, b_unit: np.ndarray,
                 b_chunk: np.ndarray, vpp: int) -> None:
        self.unit = np.concatenate([f_unit, b_unit])
        self.chunk = np.concatenate([f_chunk, b_chunk])
        self.is_backward = np.zeros(len(self.unit), dtype=bool)
        self.is_backward[len(f_unit):] = True
        self.vpp = vpp

    def arrays(self, order: np.ndarray) -> OpArrays:
        """(is forward, unit, chunk) of the ops of one stage's order."""
        return ~self.is_backward[order], self.unit[order], self.chunk[order]

    def progress(self, orders: list[np.ndarray]) -> list[int]:
        """How many ops of each stage's order can run (the lists of :func:`progress`)."""
        ran, _, _ = walk_op_arrays([self.arrays(order) for order in orders], pp=len(orders),
                                   vpp=self.vpp)
        return ran.tolist()
