"""SlimPipe's uniform slicing of a packed sample (arXiv 2504.14519, section 4): shared by the
SlimPipe baseline and SlimPack's uniform candidate, whose search holds every plan shape
SlimPipe's does."""

from __future__ import annotations

from collections.abc import Sequence

from slimpack.plan import Segment

SLICE_ALIGN = 128
"""Slice lengths are multiples of 128 tokens (FlashAttention tile; SlimPipe section 4)."""


def slice_length(tokens: int, num_slices: int) -> int:
    """Uniform slice length: ceil(tokens / n) rounded up to a multiple of 128."""
    per = -(-tokens // num_slices)
    return -(-per // SLICE_ALIGN) * SLICE_ALIGN


def cut_sample(sample: Sequence[Segment], length: int) -> list[list[Segment]]:
    """Cut a packed sample's token stream every ``length`` tokens; a document that crosses a
    cut continues in the next slice with its earlier tokens as KV prefix."""
    slices: list[list[Segment]] = [[]]
    room = length
    for seg in sample:
        start = seg.start
        while start < seg.end:
            if room == 0:
                slices.append([])
                room = length
            take = min(room, seg.end - start)
            slices[-1].append(Segment(seq_id=seg.seq_id, start=start, end=start + take))
            start += take
            room -= take
    return [s for s in slices if s]
