"""Plans in Megatron-core's packed (THD) contract: one ``PackedSeqParams`` per MicroPack.

A Megatron-LM user keeps Megatron's model and schedules and takes from a suite planner what
to put in each micro-batch: the token rows of every segment (sequence, ``[start, end)``), in
slice order, and the varlen attention metadata Megatron's attention reads. A segment of a
sliced sequence attends to its KV prefix ``[0, start)`` and its own tokens, so its key length
is ``end``; ``cu_seqlens_kv`` therefore differs from ``cu_seqlens_q`` exactly for the slices
that continue a sequence (whole documents have equal q and kv lengths). Supplying that KV
prefix is the trainer's job: the suite's runtime caches it per slice (``slimpack.runtime``);
stock Megatron supports packed *whole* documents, i.e. plans whose segments all start at 0.

Megatron-core is an optional dependency (the ``gpu`` extra, and ``dev`` for the tests):
:func:`to_packed_seq_params` imports it lazily.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slimpack.plan import Group, Plan, PlanError, Unit


@dataclass(frozen=True, kw_only=True)
class PackedMicroBatch:
    """One MicroPack (forward or backward unit) laid out as Megatron's THD packed batch."""

    group_id: int
    unit_index: int
    seq_ids: tuple[int, ...]
    """Per segment, in row order: the sequence its rows come from ..."""
    starts: tuple[int, ...]
    """... the first token of the segment (its KV prefix length) ..."""
    ends: tuple[int, ...]
    """... and one past its last token."""
    cu_seqlens_q: torch.Tensor
    """int32 ``[num_segments + 1]``: row offsets of the segments."""
    cu_seqlens_kv: torch.Tensor
    """int32 ``[num_segments + 1]``: cumulative key lengths (prefix + own tokens)."""
    max_seqlen_q: int
    max_seqlen_kv: int
    position_ids: torch.Tensor
    """int64 ``[rows]``: absolute positions within each sequence (RoPE), start..end-1."""

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens_q[-1])

    @property
    def has_kv_prefix(self) -> bool:
        return any(s > 0 for s in self.starts)


def packed_micro_batch(group: Group, unit: Unit, *, unit_index: int = 0) -> PackedMicroBatch:
    """The THD layout of one unit of ``group`` (its slices in order, segments in order)."""
    seq_ids, starts, ends = [], [], []
    for sl in group.unit_slices(unit):
        for seg in sl.segments:
            seq_ids.append(seg.seq_id)
            starts.append(seg.start)
            ends.append(seg.end)
    q_lens = torch.tensor([e - s for s, e in zip(starts, ends, strict=True)], dtype=torch.int32)
    kv_lens = torch.tensor(ends, dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32)
    positions = torch.cat([torch.arange(s, e, dtype=torch.int64)
                           for s, e in zip(starts, ends, strict=True)])
    return PackedMicroBatch(
        group_id=group.group_id, unit_index=unit_index, seq_ids=tuple(seq_ids),
        starts=tuple(starts), ends=tuple(ends),
        cu_seqlens_q=torch.cat([zero, torch.cumsum(q_lens, 0, dtype=torch.int32)]),
        cu_seqlens_kv=torch.cat([zero, torch.cumsum(kv_lens, 0, dtype=torch.int32)]),
        max_seqlen_q=int(q_lens.max()), max_seqlen_kv=int(kv_lens.max()),
        position_ids=positions,
    )


def packed_micro_batches(plan: Plan, *, group_id: int | None = None,
                         backward: bool = False) -> list[PackedMicroBatch]:
    """Every forward (or backward) unit of the plan's groups, in execution order.

    ``group_id`` selects one group (a data-parallel replica); by default all groups of all
    phases, phase by phase.
    """
    groups = [g for g in plan.groups() if group_id is None or g.group_id == group_id]
    if not groups:
        raise PlanError(f"plan has no group with id {group_id}")
    out = []
    for group in groups:
        units = group.backward_units if backward else group.forward_units
        out.extend(packed_micro_batch(group, u, unit_index=i) for i, u in enumerate(units))
    return out


def to_packed_seq_params(batch: PackedMicroBatch):
    """Megatron-core's ``PackedSeqParams`` (``qkv_format="thd"``) for one micro-batch."""
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "megatron-core is not installed: pip install -e '.[gpu]' (or '.[dev]')"
        ) from exc
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=batch.cu_seqlens_q, cu_seqlens_kv=batch.cu_seqlens_kv,
        max_seqlen_q=batch.max_seqlen_q, max_seqlen_kv=batch.max_seqlen_kv,
    )
