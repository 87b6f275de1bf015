"""Readers: small real files in every supported format are written, then read back.

Megatron's .idx layout follows megatron/core/datasets/indexed_dataset.py (_IndexWriter):
magic, u64 version, u8 dtype code, u64 sequence count, u64 document count, i32 lengths,
i64 pointers, i64 document indices.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slimpack.cli.main import main
from slimpack.data import read_lengths
from slimpack.data.lengths import BYTES_FALLBACK_METHOD, EXACT_METHOD

LENGTHS = [5, 1, 4096, 77, 131072, 300]


def write_megatron_index(prefix, lengths, *, magic=b"MMIDIDX\x00\x00", dtype_code=8):
    lengths = np.asarray(lengths, dtype=np.int32)
    token_bytes = 2  # dtype code 8 = uint16 tokens
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * token_bytes)])
    documents = np.arange(lengths.size + 1, dtype=np.int64)  # one sequence per document
    with open(f"{prefix}.idx", "wb") as handle:
        handle.write(magic)
        handle.write(struct.pack("<Q", 1))
        handle.write(struct.pack("<B", dtype_code))
        handle.write(struct.pack("<Q", lengths.size))
        handle.write(struct.pack("<Q", documents.size))
        handle.write(lengths.tobytes(order="C"))
        handle.write(pointers.astype(np.int64).tobytes(order="C"))
        handle.write(documents.tobytes(order="C"))
    with open(f"{prefix}.bin", "wb") as handle:  # tokens are never read; keep the pair complete
        handle.write(b"\x00" * int(lengths.sum()) * token_bytes)


def test_text_file_one_length_per_line_ignores_blank_lines(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("5\n1\n\n4096\n77\n131072\n300\n")
    data = read_lengths(path)
    assert data.lengths.tolist() == LENGTHS
    assert data.lengths.dtype == np.int64
    assert data.method == EXACT_METHOD


def test_json_list_and_list_of_objects(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(LENGTHS))
    assert read_lengths(plain).lengths.tolist() == LENGTHS
    objects = tmp_path / "objects.json"
    objects.write_text(json.dumps([{"seq_len": n, "id": i} for i, n in enumerate(LENGTHS)]))
    assert read_lengths(objects).lengths.tolist() == LENGTHS


def test_jsonl_length_column_text_column_and_tokenizer(tmp_path):
    path = tmp_path / "docs.jsonl"
    texts = ["abcd" * 3, "é", "one two three"]
    rows = [{"text": t, "num_tokens": n} for t, n in zip(texts, [3, 9, 4], strict=True)]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    assert read_lengths(path).lengths.tolist() == [3, 9, 4]
    estimated = read_lengths(path, text_column="text")
    # ceil(UTF-8 bytes / 4): 12 bytes -> 3, "é" is 2 bytes -> 1, 13 bytes -> 4.
    assert estimated.lengths.tolist() == [3, 1, 4]
    assert estimated.method == BYTES_FALLBACK_METHOD and "ESTIMATE" in estimated.method
    words = read_lengths(path, text_column="text", tokenizer=str.split)
    assert words.lengths.tolist() == [1, 1, 3]
    assert "split" in words.method


def test_parquet_written_with_pandas(tmp_path):
    path = tmp_path / "docs.parquet"
    pd.DataFrame({"text": ["x"] * 6, "num_tokens": LENGTHS, "other": range(1, 7)}).to_parquet(path)
    assert read_lengths(path).lengths.tolist() == LENGTHS  # default column detection
    assert read_lengths(path, column="other").lengths.tolist() == [1, 2, 3, 4, 5, 6]


def test_parquet_token_id_list_column_gives_list_lengths(tmp_path):
    path = tmp_path / "tokens.parquet"
    pd.DataFrame({"input_ids": [[1, 2, 3], [7], list(range(10))]}).to_parquet(path)
    assert read_lengths(path).lengths.tolist() == [3, 1, 10]


def test_arrow_ipc_file(tmp_path):
    path = tmp_path / "docs.arrow"
    table = pa.table({"length": pa.array(LENGTHS, pa.int64())})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert read_lengths(path).lengths.tolist() == LENGTHS


def test_hugging_face_save_to_disk_folder(tmp_path):
    # datasets.Dataset.save_to_disk layout: Arrow *stream* shards listed in state.json.
    folder = tmp_path / "hf"
    folder.mkdir()
    shards = [LENGTHS[:3], LENGTHS[3:]]
    for i, shard in enumerate(shards):
        table = pa.table({"text": ["t"] * len(shard), "length": pa.array(shard, pa.int32())})
        name = f"data-0000{i}-of-00002.arrow"
        with pa.OSFile(str(folder / name), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
    state = {"_data_files": [{"filename": f"data-0000{i}-of-00002.arrow"} for i in range(2)]}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text("{}")
    assert read_lengths(folder).lengths.tolist() == LENGTHS


@pytest.mark.parametrize("suffix", ["", ".idx", ".bin"])
def test_megatron_index_read_by_prefix_idx_or_bin(tmp_path, suffix):
    prefix = tmp_path / "corpus_text_document"
    write_megatron_index(prefix, LENGTHS)
    data = read_lengths(f"{prefix}{suffix}")
    assert data.lengths.tolist() == LENGTHS
    assert data.source.endswith(".idx")


# --- bad input: every error names the file and the line, row or column -----------------


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match=r"nope\.txt: file not found"):
        read_lengths(missing)


def test_non_integer_line_is_named(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("12\n\n7.5\n3\n")
    with pytest.raises(ValueError, match=r"bad\.txt: line 3: '7\.5' is not an integer"):
        read_lengths(path)


@pytest.mark.parametrize("value", ["-4", "0"])
def test_negative_or_zero_length_is_named(tmp_path, value):
    path = tmp_path / "neg.txt"
    path.write_text(f"12\n{value}\n3\n")
    with pytest.raises(ValueError, match=rf"neg\.txt: line 2: length {value} is not allowed"):
        read_lengths(path)


def test_empty_sources(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=r"empty\.txt: no lengths found \(empty source\)"):
        read_lengths(empty)
    empty_json = tmp_path / "empty.json"
    empty_json.write_text("[]")
    with pytest.raises(ValueError, match="empty source"):
        read_lengths(empty_json)
    write_megatron_index(tmp_path / "nothing", [])
    with pytest.raises(ValueError, match=r"nothing\.idx: holds no sequences"):
        read_lengths(tmp_path / "nothing")


def test_missing_length_column_names_column_and_lists_columns(tmp_path):
    path = tmp_path / "docs.parquet"
    pd.DataFrame({"text": ["a"], "tokens": [3]}).to_parquet(path)
    with pytest.raises(ValueError, match=r"docs\.parquet: length column 'len_tokens' does not "
                       r"exist; columns are \['text', 'tokens'\]"):
        read_lengths(path, column="len_tokens")
    with pytest.raises(ValueError, match=r"no length column found"):
        read_lengths(path)


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"length": 3}\n{"length": "x"}\n')
    with pytest.raises(ValueError, match=r"docs\.jsonl: line 2: column 'length': 'x' is not"):
        read_lengths(path)
    path.write_text('{"length": 3}\n{"length": -1}\n')
    with pytest.raises(ValueError, match=r"line 2: length -1 is not allowed"):
        read_lengths(path)
    path.write_text('{"length": 3}\n{oops\n')
    with pytest.raises(ValueError, match=r"docs\.jsonl: line 2: invalid JSON"):
        read_lengths(path)


def test_parquet_negative_length_names_row_and_column(tmp_path):
    path = tmp_path / "neg.parquet"
    pq.write_table(pa.table({"length": [4, 5, -2]}), path)
    with pytest.raises(ValueError, match=r"neg\.parquet \(column 'length'\): row 3: length -2"):
        read_lengths(path)


def test_megatron_bad_magic_and_truncation(tmp_path):
    write_megatron_index(tmp_path / "bad", LENGTHS, magic=b"NOTANIDX!")
    with pytest.raises(ValueError, match=r"bad\.idx: bad magic"):
        read_lengths(tmp_path / "bad")
    write_megatron_index(tmp_path / "cut", LENGTHS)
    idx = tmp_path / "cut.idx"
    idx.write_bytes(idx.read_bytes()[:40])
    with pytest.raises(ValueError, match=r"cut\.idx: truncated"):
        read_lengths(idx)


def test_dataset_dict_asks_for_a_split(tmp_path):
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train', 'test'\]"):
        read_lengths(tmp_path)


def test_cli_reports_bad_input_as_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.txt"
    path.write_text("1\nabc\n")
    assert main(["data", "stats", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bad.txt: line 2" in err
