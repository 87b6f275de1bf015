"""Where every segment of a group lives: its slice, its row offset, its KV prefix pieces.

A segment ``[start, end)`` of a sequence attends to the keys of every earlier segment of the
same sequence (its KV prefix, exactly tokens ``[0, start)`` because a valid plan covers each
sequence once) followed by its own keys, so its key length is ``end``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slimpack.plan import Group, Slice
from slimpack.runtime.attention import VarlenLayout
from slimpack.runtime.data import segment_labels


@dataclass(frozen=True, kw_only=True, slots=True)
class SegmentPlace:
    seq_id: int
    start: int
    end: int
    slice_id: int
    offset: int
    """First row of the segment in its slice's token buffer."""

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def rows(self) -> slice:
        return slice(self.offset, self.offset + self.num_tokens)


@dataclass(frozen=True, kw_only=True)
class SliceLayout:
    slice_id: int
    num_tokens: int
    segments: tuple[SegmentPlace, ...]
    prefixes: tuple[tuple[SegmentPlace, ...], ...]
    """Per segment: the earlier segments of its sequence, in token order."""
    varlen: VarlenLayout
    has_consumers: bool
    """Some later slice attends to this slice's keys (so its KV is cached)."""


class GroupLayout:
    """Layouts of all slices of one plan group, built once before execution."""

    def __init__(self, group: Group) -> None:
        by_seq: dict[int, list[SegmentPlace]] = {}
        places: dict[int, list[SegmentPlace]] = {}
        for sl in group.slices:
            offset = 0
            places[sl.slice_id] = []
            for seg in sl.segments:
                place = SegmentPlace(seq_id=seg.seq_id, start=seg.start, end=seg.end,
                                     slice_id=sl.slice_id, offset=offset)
                places[sl.slice_id].append(place)
                by_seq.setdefault(seg.seq_id, []).append(place)
                offset += seg.num_tokens
        for segs in by_seq.values():
            segs.sort(key=lambda p: p.start)
        self._slices: dict[int, SliceLayout] = {}
        for sl in group.slices:
            segs = tuple(places[sl.slice_id])
            prefixes = tuple(tuple(p for p in by_seq[s.seq_id] if p.start < s.start) for s in segs)
            consumers = any(by_seq[s.seq_id][-1].start > s.start for s in segs)
            self._slices[sl.slice_id] = SliceLayout(
                slice_id=sl.slice_id, num_tokens=sl.num_tokens, segments=segs, prefixes=prefixes,
                varlen=VarlenLayout(q_lens=tuple(s.num_tokens for s in segs),
                                    k_lens=tuple(s.end for s in segs)),
                has_consumers=consumers)

    def __getitem__(self, slice_id: int) -> SliceLayout:
        return self._slices[slice_id]


def slice_inputs(sl: Slice, tokens: dict[int, torch.Tensor], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token ids, labels, absolute positions) of a slice's packed buffer, on ``device``."""
    ids, labels, positions = [], [], []
    for seg in sl.segments:
        seq = tokens[seg.seq_id]
        ids.append(seq[seg.start:seg.end])
        labels.append(segment_labels(seq, seg.start, seg.end))
        positions.append(torch.arange(seg.start, seg.end))
    return tuple(torch.cat(t).to(device) for t in (ids, labels, positions))
