"""Turning lists of micro-batches into IR groups and plans (shared by every baseline)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slimpack.plan import Group, Segment, Slice, Unit
from slimpack.specs import ParallelSpec


def schedule_for(parallel: ParallelSpec) -> str:
    """Megatron-LM's pipeline schedule for these degrees: interleaved 1F1B when vpp > 1."""
    return "interleaved" if parallel.vpp > 1 else "1f1b"


MicroBatch = Sequence[Segment]
"""Segments run together in one pipeline step (one packed buffer)."""


@dataclass(frozen=True, kw_only=True)
class GroupLayout:
    """Degrees and settings every micro-batch of a group shares."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int = 1
    schedule: str = "1f1b"
    cp_sharding: str = "per-sequence"
    cp_kind: str = "ring"
    recompute: str = "none"
    recompute_layers: int | None = None
    virtual_stage_layers: tuple[int, ...] | None = None
    vocab_parallel_pp: bool = False
    offload: float = 0.0


def packed_group(group_id: int, ranks: tuple[int, ...], layout: GroupLayout,
                 microbatches: Sequence[MicroBatch]) -> Group:
    """One slice per micro-batch (a varlen pack), one unit per slice, same order both ways.

    This is the classic layout: forward and backward units are identical, and each unit is a
    whole micro-batch, so the causal order rules hold as long as no sequence appears in two
    micro-batches.
    """
    slices = tuple(Slice(slice_id=i, segments=tuple(mb)) for i, mb in enumerate(microbatches))
    units = tuple(Unit(slice_ids=(s.slice_id,)) for s in slices)
    return _group(group_id, ranks, layout, slices, units, units)


def sliced_group(group_id: int, ranks: tuple[int, ...], layout: GroupLayout,
                 microbatches: Sequence[Sequence[MicroBatch]]) -> Group:
    """Each micro-batch is a list of slices run as separate pipeline steps (SlimPipe).

    Forward units run a micro-batch's slices in order; backward units run them in reverse,
    because a slice's backward needs dK/dV from every later slice of its sequence.
    """
    slices: list[Slice] = []
    forward: list[Unit] = []
    backward: list[Unit] = []
    for mb in microbatches:
        ids = []
        for segs in mb:
            sl = Slice(slice_id=len(slices), segments=tuple(segs))
            slices.append(sl)
            ids.append(sl.slice_id)
        forward.extend(Unit(slice_ids=(i,)) for i in ids)
        backward.extend(Unit(slice_ids=(i,)) for i in reversed(ids))
    return _group(group_id, ranks, layout, tuple(slices), tuple(forward), tuple(backward))


def _group(group_id: int, ranks: tuple[int, ...], layout: GroupLayout, slices: tuple[Slice, ...],
           forward: tuple[Unit, ...], backward: tuple[Unit, ...]) -> Group:
    return Group(
        group_id=group_id, ranks=ranks, tp=layout.tp, cp=layout.cp, pp=layout.pp,
        vpp=layout.vpp, slices=slices, forward_units=forward, backward_units=backward,
        schedule=layout.schedule, cp_sharding=layout.cp_sharding, cp_kind=layout.cp_kind,
        recompute=layout.recompute, recompute_layers=layout.recompute_layers,
        virtual_stage_layers=layout.virtual_stage_layers,
        vocab_parallel_pp=layout.vocab_parallel_pp, offload=layout.offload,
    )


def whole(seq_id: int, length: int) -> Segment:
    return Segment(seq_id=seq_id, start=0, end=length)
