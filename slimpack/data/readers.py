"""One entry point that reads document lengths from any supported file or folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from slimpack.data.lengths import LengthData
from slimpack.data.read_megatron import megatron_index_path, read_megatron_lengths
from slimpack.data.read_tabular import read_arrow, read_hf_dataset_dir, read_jsonl, read_parquet
from slimpack.data.read_text import read_json_lengths, read_text_lengths

SUPPORTED_FORMATS = (
    "text (one length per line), .json (list), .jsonl, .parquet, .arrow, "
    "Hugging Face save_to_disk folder, Megatron .idx/.bin prefix"
)


def read_lengths(
    path: str | Path,
    *,
    column: str | None = None,
    text_column: str | None = None,
    tokenizer: str | Callable[[str], object] | None = None,
) -> LengthData:
    """Read document lengths from ``path``, choosing the reader by suffix or folder contents.

    ``column`` names the length column of a table (default: the first of
    ``DEFAULT_LENGTH_COLUMNS`` present); ``text_column`` + ``tokenizer`` count tokens of a text
    column instead (``tokenizer=None`` uses the labelled bytes/4 estimate).
    """
    path = Path(path)
    table_options = {"column": column, "text_column": text_column, "tokenizer": tokenizer}
    index = megatron_index_path(path)
    if index is not None:
        return read_megatron_lengths(path)
    if not path.exists():
        raise ValueError(f"{path}: file not found (supported: {SUPPORTED_FORMATS})")
    if path.is_dir():
        return read_hf_dataset_dir(path, **table_options)
    suffix = path.suffix.lower()
    if suffix == ".json":
        return read_json_lengths(path, **table_options)
    if suffix == ".jsonl":
        return read_jsonl(path, **table_options)
    if suffix == ".parquet":
        return read_parquet(path, **table_options)
    if suffix in (".arrow", ".feather", ".ipc"):
        return read_arrow(path, **table_options)
    return read_text_lengths(path)
