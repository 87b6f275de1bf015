"""The forward and backward op orders every stage of a group shares.

All stages run forwards in one order and backwards in one order; only how the two are
interleaved (the warm-up) differs between stages. Keeping the orders identical across stages
is what makes every F and B arrive in the order its receiver expects it.

With virtual stages (vpp > 1) the orders are chunk-major within *groups* of units, as in
Megatron-LM's interleaved 1F1B: a group's units all pass chunk 0, then chunk 1, ... Groups
hold at least ``pp`` units, so by the time chunk 0 of stage 0 needs a group's first unit again
at chunk 1, the last stage has already produced it. Groups never split a sequence (a *run* of
units connected by shared sequences stays whole), which is how SlimPipe's "all slices of a
sequence per chunk" order falls out: each sequence is a run of n slice units.

Nor do groups split a stretch of units whose backwards the plan orders other than their
forwards: a run ends only where every backward unit holding a slice of an earlier forward
unit precedes every one holding a slice of a later unit. SlimPack backwards a round of
MicroPacks as one block (in reverse, or re-dealt); a group boundary inside a round would put
the later group's backwards before the earlier group's, and the interleaved rule then
deadlocks at the next smaller group (stage 0 runs a chunk-c+1 forward of a group whose
chunk-c forward the last stage holds back behind a backward that waits on stage 0). The
deadlock repair's longer warm-up then held ~all forwards in flight.
"""

from __future__ import annotations

import numpy as np

from slimpack.plan import Group, Unit
from slimpack.schedules.ops import Op


def unit_sequences(group: Group, units: tuple[Unit, ...]) -> list[frozenset[int]]:
    return [frozenset(seg.seq_id for sid in u.slice_ids for seg in group.slice(sid).segments)
            for u in units]


def sequence_runs(group: Group) -> list[list[int]]:
    """Maximal runs of consecutive forward units that share no sequence with other runs and
    whose backwards all precede those of every later run (module docstring)."""
    seqs = unit_sequences(group, group.forward_units)
    last_unit: dict[int, int] = {}
    for i, ss in enumerate(seqs):
        for s in ss:
            last_unit[s] = i
    closes = _backward_closes(group)
    runs: list[list[int]] = []
    current: list[int] = []
    reach = -1
    for i, ss in enumerate(seqs):
        current.append(i)
        for s in ss:
            reach = max(reach, last_unit[s])
        if reach <= i and closes[i]:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _backward_closes(group: Group) -> list[bool]:
    """For each forward unit i: whether every backward unit holding a slice of forward units
    0..i comes before every backward unit holding a slice of a unit after i."""
    nf = len(group.forward_units)
    unit_of_slice = {sid: u for u, unit in enumerate(group.forward_units)
                     for sid in unit.slice_ids}
    first_b = [len(group.backward_units)] * nf
    last_b = [-1] * nf
    for b, unit in enumerate(group.backward_units):
        for sid in unit.slice_ids:
            u = unit_of_slice[sid]
            if b < first_b[u]:
                first_b[u] = b
            if b > last_b[u]:
                last_b[u] = b
    # first_after[u]: the earliest backward holding a slice of any forward unit after u.
    first_after = [len(group.backward_units)] * nf
    for u in range(nf - 2, -1, -1):
        first_after[u] = min(first_after[u + 1], first_b[u + 1])
    closes = []
    latest = -1
    for u in range(nf):
        latest = max(latest, last_b[u])
        closes.append(latest < first_after[u])
    return closes


def forward_groups(group: Group, min_size: int) -> list[list[int]]:
    """Consecutive runs merged until each group holds at least ``min_size`` units.

    A short tail joins the group before it: a group smaller than ``pp`` would make stage 0
    wait, at chunk c+1, for the last stage that is still busy with backwards (a deadlock).
    """
    groups: list[list[int]] = []
    current: list[int] = []
    for run in sequence_runs(group):
        current.extend(run)
        if len(current) >= min_size:
            groups.append(current)
            current = []
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def forward_order(group: Group, groups: list[list[int]] | None = None) -> list[Op]:
    """Forward ops in execution order, identical on every stage (``groups``: the group's
    :func:`forward_groups` at ``min_size = pp``, when the caller holds them already)."""
    return _ops("F", *forward_order_arrays(group, groups))


def forward_order_arrays(group: Group, groups: list[list[int]] | None = None,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(unit, chunk) of each op of :func:`forward_order`, as arrays (what the schedule
    builder reads: it makes no op objects)."""
    v = group.vpp
    if v == 1:
        nf = len(group.forward_units)
        return np.arange(nf, dtype=np.int64), np.zeros(nf, dtype=np.int64)
    units, chunks = [], []
    for members in groups if groups is not None else forward_groups(group, group.pp):
        # A group's units pass chunk 0, then chunk 1, ...
        units.append(np.tile(np.asarray(members, dtype=np.int64), v))
        chunks.append(np.repeat(np.arange(v, dtype=np.int64), len(members)))
    return _joined(units), _joined(chunks)


def backward_order(group: Group, groups: list[list[int]] | None = None) -> list[Op]:
    """Backward ops in execution order, identical on every stage (``groups`` as for
    :func:`forward_order`).

    Backward units run in the plan's order (which ``Plan.validate`` has checked backwards
    every sequence in reverse slice order). With vpp > 1 each backward unit belongs to the
    latest forward group holding one of its slices; consecutive backward units of one forward
    group run chunk-major from the last chunk down, mirroring the forward order.
    """
    return _ops("B", *backward_order_arrays(group, groups))


def backward_order_arrays(group: Group, groups: list[list[int]] | None = None,
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(unit, chunk) of each op of :func:`backward_order`, as arrays."""
    v = group.vpp
    nb = len(group.backward_units)
    if v == 1:
        return np.arange(nb, dtype=np.int64), np.zeros(nb, dtype=np.int64)
    owner_of_slice: dict[int, int] = {}
    for g, members in enumerate(groups if groups is not None else forward_groups(group,
                                                                                 group.pp)):
        for u in members:
            for sid in group.forward_units[u].slice_ids:
                owner_of_slice[sid] = g
    owners = [max(owner_of_slice[sid] for sid in bu.slice_ids) for bu in group.backward_units]
    units, chunks = [], []
    start = 0
    while start < nb:
        end = start
        while end < nb and owners[end] == owners[start]:
            end += 1
        # The run's units on the last chunk, then the one before, ...
        units.append(np.tile(np.arange(start, end, dtype=np.int64), v))
        chunks.append(np.repeat(np.arange(v - 1, -1, -1, dtype=np.int64), end - start))
        start = end
    return _joined(units), _joined(chunks)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _ops(kind: str, unit: np.ndarray, chunk: np.ndarray) -> list[Op]:
    return [Op(kind, u, c) for u, c in zip(unit.tolist(), chunk.tolist(), strict=True)]
