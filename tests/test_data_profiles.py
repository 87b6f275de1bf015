"""Shipped profiles and the sampler.

Reference numbers come from ../shared/length_distributions/summary_stats.json (computed from
the raw samples), FlexSP (arXiv 2412.01523) and ByteScale (arXiv 2502.21231).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from slimpack.batch import Batch
from slimpack.data import (
    SamplerConfig,
    available_profiles,
    compute_stats,
    load_profile,
    read_lengths,
    sample_batch,
    sample_lengths,
)
from slimpack.data.profile import profiles_dir
from slimpack.data.profile_moments import share_at_least
from slimpack.data.sampler import apply_truncation

SHIPPED = ["byted-like", "commoncrawl", "github", "prolong", "wikipedia", "wlb-llm"]

# summary_stats.json: (median, p99, % tokens in the top 1% of documents) of each raw sample.
SOURCE_STATS = {
    "wikipedia": (347, 10919, 21.9),
    "wlb-llm": (3227, 26058, 17.8),
    "prolong": (1913, 16269, 10.4),
}


def shared_dir() -> Path:
    override = os.environ.get("SLIMPACK_SHARED_DIR")
    base = Path(override) if override else Path(__file__).resolve().parents[2] / "shared"
    return base / "length_distributions" if (base / "length_distributions").is_dir() else base


def require_shared(filename: str) -> Path:
    path = shared_dir() / filename
    if not path.exists():
        pytest.skip(f"raw length sample {path} not available (set SLIMPACK_SHARED_DIR)")
    return path


def test_every_profile_ships_loads_and_is_small():
    assert available_profiles() == SHIPPED
    for name in SHIPPED:
        path = profiles_dir() / f"{name}.json"
        assert path.stat().st_size < 400 * 1024
        payload = json.loads(path.read_text())
        for key in ("name", "kind", "description", "provenance", "licence", "n_source",
                    "quantiles", "top_records", "truncation"):
            assert key in payload, (name, key)
        assert payload["truncation"]["default"] in ("split", "truncate", "drop")
        assert payload["truncation"]["note"]
        profile = load_profile(name)
        assert profile.name == name
        assert profile.probabilities.size >= 2000  # fine enough to keep the tail


def test_empirical_profiles_keep_exact_top_records():
    wiki = load_profile("wikipedia")
    assert wiki.kind == "empirical" and wiki.n_source == 1_000_000
    assert wiki.top_records.size == 1000  # the longest 0.1%
    assert wiki.top_records.max() == 1_823_777  # summary_stats.json max
    assert load_profile("prolong").top_records.max() == 340_149
    assert load_profile("wlb-llm").top_records.max() == 124_913


@pytest.mark.parametrize("name", sorted(SOURCE_STATS))
def test_100k_batch_matches_source_sample(name):
    """Issue 3 'must show': median and p99 within 3%, top-1% token share within 2 points.

    Stratified draws remove sampling noise so the check measures the profile's fidelity; iid
    draws are checked with a tolerance set by their own noise (p99 of a 100k batch of wlb-llm
    varies by ~6% s.d. across seeds even when bootstrapping the raw sample).
    """
    median, p99, top_share = SOURCE_STATS[name]
    stats = compute_stats(
        sample_lengths(
            load_profile(name),
            SamplerConfig(num_sequences=100_000, seed=0, sampling="stratified"),
        )
    )
    assert stats.median == pytest.approx(median, rel=0.03)
    assert stats.p99 == pytest.approx(p99, rel=0.03)
    assert stats.token_share_top1pct == pytest.approx(top_share, abs=2.0)
    iid = compute_stats(np.array(sample_batch(name, num_sequences=100_000, seed=0).lengths))
    assert iid.median == pytest.approx(median, rel=0.03)
    assert iid.p99 == pytest.approx(p99, rel=0.15)
    assert iid.token_share_top1pct == pytest.approx(top_share, abs=2.0)


def test_wikipedia_matches_flexsp_claim_and_other_corpora_have_heavier_tails():
    # FlexSP: >96% of Wikipedia sequences are under 8K; GitHub and Common Crawl have more
    # sequences above 32K than Wikipedia.
    wiki = load_profile("wikipedia")
    under_8k = 1 - share_at_least(wiki, 8192)[0]
    assert under_8k > 0.96
    wiki_above_32k = share_at_least(wiki, 32769)[0]
    assert wiki_above_32k == pytest.approx(0.0013, abs=0.0002)  # raw sample: 0.130%
    for name in ("commoncrawl", "github"):
        assert share_at_least(load_profile(name), 32769)[0] > 3 * wiki_above_32k


def test_parametric_profiles_meet_their_fitted_facts():
    for name in ("commoncrawl", "github", "byted-like"):
        profile = load_profile(name)
        assert profile.kind == "parametric"
        assert profile.fitted_facts
        for fact in profile.fitted_facts:
            assert fact["achieved"] == pytest.approx(fact["target"], rel=0.02), (name, fact)
    # ByteScale: 16.2% of GitHub tokens are in sequences longer than 128K.
    assert share_at_least(load_profile("github"), 131073)[1] == pytest.approx(0.162, abs=0.002)
    byted = load_profile("byted-like")
    # ByteScale: ~80% of samples <= 4K; the 1% >= 128K hold 44.3% of tokens; 0.05% >= 2M hold
    # 12.1%.
    assert 1 - share_at_least(byted, 4097)[0] == pytest.approx(0.80, abs=0.005)
    docs, tokens = share_at_least(byted, 131072)
    assert docs == pytest.approx(0.01, rel=0.02) and tokens == pytest.approx(0.443, abs=0.005)
    docs, tokens = share_at_least(byted, 2 * 1024 * 1024)
    assert docs == pytest.approx(0.0005, rel=0.02) and tokens == pytest.approx(0.121, abs=0.005)


def test_byted_like_sampled_batch_shows_its_facts():
    lengths = sample_lengths(
        load_profile("byted-like"),
        SamplerConfig(num_sequences=200_000, seed=0, sampling="stratified"),
    )
    total = lengths.sum()
    assert np.mean(lengths <= 4096) == pytest.approx(0.80, abs=0.01)
    assert lengths[lengths >= 131072].sum() / total == pytest.approx(0.443, abs=0.03)


# --- the sampler -----------------------------------------------------------------------


def test_same_seed_same_batch_and_pinned_values():
    first = sample_batch("wikipedia", num_sequences=512, seed=7)
    again = sample_batch("wikipedia", num_sequences=512, seed=7)
    assert isinstance(first, Batch)
    assert first == again and first.seed == 7 and first.source == "wikipedia"
    assert sample_batch("wikipedia", num_sequences=512, seed=8) != first
    # Pinned: numpy PCG64 doubles are platform-independent, so these must hold everywhere.
    assert sample_batch("wikipedia", num_sequences=8, seed=0).lengths == [
        530, 155, 63, 45, 1173, 2384, 482, 782,
    ]
    assert sample_batch("byted-like", num_sequences=8, seed=1234).lengths == [
        95868, 855, 31146, 594, 712, 333, 555, 711,
    ]


@pytest.mark.parametrize("count", [512, 2048])
def test_batch_by_sequence_count(count):
    batch = sample_batch("prolong", num_sequences=count, context=8192, seed=1)
    assert len(batch) == count
    assert max(batch.lengths) <= 8192


def test_batch_by_token_budget_is_exact():
    batch = sample_batch("wikipedia", token_budget=4_000_000, context=32768, seed=0)
    assert batch.num_tokens == 4_000_000
    assert max(batch.lengths) <= 32768


def test_truncation_policies():
    docs = np.array([10, 25, 3, 40], dtype=np.int64)
    assert apply_truncation(docs, 10, "split").tolist() == [10, 10, 10, 5, 3, 10, 10, 10, 10]
    assert apply_truncation(docs, 10, "truncate").tolist() == [10, 10, 3, 10]
    assert apply_truncation(docs, 10, "drop").tolist() == [10, 3]
    assert apply_truncation(docs, None, "drop").tolist() == docs.tolist()


def test_split_keeps_every_token_of_the_drawn_documents():
    uncapped = sample_lengths(load_profile("byted-like"), SamplerConfig(num_sequences=5000))
    split = apply_truncation(uncapped, 32768, "split")
    assert split.sum() == uncapped.sum() and split.max() <= 32768


def test_sampler_config_errors_name_the_field():
    with pytest.raises(ValueError, match="exactly one of num_sequences or token_budget"):
        sample_batch("wikipedia")
    with pytest.raises(ValueError, match="context must be a positive integer"):
        sample_batch("wikipedia", num_sequences=4, context=0)
    with pytest.raises(ValueError, match="truncation must be one of"):
        sample_batch("wikipedia", num_sequences=4, context=10, truncation="chop")
    with pytest.raises(ValueError, match="unknown|neither an existing file"):
        sample_batch("no-such-profile", num_sequences=4)


def test_drop_with_a_context_below_every_document_fails_clearly(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("5000\n6000\n")
    with pytest.raises(ValueError, match="almost every document is dropped"):
        sample_batch(path, num_sequences=4, context=100, truncation="drop")


def test_sampling_from_a_file_draws_its_own_records(tmp_path):
    path = tmp_path / "few.txt"
    path.write_text("100\n200\n300\n")
    batch = sample_batch(path, num_sequences=300, seed=3)
    assert set(batch.lengths) == {100, 200, 300}
    assert batch.source == str(path)


def test_shipped_empirical_profile_is_reproducible_from_shared():
    from slimpack.data.shipped_profiles import EMPIRICAL_SPECS, build_empirical

    spec = next(s for s in EMPIRICAL_SPECS if s.name == "wlb-llm")
    require_shared(spec.filename)
    rebuilt = build_empirical(spec, shared_dir()).to_json_dict()
    shipped = json.loads((profiles_dir() / "wlb-llm.json").read_text())
    assert json.loads(json.dumps(rebuilt)) == shipped


def test_wikipedia_sample_statistics_match_summary_stats():
    stats = compute_stats(read_lengths(require_shared("flexsp_wikipedia_sample_1M.txt")).lengths)
    # summary_stats.json: n 1,000,000, median 347, p99 10,919, top-1% token share 21.9%,
    # attention share 83.8%, max 1,823,777.
    assert stats.count == 1_000_000
    assert stats.median == 347
    assert round(stats.p99) == 10919
    assert stats.token_share_top1pct == pytest.approx(21.9, abs=0.05)
    assert stats.attn_share_top1pct == pytest.approx(83.8, abs=0.05)
    assert stats.max == 1_823_777
    assert stats.log2_hist[1].pct_docs == pytest.approx(20.204, abs=0.001)  # (128, 256]
