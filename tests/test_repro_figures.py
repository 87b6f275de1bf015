"""Figures label failed and out-of-memory points, and e2e titles state the batch in tokens."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.experiments import e2e_throughput, scalability
from repro.figures import (
    batch_tokens_text,
    format_tokens,
    label_bars,
    mark_line_failures,
    new_figure,
    point_status,
    with_status,
)

NAN = math.nan


def _frame() -> pd.DataFrame:
    return pd.DataFrame([
        {"setting": "a", "method": "megatron", "speedup": 1.0, "oom": False, "error": "",
         "num_tokens": 1_130_000},
        {"setting": "a", "method": "flexsp", "speedup": NAN, "oom": None,
         "error": "ValueError: no parallel configuration fits", "num_tokens": 0},
        {"setting": "a", "method": "megatron-dcp", "speedup": 0.38, "oom": True, "error": "",
         "num_tokens": 1_130_000},
        {"setting": "b", "method": "megatron", "speedup": 1.0, "oom": False, "error": "",
         "num_tokens": 576_000},
        {"setting": "b", "method": "flexsp", "speedup": 2.03, "oom": False, "error": "",
         "num_tokens": 576_000},
        {"setting": "b", "method": "megatron-dcp", "speedup": NAN, "oom": False, "error": "",
         "num_tokens": 576_000},
    ])


def test_status_and_bar_labels_never_leave_a_silent_gap():
    frame = with_status(_frame(), "speedup")
    assert point_status(_frame()).tolist() == ["", "failed", "OOM", "", "", ""]
    assert frame["status"].tolist() == ["", "failed", "OOM", "", "", "n/a"]
    assert frame.loc[1, "speedup"] == 0.0  # drawn as a zero bar that carries its label
    fig, axes = new_figure()
    ax = axes[0][0]
    order, hue_order = ["a", "b"], ["megatron", "megatron-dcp", "flexsp"]
    sns.barplot(frame, x="setting", y="speedup", hue="method", order=order,
                hue_order=hue_order, ax=ax, errorbar=None)
    label_bars(ax, frame, x="setting", hue="method", order=order, hue_order=hue_order,
               value="speedup")
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(["1.00", "1.00", "OOM 0.38", "n/a", "failed", "2.03"])


def test_line_plots_mark_failed_points():
    records = pd.DataFrame([
        {"num_gpus": 64, "method": "megatron", "tokens_per_s": 5e4, "oom": False, "error": ""},
        {"num_gpus": 512, "method": "megatron", "tokens_per_s": NAN, "oom": None,
         "error": "RuntimeError: planning failed"},
        {"num_gpus": 512, "method": "slimpack", "tokens_per_s": 5e5, "oom": True, "error": ""},
    ])
    fig, axes = new_figure()
    frame = records.assign(status=point_status(records))
    assert mark_line_failures(axes[0][0], frame, x="num_gpus", y="tokens_per_s",
                              hue="method") == 2
    assert sorted(t.get_text() for t in axes[0][0].texts) == ["megatron: failed",
                                                              "slimpack: OOM"]


def test_batch_in_tokens_for_titles():
    assert (format_tokens(1_130_000), format_tokens(576_000)) == ("1.13M", "576K")
    assert batch_tokens_text(_frame(), ["setting"]) == "batch 576K-1.13M tokens"
    assert batch_tokens_text(_frame()[_frame()["setting"] == "a"], ["setting"]) == \
        "batch 1.13M tokens"


def test_e2e_and_scalability_figures_draw_with_failed_methods(tmp_path: Path):
    keys = {"model": "llama-13b", "dataset": "commoncrawl", "context": 65536, "seed": 0,
            "token_budget": 512 * 65536, "point_key": "p"}
    rows = [{**keys, "num_gpus": g, "method": m, "tokens_per_s": v, "oom": False, "error": e,
             "num_tokens": 33_500_000 if v == v else 0}
            for g in (64, 128, 512)
            for m, v, e in (("megatron", 1e5, ""), ("megatron-causal", 3e4, ""),
                            ("slimpack", NAN, "ValueError: no fit"))]
    records = pd.DataFrame(rows)
    at_128 = records[records["num_gpus"] == 128]
    assert e2e_throughput.panel_title(at_128) == (
        "512 x 64K-token samples per batch (batch 33.5M tokens), 128 GPUs (h800-80g)")
    paths = e2e_throughput.plot(at_128, tmp_path)
    assert [p.name for p in paths] == ["throughput.png"] and paths[0].stat().st_size
    (path,) = scalability.plot(records, tmp_path)
    assert path.stat().st_size > 0


def test_jittered_figures_are_the_same_file_on_every_drawing(tmp_path: Path):
    # Seaborn's strip plots jitter with NumPy's global generator: the same records drew a
    # different ablation.png and bands.png on every `repro plot` (session 21).
    import numpy as np

    from repro.experiments import ablation, robustness

    root = Path(__file__).resolve().parents[1] / "results"
    for experiment in (ablation, robustness):
        records = pd.read_csv(root / experiment.EXPERIMENT.name / "records.csv")
        np.random.seed(1)
        (first,) = experiment.plot(records, tmp_path / "one")
        np.random.seed(2)  # whatever the caller's generator holds
        before = np.random.get_state()[1].copy()
        (second,) = experiment.plot(records, tmp_path / "two")
        assert first.read_bytes() == second.read_bytes(), experiment.EXPERIMENT.name
        # The caller's generator is left as it was.
        assert (np.random.get_state()[1] == before).all()
