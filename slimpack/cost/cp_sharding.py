"""Context-parallel sharding: which ``(tokens, kv_prefix)`` pieces each CP rank computes.

The one home of this rule: planners estimate with it and the simulator charges with it, so
a planner's per-rank attention is the simulator's.

Ring attention's per-rank work depends on which part of each document a rank holds, because
a query at position ``x`` of a document attends to ``x`` earlier keys. Both modes cut into
``2*cp`` chunks and give rank ``i`` chunks ``i`` and ``2cp-1-i``, the load-balanced causal
layout of Megatron-LM's ring attention (an early, cheap chunk paired with a late, expensive
one):

* ``per-sequence`` (Megatron-LM, ``bshd``): the packed buffer is cut whole, regardless of
  document boundaries, so a rank may hold mostly cheap short documents or mostly the tail of
  a long one.
* ``per-document`` (WLB-LLM, arXiv 2503.17924 section 5; Transformer Engine's packed ``thd``
  format): every document (segment) is cut on its own. The padding-free remainder rule: the
  ``len mod 2cp`` leftover tokens are not padded away but handed out one per rank,
  round-robin with a pointer carried across documents (so no rank collects every
  remainder), each rank's first extra token lengthening its early chunk and a second one its
  late chunk. Chunks stay contiguous, so every piece is one varlen kernel row range.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimpack.cost.flops import Piece

CP_SHARDINGS = ("per-sequence", "per-document")


def shard_pieces(pieces: Sequence[Piece], cp: int, sharding: str) -> list[list[Piece]]:
    """Per-CP-rank pieces (``cp`` lists) of a buffer holding ``pieces`` in order.

    ``pieces`` are ``(tokens, kv_prefix)`` of each document segment as packed in one buffer.
    """
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    if sharding not in CP_SHARDINGS:
        raise ValueError(f"cp sharding must be one of {CP_SHARDINGS}, got {sharding!r}")
    if cp == 1:
        return [[(int(t), int(p)) for t, p in pieces if t > 0]]
    if sharding == "per-document":
        return _per_document(pieces, cp)
    return _per_sequence(pieces, cp)


def document_pieces(doc_lengths: Sequence[int], cp: int, sharding: str) -> list[list[Piece]]:
    """Per-CP-rank pieces of whole documents (no KV prefix) packed in one buffer."""
    return shard_pieces([(int(n), 0) for n in doc_lengths], cp, sharding)


def _owner(cp: int, chunk: int) -> int:
    return chunk if chunk < cp else 2 * cp - 1 - chunk


def _per_document(pieces: Sequence[Piece], cp: int) -> list[list[Piece]]:
    out: list[list[Piece]] = [[] for _ in range(cp)]
    pointer = 0
    for tokens, prefix in pieces:
        base, remainder = divmod(int(tokens), 2 * cp)
        extra = [0] * cp
        for j in range(remainder):
            extra[(pointer + j) % cp] += 1
        pointer = (pointer + remainder) % cp
        offset = int(prefix)
        for chunk in range(2 * cp):
            rank = _owner(cp, chunk)
            early = chunk < cp
            length = base + (1 if (extra[rank] >= 1 if early else extra[rank] == 2) else 0)
            if length:
                out[rank].append((length, offset))
            offset += length
    return out


def _per_sequence(pieces: Sequence[Piece], cp: int) -> list[list[Piece]]:
    out: list[list[Piece]] = [[] for _ in range(cp)]
    total = int(sum(t for t, _ in pieces))
    chunks = 2 * cp
    bounds = [total * k // chunks for k in range(chunks + 1)]
    for chunk in range(chunks):
        lo, hi = bounds[chunk], bounds[chunk + 1]
        rank = _owner(cp, chunk)
        start = 0
        for tokens, prefix in pieces:
            a, b = max(lo, start), min(hi, start + tokens)
            if a < b:
                out[rank].append((b - a, int(prefix) + (a - start)))
            start += tokens
            if start >= hi:
                break
    return out
