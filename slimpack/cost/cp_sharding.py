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
    # Rank-major: rank r's early chunk r, then its late chunk 2cp-1-r, document by document.
    columns = np.stack([np.arange(cp), chunks - 1 - np.arange(cp)], axis=1)
    pairs = np.stack([lengths[:, columns].transpose(1, 0, 2).reshape(cp, -1),
                      offsets[:, columns].transpose(1, 0, 2).reshape(cp, -1)], axis=2)
    if (lengths > 0).all():
        return list(pairs)
    return [rank[rank[:, 0] > 0] for rank in pairs]


def _per_sequence(pieces: np.ndarray, cp: int) -> list[np.ndarray]:
    chunks = 2 * cp
    tokens, prefix = pieces[:, 0], pieces[:, 1]
    ends = np.cumsum(tokens)
    starts = ends - tokens
    total = int(ends[-1]) if len(ends) else 0
    bounds = [total * k // chunks for k in range(chunks + 1)]
    parts: list[list[np.ndarray]] = [[] for _ in range(cp)]
    for chunk in range(chunks):  # in buffer order: a rank's early chunk comes first
        lo, hi = bounds[chunk], bounds[chunk + 1]
        # The pieces overlapping [lo, hi): ending after lo and starting before hi.
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(starts, hi, side="left"))
        a = np.maximum(starts[first:last], lo)
        b = np.minimum(ends[first:last], hi)
        keep = a < b
        parts[_owner(cp, chunk)].append(
            np.stack([(b - a)[keep], (prefix[first:last] + a - starts[first:last])[keep]], axis=1))
    return [np.concatenate(p).reshape(-1, 2) for p in parts]
