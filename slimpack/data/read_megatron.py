"""Megatron-LM indexed datasets: sequence lengths straight from the ``.idx`` file.

Layout of ``MMapIndexedDataset`` / ``IndexedDataset`` (megatron/core/datasets/indexed_dataset.py),
all little-endian:

    9 bytes  magic b"MMIDIDX\\x00\\x00"
    u64      version (1)
    u8       dtype code of the tokens in the .bin file (1..8)
    u64      sequence count S
    u64      document count D
    i32[S]   sequence lengths (tokens)           <- what we read
    i64[S]   sequence byte offsets into .bin
    i64[D]   document indices (sequence index where each document starts; D = docs + 1)
    [i8[S]   sequence modes, multimodal datasets only]

Only the header and the lengths array are touched (numpy memmap); no token is read.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from slimpack.data.lengths import LengthData, check_lengths

MEGATRON_INDEX_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")
_VALID_DTYPE_CODES = range(1, 9)


def megatron_index_path(path: Path) -> Path | None:
    """The ``.idx`` file for a Megatron path given as ``prefix``, ``prefix.idx`` or ``prefix.bin``."""
    if path.suffix in (".idx", ".bin"):
        return path.with_suffix(".idx")
    candidate = path.with_name(path.name + ".idx")
    return candidate if candidate.exists() else None


def read_megatron_lengths(path: Path) -> LengthData:
    index = megatron_index_path(path) or path
    if not index.exists():
        raise ValueError(f"{index}: Megatron index file not found")
    size = index.stat().st_size
    if size < _HEADER.size:
        raise ValueError(f"{index}: too short ({size} bytes) to be a Megatron .idx file")
    with index.open("rb") as handle:
        magic, version, dtype_code, seq_count, doc_count = _HEADER.unpack(
            handle.read(_HEADER.size)
        )
    if magic != MEGATRON_INDEX_MAGIC:
        raise ValueError(f"{index}: bad magic {magic!r}; not a Megatron MMapIndexedDataset .idx")
    if version != 1:
        raise ValueError(f"{index}: index version {version} is not supported (only 1)")
    if dtype_code not in _VALID_DTYPE_CODES:
        raise ValueError(f"{index}: token dtype code {dtype_code} is not one of 1..8")
    needed = _HEADER.size + seq_count * (4 + 8) + doc_count * 8
    if size < needed:
        raise ValueError(
            f"{index}: truncated: header says {seq_count} sequences and {doc_count} document "
            f"indices ({needed} bytes) but the file has {size} bytes"
        )
    if seq_count == 0:
        raise ValueError(f"{index}: holds no sequences (empty source)")
    lengths = np.memmap(index, dtype="<i4", mode="r", offset=_HEADER.size, shape=(seq_count,))
    values = np.array(lengths, dtype=np.int64)  # copy out so the file handle can close
    del lengths
    return LengthData(
        lengths=check_lengths(values, where=str(index), position="sequence"), source=str(index)
    )
