"""Seaborn figure helpers: headless backend, one house style, deterministic files."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: figures are written on machines without a display

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

# seaborn 0.13 passes `vert` to matplotlib >= 3.10 boxplots (ECOSYSTEM.md); harmless.
warnings.filterwarnings("ignore", message=".*vert.*", category=matplotlib.MatplotlibDeprecationWarning)

METHOD_ORDER = ("naive", "megatron", "megatron-causal", "megatron-dcp", "wlb-llm", "flexsp",
                "slimpipe", "slimpack")


def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 5.0, height: float = 3.6,
               sharey: bool = False):
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind")
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             sharey=sharey, squeeze=False)
    return fig, axes


def method_order(present: object) -> list[str]:
    """Known methods in paper order, then any others alphabetically."""
    names = [str(m) for m in present]
    known = [m for m in METHOD_ORDER if m in names]
    return known + sorted(set(names) - set(known))


def save(fig, out_dir: Path, name: str) -> Path:
    """Write ``out_dir/name`` (PNG, no timestamp metadata) and close the figure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def placeholder(out_dir: Path, name: str, message: str) -> Path:
    """A figure that says why there is no data, instead of silently missing."""
    fig, axes = new_figure()
    ax = axes[0][0]
    ax.axis("off")
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=10)
    return save(fig, out_dir, name)
