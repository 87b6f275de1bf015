"""Side-by-side length distributions: % of documents and % of tokens per log2 bin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from slimpack.data.stats import compute_stats


def plot_distributions(named_lengths: dict[str, np.ndarray], output: str | Path) -> Path:
    """One panel per source (log2 x-axis), bars for % docs and % tokens; saves ``output``."""
    import seaborn as sns
    from matplotlib.figure import Figure  # object API: no global pyplot state or backend

    output = Path(output)
    if not named_lengths:
        raise ValueError("plot needs at least one SOURCE")
    rows = []
    for name, lengths in named_lengths.items():
        for b in compute_stats(lengths).log2_hist:
            for measure, value in (("% docs", b.pct_docs), ("% tokens", b.pct_tokens)):
                rows.append({"source": name, "bin": max(b.hi, 1), "measure": measure,
                             "percent": value})
    frame = pd.DataFrame(rows)
    count = len(named_lengths)
    figure = Figure(figsize=(4.2 * count, 3.4), layout="constrained")
    axes = figure.subplots(1, count, sharey=True, squeeze=False)[0]
    for ax, name in zip(axes, named_lengths, strict=True):
        subset = frame[frame["source"] == name]
        sns.lineplot(data=subset, x="bin", y="percent", hue="measure", marker="o", ax=ax,
                     drawstyle="steps-pre")
        ax.set_xscale("log", base=2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("length (tokens, upper bin edge)")
        ax.set_ylabel("percent")
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    return output
