"""A global batch: the sequences one training step must consume."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def _require_int(name: str, value: object) -> int:
    """``value`` as an int (numpy integers too); bools and floats (even 2.0) are refused.

    Not ``slimpack.specs._validate.require_int``: batch and specs are sibling layers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"Sequence.{name} must be an integer, got {value!r} "
                         f"({type(value).__name__})")
    return int(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sequence:
    """One training sequence (a document, or a truncated/split piece of one)."""

    seq_id: int
    """Identifier unique within its batch."""
    length: int
    """Number of tokens."""

    def __post_init__(self) -> None:
        # Lengths are token counts: 2.5 tokens is a bug upstream, refused rather than truncated.
        for name in ("seq_id", "length"):
            object.__setattr__(self, name, _require_int(name, getattr(self, name)))
        if self.seq_id < 0:
            raise ValueError(f"Sequence.seq_id must be >= 0, got {self.seq_id}")
        if self.length <= 0:
            raise ValueError(
                f"Sequence.length must be a positive token count, got {self.length} "
                f"(seq_id={self.seq_id})"
            )


@dataclass(frozen=True, kw_only=True)
class Batch:
    """A global batch of sequences, with where it came from so it can be regenerated."""

    sequences: tuple[Sequence, ...]
    seed: int | None = None
    """Seed of the sampler that drew it (None for a hand-built batch)."""
    source: str = "manual"
    """Profile name or file path it was drawn from."""
    _lengths: dict[int, int] = field(init=False, repr=False, compare=False)
    _derived: dict[Hashable, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.sequences:
            raise ValueError("Batch.sequences must hold at least one sequence")
        lengths: dict[int, int] = {}
        for seq in self.sequences:
            if seq.seq_id in lengths:
                raise ValueError(f"Batch.sequences: duplicate seq_id {seq.seq_id}")
            lengths[seq.seq_id] = seq.length
        object.__setattr__(self, "_lengths", lengths)
        object.__setattr__(self, "_derived", {})

    @classmethod
    def from_lengths(
        cls, lengths: Iterable[int], *, seed: int | None = None, source: str = "manual"
    ) -> Batch:
        """Number the lengths 0..n-1 in the order given (integers only, numpy ones included)."""
        seqs = tuple(Sequence(seq_id=i, length=n) for i, n in enumerate(lengths))
        return cls(sequences=seqs, seed=seed, source=source)

    @property
    def lengths(self) -> list[int]:
        return [s.length for s in self.sequences]

    @property
    def num_tokens(self) -> int:
        return sum(s.length for s in self.sequences)

    def length_of(self, seq_id: int) -> int:
        return self._lengths[seq_id]

    def __len__(self) -> int:
        return len(self.sequences)

    def derived(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, computed once per batch and ``key``: for a value that depends on the
        batch alone (and on what ``key`` names), such as Megatron-LM's fixed-length samples
        at a context, which a configuration search would otherwise rebuild for every layout.
        The batch is immutable, so the value stays true; callers must not modify it."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def __getstate__(self) -> dict[str, Any]:
        # A batch sent to another process travels without its derived values (they can be
        # large and are rebuilt there on first use).
        return {**self.__dict__, "_derived": {}}
