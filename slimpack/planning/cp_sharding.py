"""How a micro-batch's documents are split over context-parallel ranks, as cost-model pieces.

A piece is ``(query tokens, kv_prefix)`` of one document on one rank (``slimpack.cost.flops``).
Both layouts cut into ``2*cp`` chunks and give rank ``i`` chunks ``i`` and ``2cp-1-i``, the
load-balanced causal layout of Megatron-LM's ring attention: an early chunk (cheap) is paired
with a late one (expensive).

* per-sequence: the *packed* sequence is cut (Megatron-LM). A short document lands on one rank
  whole, so ranks can differ a lot when documents are long and few.
* per-document: every document is cut (WLB-LLM, arXiv 2503.17924, section 5). Each rank gets an
  equal share of every document's attention, at the price of more, smaller kernels. The
  padding-free rule: the ``len mod 2cp`` remainder tokens go one per rank, round-robin, instead
  of padding the document to a multiple of 2cp.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimpack.cost.flops import Piece


def _chunk_ranges(total: int, cp: int) -> list[list[tuple[int, int]]]:
    """Rank i's two token ranges [a, b) of a ``total``-token buffer cut into 2*cp chunks."""
    n = 2 * cp
    bounds = [total * k // n for k in range(n + 1)]
    return [[(bounds[i], bounds[i + 1]), (bounds[n - 1 - i], bounds[n - i])] for i in range(cp)]


def per_sequence_pieces(doc_lengths: Sequence[int], cp: int) -> list[list[Piece]]:
    """Pieces on each CP rank when the packed sequence (documents in order) is cut whole."""
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    if cp == 1:
        return [[(int(n), 0) for n in doc_lengths]]
    total = int(sum(doc_lengths))
    out: list[list[Piece]] = []
    for ranges in _chunk_ranges(total, cp):
        pieces: list[Piece] = []
        doc_start = 0
        for n in doc_lengths:
            doc_end = doc_start + n
            for a, b in ranges:
                lo, hi = max(a, doc_start), min(b, doc_end)
                if hi > lo:
                    pieces.append((hi - lo, lo - doc_start))
            doc_start = doc_end
        out.append(pieces)
    return out


def per_document_pieces(doc_lengths: Sequence[int], cp: int) -> list[list[Piece]]:
    """Pieces on each CP rank when every document is cut into 2*cp chunks (WLB-LLM)."""
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    if cp == 1:
        return [[(int(n), 0) for n in doc_lengths]]
    out: list[list[Piece]] = [[] for _ in range(cp)]
    next_rank = 0  # round-robin pointer for remainders, carried across documents
    for n in doc_lengths:
        chunk, remainder = divmod(int(n), 2 * cp)
        if chunk:
            for i in range(cp):
                out[i].append((chunk, i * chunk))
                out[i].append((chunk, (2 * cp - 1 - i) * chunk))
        base = 2 * cp * chunk
        for j in range(remainder):
            out[(next_rank + j) % cp].append((1, base + j))
        next_rank = (next_rank + remainder) % cp
    return out


def cp_pieces(doc_lengths: Sequence[int], cp: int, sharding: str) -> list[list[Piece]]:
    if sharding == "per-sequence":
        return per_sequence_pieces(doc_lengths, cp)
    if sharding == "per-document":
        return per_document_pieces(doc_lengths, cp)
    raise ValueError(f"cp sharding must be 'per-sequence' or 'per-document', got {sharding!r}")
