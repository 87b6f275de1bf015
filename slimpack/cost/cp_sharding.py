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

import functools
from collections.abc import Sequence

import numpy as np

from slimpack.cost.flops import Piece

CP_SHARDINGS = ("per-sequence", "per-document")


def shard_pieces(pieces: Sequence[Piece], cp: int, sharding: str) -> list[list[Piece]]:
    """Per-CP-rank pieces (``cp`` lists) of a buffer holding ``pieces`` in order.

    ``pieces`` are ``(tokens, kv_prefix)`` of each document segment as packed in one buffer.
    """
    return [[(t, p) for t, p in rank.tolist()]
            for rank in shard_piece_arrays(pieces, cp, sharding)]


def shard_piece_arrays(pieces: Sequence[Piece] | np.ndarray, cp: int,
                       sharding: str) -> list[np.ndarray]:
    """:func:`shard_pieces` as ``cp`` integer arrays of shape ``(n, 2)``: the simulator's
    form, since a unit of a paper-size batch has thousands of chunks per rank."""
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    if sharding not in CP_SHARDINGS:
        raise ValueError(f"cp sharding must be one of {CP_SHARDINGS}, got {sharding!r}")
    arr = np.asarray(pieces, dtype=np.int64).reshape(-1, 2)
    if cp == 1:
        return [arr[arr[:, 0] > 0]]
    if sharding == "per-document":
        return _per_document(arr, cp)
    return _per_sequence(arr, cp)


def document_pieces(doc_lengths: Sequence[int], cp: int, sharding: str) -> list[list[Piece]]:
    """Per-CP-rank pieces of whole documents (no KV prefix) packed in one buffer."""
    return shard_pieces([(int(n), 0) for n in doc_lengths], cp, sharding)


def _owner(cp: int, chunk: int) -> int:
    return chunk if chunk < cp else 2 * cp - 1 - chunk


@functools.lru_cache(maxsize=64)
def _chunk_owners(cp: int) -> tuple[np.ndarray, np.ndarray]:
    """(rank of each of the 2cp chunks, whether the chunk is its rank's early one)."""
    chunks = 2 * cp
    return np.array([_owner(cp, c) for c in range(chunks)]), np.arange(chunks) < cp


def _per_document(pieces: np.ndarray, cp: int) -> list[np.ndarray]:
    chunks = 2 * cp
    tokens, prefix = pieces[:, 0], pieces[:, 1]
    base, remainder = np.divmod(tokens, chunks)
    # The round-robin pointer where each document's remainder starts.
    pointer = (np.cumsum(remainder) - remainder) % cp
    ranks = np.arange(cp)
    # extra[i, r]: leftover tokens rank r gets from document i (0, 1 or 2): remainder j goes
    # to rank (pointer + j) % cp for j < remainder < 2cp.
    distance = (ranks[None, :] - pointer[:, None]) % cp
    extra = (distance < remainder[:, None]).astype(np.int64) + \
        (distance + cp < remainder[:, None]).astype(np.int64)
    owner, early = _chunk_owners(cp)
    # A rank's first extra token lengthens its early chunk, a second one its late chunk.
    bonus = np.where(early[None, :], extra[:, owner] >= 1, extra[:, owner] == 2)
    lengths = base[:, None] + bonus.astype(np.int64)
    offsets = prefix[:, None] + np.cumsum(lengths, axis=1) - lengths
    out = []
    for rank in range(cp):
        cols = [rank, chunks - 1 - rank]  # early chunk first, as the buffer is ordered
        rank_pieces = np.stack([lengths[:, cols].reshape(-1), offsets[:, cols].reshape(-1)],
                               axis=1)
        out.append(rank_pieces[rank_pieces[:, 0] > 0])
    return out


def _per_sequence(pieces: np.ndarray, cp: int) -> list[np.ndarray]:
    out: list[list[Piece]] = [[] for _ in range(cp)]
    listed = [(int(t), int(p)) for t, p in pieces.tolist()]
    total = sum(t for t, _ in listed)
    chunks = 2 * cp
    bounds = [total * k // chunks for k in range(chunks + 1)]
    for chunk in range(chunks):
        lo, hi = bounds[chunk], bounds[chunk + 1]
        rank = _owner(cp, chunk)
        start = 0
        for tokens, prefix in listed:
            a, b = max(lo, start), min(hi, start + tokens)
            if a < b:
                out[rank].append((b - a, prefix + (a - start)))
            start += tokens
            if start >= hi:
                break
    return [np.array(rank, dtype=np.int64).reshape(-1, 2) for rank in out]
