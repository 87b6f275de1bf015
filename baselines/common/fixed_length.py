"""Megatron-LM's fixed-length samples: concatenate documents, cut every ``context`` tokens.

With document masks a document cut at a sample boundary becomes two independent training
sequences (its second piece never attends to the first), exactly as in Megatron-LM's
GPTDataset. The IR demands that a sequence's tokens be forwarded in order and backwarded in
reverse, which a cut document run as two unrelated micro-batches would break, so each cut-off
piece gets a fresh ``seq_id``; ``document_pieces`` maps it back to ``(original id, offset)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.batch import Batch
from slimpack.plan import Segment
from slimpack.planning.packing import concat_and_chunk


@dataclass(frozen=True, kw_only=True)
class FixedLengthSamples:
    samples: tuple[tuple[Segment, ...], ...]
    """Each sample's segments (all with start 0: pieces are independent sequences)."""
    sequence_lengths: dict[int, int]
    document_pieces: dict[int, tuple[int, int]]
    """Fresh seq_id -> (original seq_id, token offset in the original)."""


def fixed_length_samples(batch: Batch, context: int) -> FixedLengthSamples:
    """The batch cut as Megatron-LM's GPTDataset cuts it, built once per batch and context
    (every layout of a configuration search plans the same samples); read-only."""
    if context < 1:
        raise ValueError(f"context must be >= 1 token, got {context}")
    return batch.derived(("fixed_length_samples", context),
                         lambda: _fixed_length_samples(batch, context))


def _fixed_length_samples(batch: Batch, context: int) -> FixedLengthSamples:
    ids = [s.seq_id for s in batch.sequences]
    chunks = concat_and_chunk(batch.lengths, context)
    next_id = max(ids) + 1
    lengths: dict[int, int] = {}
    pieces: dict[int, tuple[int, int]] = {}
    samples = []
    for chunk in chunks:
        segs = []
        for index, start, end in chunk:
            seq_id = ids[index]
            if start > 0:  # a cut-off tail: an independent sequence under document masks
                pieces[next_id] = (seq_id, start)
                seq_id, next_id = next_id, next_id + 1
            lengths[seq_id] = end - start
            segs.append(Segment(seq_id=seq_id, start=0, end=end - start))
        samples.append(tuple(segs))
    return FixedLengthSamples(samples=tuple(samples), sequence_lengths=lengths,
                              document_pieces=pieces)


def deal_round_robin(items: list, parts: int) -> list[list]:
    """Sample k to replica k mod parts: Megatron's sampler with micro-batch size 1."""
    out: list[list] = [[] for _ in range(parts)]
    for k, item in enumerate(items):
        out[k % parts].append(item)
    return out
