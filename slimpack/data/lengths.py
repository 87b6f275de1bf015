"""Validated arrays of document lengths, and where they came from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EXACT_METHOD = "exact token counts read from the source"
BYTES_PER_TOKEN_ESTIMATE = 4
BYTES_FALLBACK_METHOD = (
    "ESTIMATE: ceil(UTF-8 bytes / 4) per text (no tokenizer given); real token counts differ"
)


@dataclass(frozen=True, kw_only=True, eq=False)
class LengthData:
    """Token counts of the documents of one source (file, dataset or sampled profile)."""

    lengths: np.ndarray
    """int64 array, one positive token count per document, in source order."""
    source: str
    """Path or profile name, for messages and records."""
    method: str = EXACT_METHOD
    """How the counts were obtained; the bytes/4 fallback says so here."""

    def __len__(self) -> int:
        return int(self.lengths.size)


def check_lengths(values: np.ndarray, *, where: str, position: str = "entry") -> np.ndarray:
    """Return ``values`` as int64 after checking it is a non-empty array of positive integers.

    ``where`` names the file (and column); ``position`` names what an index counts
    ("line", "row", "sequence") so the message points at the offending record. Zero-token
    documents are rejected too: they cannot form a training sequence and would break the
    log-length interpolation of profiles.
    """
    arr = np.asarray(values)
    if arr.size == 0:
        raise ValueError(f"{where}: no lengths found (empty source)")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.floor(arr)))
        if bad.size:
            raise ValueError(
                f"{where}: {position} {int(bad[0]) + 1}: length {arr[bad[0]]!r} is not an "
                "integer token count"
            )
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"{where}: lengths must be integers, got values of type {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        raise ValueError(
            f"{where}: {position} {int(bad[0]) + 1}: length {int(arr[bad[0]])} is not allowed; "
            "lengths must be positive integer token counts (>= 1)"
        )
    return arr
