"""Token counts for a text column: a user-chosen tokenizer, or a labelled bytes/4 estimate."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from slimpack.data.lengths import (
    BYTES_FALLBACK_METHOD,
    BYTES_PER_TOKEN_ESTIMATE,
)

TokenCounter = Callable[[str], int]


def make_token_counter(tokenizer: str | Callable[[str], object] | None) -> tuple[TokenCounter, str]:
    """Return (count function, method label).

    ``tokenizer`` is None (bytes/4 estimate), a callable returning token ids or a count, or a
    Hugging Face tokenizer name/path (needs the optional ``transformers`` package).
    """
    if tokenizer is None:
        return _bytes_estimate, BYTES_FALLBACK_METHOD
    if callable(tokenizer):
        call = tokenizer
        return (lambda text: _as_count(call(text))), f"tokenizer {_describe(call)}"
    try:
        from transformers import AutoTokenizer  # optional dependency
    except ImportError:
        raise ValueError(
            f"tokenizer {tokenizer!r} needs the optional 'transformers' package "
            "(pip install transformers), or omit the tokenizer to use the bytes/4 estimate"
        ) from None
    hf = AutoTokenizer.from_pretrained(tokenizer)
    return (
        lambda text: len(hf(text, add_special_tokens=False)["input_ids"]),
        f"tokenizer {tokenizer} (Hugging Face)",
    )


def count_tokens(texts: Iterable[object], counter: TokenCounter, *, where: str) -> np.ndarray:
    counts = []
    for row, text in enumerate(texts, start=1):
        if not isinstance(text, str):
            raise ValueError(f"{where}: row {row}: expected text, got {type(text).__name__}")
        counts.append(counter(text))
    return np.array(counts, dtype=np.int64)


def _bytes_estimate(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN_ESTIMATE)


def _as_count(result: object) -> int:
    if isinstance(result, int):
        return result
    return len(result)  # type: ignore[arg-type]


def _describe(call: Callable[..., object]) -> str:
    return getattr(call, "__name__", type(call).__name__)
