"""Columnar sources: JSONL, Parquet, Arrow IPC, and Hugging Face ``save_to_disk`` folders.

Lengths come from a length column (integers, or a list column such as ``input_ids`` whose
list sizes are the lengths), or from a text column run through a tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slimpack.data.lengths import EXACT_METHOD, LengthData, check_lengths
from slimpack.data.tokenize import count_tokens, make_token_counter

# Tried in order when the user names no column; common names in HF and Megatron pipelines.
DEFAULT_LENGTH_COLUMNS: tuple[str, ...] = (
    "length",
    "num_tokens",
    "n_tokens",
    "seq_len",
    "seqlen",
    "len",
    "input_ids",
)

Tokenizer = str | Callable[[str], object] | None


def read_table_lengths(
    table: pa.Table,
    *,
    where: str,
    column: str | None = None,
    text_column: str | None = None,
    tokenizer: Tokenizer = None,
) -> LengthData:
    """Extract lengths from an Arrow table (the common step of every columnar reader)."""
    names = list(table.column_names)
    if text_column is not None:
        if text_column not in names:
            raise ValueError(
                f"{where}: text column {text_column!r} does not exist; columns are {names}"
            )
        counter, method = make_token_counter(tokenizer)
        counts = count_tokens(table.column(text_column).to_pylist(), counter, where=where)
        return LengthData(
            lengths=check_lengths(counts, where=f"{where} (column {text_column!r})", position="row"),
            source=where,
            method=method,
        )
    chosen = _choose_length_column(names, column=column, where=where)
    values = _column_to_lengths(table.column(chosen), where=f"{where} (column {chosen!r})")
    return LengthData(
        lengths=check_lengths(values, where=f"{where} (column {chosen!r})", position="row"),
        source=where,
        method=EXACT_METHOD,
    )


def _choose_length_column(names: list[str], *, column: str | None, where: str) -> str:
    if column is not None:
        if column not in names:
            raise ValueError(
                f"{where}: length column {column!r} does not exist; columns are {names}"
            )
        return column
    for candidate in DEFAULT_LENGTH_COLUMNS:
        if candidate in names:
            return candidate
    raise ValueError(
        f"{where}: no length column found (looked for {list(DEFAULT_LENGTH_COLUMNS)}); "
        f"columns are {names}; pass column=NAME (--column) or text_column=NAME (--text-column)"
    )


def _column_to_lengths(col: pa.ChunkedArray, *, where: str) -> np.ndarray:
    if col.null_count:
        first_null = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{where}: row {first_null + 1}: missing (null) length")
    kind = col.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pc.list_value_length(col).to_numpy().astype(np.int64)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return col.to_numpy()
    raise ValueError(
        f"{where}: has type {kind}; a length column must hold integers or token-id lists "
        "(use text_column / --text-column for text)"
    )


def read_parquet(path: Path, **options) -> LengthData:
    table = pq.read_table(path, columns=_columns_needed(pq.read_schema(path).names, **options))
    return read_table_lengths(table, where=str(path), **options)


def read_arrow(path: Path, **options) -> LengthData:
    return read_table_lengths(_read_arrow_table(path), where=str(path), **options)


def _read_arrow_table(path: Path) -> pa.Table:
    # HF writes the IPC *stream* format; other tools write the IPC *file* format.
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                return pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid as exc:
                raise ValueError(f"{path}: not an Arrow IPC file or stream ({exc})") from None


def read_hf_dataset_dir(path: Path, **options) -> LengthData:
    """Read a ``Dataset.save_to_disk`` folder (Arrow stream shards listed in state.json)."""
    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise ValueError(
            f"{path}: is a DatasetDict with splits {splits}; pass one split folder, "
            f"e.g. {path / (splits[0] if splits else 'train')}"
        )
    state_file = path / "state.json"
    if state_file.exists():
        files = [path / f["filename"] for f in json.loads(state_file.read_text())["_data_files"]]
    else:
        files = sorted(path.glob("*.arrow"))
    if not files:
        raise ValueError(f"{path}: no .arrow data files in this dataset folder (empty source)")
    table = pa.concat_tables([_read_arrow_table(f) for f in files])
    return read_table_lengths(table, where=str(path), **options)


def read_jsonl(path: Path, **options) -> LengthData:
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {line_no}: invalid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path}: line {line_no}: expected a JSON object per line, "
                    f"got {type(record).__name__}"
                )
            records.append(record)
    return lengths_from_records(records, path=path, position="line", **options)


def lengths_from_records(
    records: list[dict],
    *,
    path: Path,
    position: str,
    column: str | None = None,
    text_column: str | None = None,
    tokenizer: Tokenizer = None,
) -> LengthData:
    """Lengths from a list of JSON objects, with errors naming the record's position."""
    if not records:
        raise ValueError(f"{path}: no records found (empty source)")
    names = list(records[0])
    where = str(path)
    if text_column is not None:
        key = text_column
        if key not in names:
            raise ValueError(f"{where}: text column {key!r} does not exist; columns are {names}")
    else:
        key = _choose_length_column(names, column=column, where=where)
    values = []
    for index, record in enumerate(records, start=1):
        if key not in record:
            raise ValueError(f"{where}: {position} {index}: column {key!r} is missing")
        values.append(record[key])
    if text_column is not None:
        counter, method = make_token_counter(tokenizer)
        counts = count_tokens(values, counter, where=f"{where} (column {key!r})")
        lengths = check_lengths(counts, where=f"{where} (column {key!r})", position=position)
        return LengthData(lengths=lengths, source=where, method=method)
    ints = []
    for index, value in enumerate(values, start=1):
        if isinstance(value, list):
            value = len(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"{where}: {position} {index}: column {key!r}: {value!r} is not an integer length"
            )
        ints.append(value)
    lengths = check_lengths(
        np.array(ints, dtype=np.int64), where=f"{where} (column {key!r})", position=position
    )
    return LengthData(lengths=lengths, source=where)


def _columns_needed(
    names: list[str], *, column=None, text_column=None, tokenizer=None
) -> list[str] | None:
    # Read only the column we will use, so a wide Parquet file with a text column stays cheap.
    wanted = text_column or column
    if wanted is not None:
        return [wanted] if wanted in names else None
    for candidate in DEFAULT_LENGTH_COLUMNS:
        if candidate in names:
            return [candidate]
    return None
