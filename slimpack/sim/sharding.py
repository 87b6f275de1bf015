"""Context-parallel sharding: which (tokens, KV prefix) pieces each CP rank computes.

Ring attention's per-rank work depends on which part of each document a rank holds, because a
query at position ``x`` of a document attends to ``x`` earlier keys. Both modes cut into
``2*cp`` chunks and give rank ``i`` chunks ``i`` and ``2cp-1-i`` (the load-balanced zigzag):

* ``per-sequence`` (Megatron-LM): the slice's whole packed buffer is cut, regardless of
  document boundaries, so a rank may hold mostly cheap short documents or mostly the tail of
  a long one.
* ``per-document`` (WLB-LLM): every document is cut on its own; a length not divisible by
  ``2cp`` gives its remainder tokens to the first chunks, one each (round-robin).
"""

from __future__ import annotations

from slimpack.cost.flops import Piece
from slimpack.plan import Slice


def slice_pieces(sl: Slice, cp: int, sharding: str) -> list[list[Piece]]:
    """Per-CP-rank pieces of one slice (``cp`` lists)."""
    if cp == 1:
        return [[(seg.num_tokens, seg.start) for seg in sl.segments]]
    if sharding == "per-document":
        return _per_document(sl, cp)
    if sharding == "per-sequence":
        return _per_sequence(sl, cp)
    raise ValueError(f"cp_sharding must be per-sequence or per-document, got {sharding!r}")


def _owner_of_chunk(cp: int) -> list[int]:
    return [k if k < cp else 2 * cp - 1 - k for k in range(2 * cp)]


def _per_document(sl: Slice, cp: int) -> list[list[Piece]]:
    owner = _owner_of_chunk(cp)
    ranks: list[list[Piece]] = [[] for _ in range(cp)]
    chunks = 2 * cp
    for seg in sl.segments:
        base, rem = divmod(seg.num_tokens, chunks)
        offset = 0
        for k in range(chunks):
            length = base + (1 if k < rem else 0)
            if length:
                ranks[owner[k]].append((length, seg.start + offset))
            offset += length
    return ranks


def _per_sequence(sl: Slice, cp: int) -> list[list[Piece]]:
    owner = _owner_of_chunk(cp)
    ranks: list[list[Piece]] = [[] for _ in range(cp)]
    total = sl.num_tokens
    chunks = 2 * cp
    bounds = [total * k // chunks for k in range(chunks + 1)]
    seg_offsets = []
    offset = 0
    for seg in sl.segments:
        seg_offsets.append(offset)
        offset += seg.num_tokens
    for k in range(chunks):
        lo, hi = bounds[k], bounds[k + 1]
        for seg, off in zip(sl.segments, seg_offsets, strict=True):
            a, b = max(lo, off), min(hi, off + seg.num_tokens)
            if a < b:
                ranks[owner[k]].append((b - a, seg.start + (a - off)))
    return ranks
