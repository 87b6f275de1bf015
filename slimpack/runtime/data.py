"""Synthetic token ids and next-token labels for the sequences of a plan.

Label convention (shared by the reference and every plan): token ``i`` of a sequence is
labelled with token ``i+1`` of the same sequence; the last token of each sequence has no label
(``IGNORE_INDEX``). Documents never predict across their boundary, whatever the packing.
The step loss is the sum of cross-entropy over all labelled tokens of all sequences divided by
:func:`num_label_tokens`: a token-weighted mean that does not depend on slicing or packing.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from slimpack.runtime.model import IGNORE_INDEX


def make_tokens(sequence_lengths: Mapping[int, int], *, vocab_size: int,
                seed: int) -> dict[int, torch.Tensor]:
    """Token ids per sequence (CPU int64), each sequence from its own seeded stream so any
    rank can rebuild exactly the sequences it needs."""
    out = {}
    for seq_id, length in sequence_lengths.items():
        gen = torch.Generator().manual_seed(seed * 7_919 + seq_id)
        out[seq_id] = torch.randint(0, vocab_size, (length,), generator=gen)
    return out


def segment_labels(tokens: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Labels of tokens ``[start, end)`` of one sequence (ids of the next token)."""
    labels = torch.full((end - start,), IGNORE_INDEX, dtype=torch.long)
    last = min(end, tokens.shape[0] - 1)  # tokens with a successor in the sequence
    if last > start:
        labels[: last - start] = tokens[start + 1: last + 1]
    return labels


def num_label_tokens(sequence_lengths: Mapping[int, int]) -> int:
    return sum(n - 1 for n in sequence_lengths.values())
