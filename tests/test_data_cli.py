"""``slimpack data stats|profile|plot`` end to end (numbers from summary_stats.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slimpack.cli.main import main
from slimpack.data import load_profile


def wiki_sample() -> Path:
    override = os.environ.get("SLIMPACK_SHARED_DIR")
    base = Path(override) if override else Path(__file__).resolve().parents[2] / "shared"
    folder = base / "length_distributions" if (base / "length_distributions").is_dir() else base
    path = folder / "flexsp_wikipedia_sample_1M.txt"
    if not path.exists():
        pytest.skip(f"raw length sample {path} not available (set SLIMPACK_SHARED_DIR)")
    return path


def test_stats_json_reproduces_the_wikipedia_sample(capsys):
    assert main(["data", "stats", str(wiki_sample()), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # summary_stats.json: n 1,000,000; median 347; p99 10,919; top-1% token share 21.9%.
    assert out["count"] == 1_000_000
    assert out["median"] == 347
    assert round(out["p99"]) == 10919
    assert round(out["token_share_top1pct"], 1) == 21.9
    assert round(out["p99_9"]) == 37353 and out["max"] == 1_823_777
    assert out["log2_hist"][0] == pytest.approx(
        {"lo": 0, "hi": 128, "pct_docs": 21.445, "pct_tokens": 1.83}, abs=0.005
    )


def test_stats_table_of_a_profile_name(capsys):
    assert main(["data", "stats", "byted-like"]) == 0
    out = capsys.readouterr().out
    assert "sampled from the parametric profile" in out
    assert "top 1% longest documents: 44.3% of tokens" in out  # ByteScale: 44.3%
    assert "% docs" in out and "% tokens" in out


def test_profile_then_stats_and_sampling_round_trip(tmp_path, capsys):
    data = tmp_path / "mine.txt"
    data.write_text("\n".join(str(n) for n in range(1, 5001)))
    out_file = tmp_path / "mine.json"
    assert main(["data", "profile", str(data), "-o", str(out_file), "--licence", "CC0"]) == 0
    profile = load_profile(out_file)
    assert profile.name == "mine" and profile.licence == "CC0" and profile.n_source == 5000
    capsys.readouterr()
    assert main(["data", "stats", str(out_file), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["median"] == pytest.approx(2500.5, rel=0.01)  # uniform 1..5000
    assert stats["max"] == 5000


def test_plot_writes_a_png(tmp_path, capsys):
    lengths = tmp_path / "small.json"
    lengths.write_text(json.dumps([100, 2000, 40000, 7, 300]))
    output = tmp_path / "dists.png"
    assert main(["data", "plot", "prolong", str(lengths), "-o", str(output)]) == 0
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_source_is_a_one_line_error(capsys):
    assert main(["data", "stats", "not-a-profile"]) == 2
    err = capsys.readouterr().err
    assert "not-a-profile: neither an existing file/folder nor a profile name" in err
    assert "wikipedia" in err
