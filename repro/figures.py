"""Seaborn figure helpers: headless backend, one house style, deterministic files."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # before pyplot: figures are written on machines without a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

if TYPE_CHECKING:
    from slimpack.methods import MethodRegistry

# seaborn 0.13 passes `vert` to matplotlib >= 3.10 boxplots (ECOSYSTEM.md); harmless.
warnings.filterwarnings("ignore", message=".*vert.*", category=matplotlib.MatplotlibDeprecationWarning)

def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 5.0, height: float = 3.6,
               sharey: bool = False):
    sns.set_theme(style="whitegrid", context="notebook", palette="colorblind")
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             sharey=sharey, squeeze=False)
    return fig, axes


def method_order(present: object, registry: MethodRegistry | None = None) -> list[str]:
    """Registered methods in the registry's order (``registry``, None: the suite's
    ``slimpack.methods.DEFAULT_METHODS``), then any others (variants such as
    ``megatron-1f1b``) alphabetically."""
    from slimpack.methods import DEFAULT_METHODS

    names = [str(m) for m in present]
    known = [m for m in (registry or DEFAULT_METHODS).names() if m in names]
    return known + sorted(set(names) - set(known))


JITTER_SEED = 0


@contextlib.contextmanager
def fixed_jitter(seed: int = JITTER_SEED):
    """Seaborn's ``stripplot`` draws its jitter from NumPy's global generator, so a figure
    changed on every drawing of the same records. Inside this block the generator starts from
    ``seed``; its state before is restored after, so nothing outside sees the seed."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


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


# -- failed and out-of-memory points: labelled, never a silent gap ------------------------------
FAILED, OOM, NO_VALUE = "failed", "OOM", "n/a"


def point_status(frame):  # noqa: ANN001, ANN201 - DataFrame in, Series out
    """Per row: ``failed`` (planning raised: ``error`` set, or no value), ``OOM`` (planned but
    out of memory) or ``""`` (ran and fits)."""
    import pandas as pd

    status = pd.Series("", index=frame.index, dtype=object)
    if "oom" in frame.columns:
        status[frame["oom"].astype(str).str.strip().str.lower() == "true"] = OOM
    if "error" in frame.columns:
        status[frame["error"].fillna("").astype(str).str.strip() != ""] = FAILED
    return status


def with_status(frame, value: str):  # noqa: ANN001, ANN201
    """``frame`` plus a ``status`` column; rows without a value (failed, or ``n/a`` when e.g.
    the baseline of a ratio failed) get ``value`` 0 so they still draw a (zero-height) bar
    that carries the label, instead of vanishing from the figure."""
    status = point_status(frame)
    missing = frame[value].isna() if value in frame.columns else status.eq(status)
    status[missing & status.eq("")] = NO_VALUE
    out = frame.assign(status=status)
    out.loc[out["status"].isin([FAILED, NO_VALUE]), value] = 0.0
    return out


def label_bars(ax, frame, *, x: str, hue: str, order: list, hue_order: list, value: str,  # noqa: ANN001
               fmt: str = "{:.2f}", fontsize: float = 5) -> None:
    """Label each bar of a seaborn hue barplot with its value, ``OOM <value>`` or ``failed``.

    Seaborn draws one container per hue level present (in ``hue_order``), each holding the
    bars of the x levels where that hue has a row; a bar's x centre rounds to its x level.
    ``frame`` must come from :func:`with_status` so failed rows have a (zero) bar.
    """
    present = [h for h in hue_order if h in set(frame[hue])]
    lookup = {(r[x], r[hue]): r for _, r in frame.iterrows()}
    for level, container in zip(present, ax.containers, strict=False):
        labels = []
        for patch in container.patches:
            xi = int(round(patch.get_x() + patch.get_width() / 2))
            row = lookup.get((order[xi], level)) if 0 <= xi < len(order) else None
            if row is None:
                labels.append("")
            elif row["status"] in (FAILED, NO_VALUE):
                labels.append(row["status"])
            elif row["status"] == OOM:
                labels.append(f"{OOM} {fmt.format(row[value])}")
            else:
                labels.append(fmt.format(row[value]))
        ax.bar_label(container, labels=labels, fontsize=fontsize, rotation=90, padding=1)


def mark_line_failures(ax, frame, *, x: str, y: str, hue: str) -> int:  # noqa: ANN001
    """Mark failed points (at the bottom of the axes) and OOM points (at their value) of a
    line plot with their status; returns how many were marked."""
    import matplotlib.transforms as mtransforms

    marked = 0
    bottom = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for _, row in frame[frame["status"] != ""].iterrows():
        text = f"{row[hue]}: {row['status']}"
        if row["status"] in (FAILED, NO_VALUE):
            ax.plot([row[x]], [0.03], marker="x", color="red", transform=bottom)
            ax.annotate(text, (row[x], 0.03), xycoords=bottom, xytext=(3, 3 + 8 * marked),
                        textcoords="offset points", fontsize=6, color="red")
        else:
            ax.plot([row[x]], [row[y]], marker="x", color="red", markersize=8)
            ax.annotate(text, (row[x], row[y]), xytext=(3, -9), textcoords="offset points",
                        fontsize=6, color="red")
        marked += 1
    return marked


def format_tokens(tokens: float) -> str:
    """A batch size in tokens for titles: 1.13M, 576K."""
    if tokens >= 1e6:
        return f"{tokens / 1e6:.3g}M"
    return f"{tokens / 1e3:.3g}K"


def batch_tokens_text(frame, keys: list[str]) -> str:  # noqa: ANN001
    """'batch 576K tokens' or 'batch 576K-1.13M tokens' over the points in ``frame`` (a point's
    batch is its largest ``num_tokens``: a failed method's row holds 0)."""
    if frame.empty or "num_tokens" not in frame.columns:
        return "batch: tokens unknown"
    per_point = frame.groupby(keys)["num_tokens"].max()
    per_point = per_point[per_point > 0]
    if per_point.empty:
        return "batch: tokens unknown"
    lo, hi = format_tokens(per_point.min()), format_tokens(per_point.max())
    return f"batch {lo} tokens" if lo == hi else f"batch {lo}-{hi} tokens"
