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


def _document_chunks(pieces: np.ndarray, pointer: np.ndarray,
                     cp: int) -> tuple[np.ndarray, np.ndarray]:
    """(length, offset) of each document's 2cp chunks, shape (documents, 2cp), given where
    each document's remainder starts in the round-robin (``pointer``)."""
    chunks = 2 * cp
    tokens, prefix = pieces[:, 0], pieces[:, 1]
    base, remainder = np.divmod(tokens, chunks)
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
    return lengths, offsets


def _per_document(pieces: np.ndarray, cp: int) -> list[np.ndarray]:
    chunks = 2 * cp
    remainder = pieces[:, 0] % chunks
    # The round-robin pointer where each document's remainder starts.
    pointer = (np.cumsum(remainder) - remainder) % cp
    lengths, offsets = _document_chunks(pieces, pointer, cp)
    # Rank-major: rank r's early chunk r, then its late chunk 2cp-1-r, document by document.
    columns = np.stack([np.arange(cp), chunks - 1 - np.arange(cp)], axis=1)
    pairs = np.stack([lengths[:, columns].transpose(1, 0, 2).reshape(cp, -1),
                      offsets[:, columns].transpose(1, 0, 2).reshape(cp, -1)], axis=2)
    if (lengths > 0).all():
        return list(pairs)
    return [rank[rank[:, 0] > 0] for rank in pairs]


def _per_sequence(pieces: np.ndarray, cp: int) -> list[np.ndarray]:
    # One buffer through the all-buffers pass: a fixed number of numpy calls instead of
    # several per chunk, which at cp 32 made this the planners' hottest line (baselines
    # shard one micro-batch at a time). Rank r's pieces come out in buffer order, its early
    # chunk r before its late chunk 2cp-1-r.
    if not len(pieces):
        return [np.zeros((0, 2), dtype=np.int64) for _ in range(cp)]
    _, rank, out = _per_sequence_buffers(pieces, np.zeros(1, dtype=np.int64),
                                         np.zeros(len(pieces), dtype=np.int64), cp)
    order = np.argsort(rank, kind="stable")
    counts = np.bincount(rank, minlength=cp)
    return np.split(out[order], np.cumsum(counts)[:-1])


def shard_buffers(pieces: np.ndarray, first: np.ndarray, cp: int,
                  sharding: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`shard_piece_arrays` of many buffers in one numpy pass.

    ``pieces`` is an ``(n, 2)`` array of ``(tokens, kv_prefix)``, the buffers' pieces one
    buffer after another; ``first[b]`` is the row where buffer ``b`` starts (increasing,
    ``first[0] == 0``; every buffer holds at least one row). Returns ``(buffer, rank,
    chunks)``: for each output piece its buffer, its CP rank and its ``(tokens, kv_prefix)``
    row, sorted by ``(buffer, rank)`` and, inside each, in the order
    ``shard_piece_arrays(buffer's pieces, cp, sharding)[rank]`` gives them (so the simulator
    prices every slice of a group at once, exactly as slice by slice).
    """
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    if sharding not in CP_SHARDINGS:
        raise ValueError(f"cp sharding must be one of {CP_SHARDINGS}, got {sharding!r}")
    arr = np.asarray(pieces, dtype=np.int64).reshape(-1, 2)
    first = np.asarray(first, dtype=np.int64)
    if len(first) and (first[0] != 0 or (np.diff(first) <= 0).any() or first[-1] >= len(arr)):
        raise ValueError("first must start at 0 and increase strictly, every buffer non-empty")
    owner_buffer = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(arr))))
    if cp == 1 or not len(arr):
        keep = arr[:, 0] > 0
        return owner_buffer[keep], np.zeros(int(keep.sum()), dtype=np.int64), arr[keep]
    if sharding == "per-document":
        buffer, rank, out = _per_document_buffers(arr, first, owner_buffer, cp)
    else:
        buffer, rank, out = _per_sequence_buffers(arr, first, owner_buffer, cp)
    keep = out[:, 0] > 0
    buffer, rank, out = buffer[keep], rank[keep], out[keep]
    # Stable: inside one (buffer, rank) the pieces keep the order they were generated in.
    order = np.argsort(buffer * cp + rank, kind="stable")
    return buffer[order], rank[order], out[order]


def _per_document_buffers(pieces: np.ndarray, first: np.ndarray, owner_buffer: np.ndarray,
                          cp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_per_document` of every buffer at once: the same rule, with the round-robin
    pointer restarting at each buffer (each buffer is sharded on its own)."""
    chunks = 2 * cp
    remainder = pieces[:, 0] % chunks
    before = np.cumsum(remainder) - remainder  # remainders of earlier pieces, all buffers
    pointer = (before - before[first][owner_buffer]) % cp
    lengths, offsets = _document_chunks(pieces, pointer, cp)
    ranks = np.arange(cp)
    # Per piece: rank r's early chunk r, then its late chunk 2cp-1-r (piece, rank, 2).
    columns = np.stack([ranks, chunks - 1 - ranks], axis=1)
    out = np.stack([lengths[:, columns].reshape(-1), offsets[:, columns].reshape(-1)], axis=1)
    n = len(pieces)
    rank = np.broadcast_to(ranks[None, :, None], (n, cp, 2)).reshape(-1)
    buffer = np.repeat(owner_buffer, chunks)
    return buffer, rank, out


def _per_sequence_buffers(pieces: np.ndarray, first: np.ndarray, owner_buffer: np.ndarray,
                          cp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_per_sequence` of every buffer at once. All buffers are laid end to end; every
    piece boundary and every chunk boundary is a cut, and each stretch between two
    consecutive cuts lies in exactly one piece and one chunk: it is one output piece."""
    chunks = 2 * cp
    tokens, prefix = pieces[:, 0], pieces[:, 1]
    ends = np.cumsum(tokens)
    starts = ends - tokens
    buffer_start = starts[first]
    buffer_total = np.append(buffer_start[1:], ends[-1]) - buffer_start
    # Chunk k of buffer b: [start + total*k//2cp, start + total*(k+1)//2cp), buffer-major.
    k = np.arange(chunks + 1)
    bounds = buffer_start[:, None] + buffer_total[:, None] * k[None, :] // chunks
    chunk_end = bounds[:, 1:].reshape(-1)
    cuts = np.unique(np.concatenate([starts, ends, bounds.reshape(-1)]))
    lo, hi = cuts[:-1], cuts[1:]
    piece = np.searchsorted(ends, lo, side="right")  # the piece holding position lo
    chunk = np.searchsorted(chunk_end, lo, side="right")  # the non-empty chunk holding it
    owner, _ = _chunk_owners(cp)
    out = np.stack([hi - lo, prefix[piece] + lo - starts[piece]], axis=1)
    return chunk // chunks, owner[chunk % chunks], out
