"""What an experiment is: a sweep of JSON-able points, how to run one, plot and judge the records.

An experiment module builds one :class:`Experiment`. The harness never looks inside a point: it
hashes it, hands it to ``run_point`` (in a worker process), and stores the flat rows that come
back. Figures and claims are computed from the stored records only, so ``plot`` and ``report``
need no rerun and never disagree with the CSV.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

Point = dict[str, Any]
Row = dict[str, Any]

BACKENDS = ("sim", "runtime")


# -- claims -----------------------------------------------------------------------------------


CHECK_KINDS = ("within", "at_least", "at_most", "between")
CLAIM_KINDS = ("claim", "consistency")
"""``claim``: a published number we try to reproduce, a verdict that can go either way.
``consistency``: a check that the suite agrees with itself (a closed form, a model's own
budget, a rule true by construction of the schedule); reported in its own table, never counted
as a reproduced claim."""


@dataclass(frozen=True, kw_only=True)
class Check:
    """How a reproduced value is compared with the paper's: the verdict rule.

    ``kind``:
    * ``within``: ``|reproduced - target| <= rel_tol * |target|``;
    * ``at_least``: ``reproduced >= target``;
    * ``at_most``: ``reproduced <= target``;
    * ``between``: ``target <= reproduced <= upper`` (a published range, both ends checked).

    ``reason`` says in one line why the tolerance or bound is what it is (a published range, a
    measurement's noise, float rounding...), so no tolerance is set just above the observed
    value without a word.
    """

    kind: str
    target: float
    reason: str
    rel_tol: float = 0.0
    upper: float | None = None
    """Upper end of a ``between`` range (``target`` is the lower); None for other kinds."""

    def __post_init__(self) -> None:
        if self.kind not in CHECK_KINDS:
            raise ValueError(f"Check.kind must be one of {', '.join(CHECK_KINDS)}; got {self.kind!r}")
        if not math.isfinite(self.target):
            raise ValueError(f"Check.target must be finite, got {self.target}")
        if not math.isfinite(self.rel_tol) or self.rel_tol < 0:
            raise ValueError(f"Check.rel_tol must be a finite number >= 0, got {self.rel_tol}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("Check.reason must be a non-empty line saying why the tolerance "
                             "or bound is what it is")
        if "\n" in self.reason.strip():
            raise ValueError(f"Check.reason must be one line, got {self.reason!r}")
        if self.kind == "between":
            if self.upper is None or not math.isfinite(self.upper) or self.upper < self.target:
                raise ValueError(f"Check.upper must be a finite number >= target ({self.target}) "
                                 f"for kind 'between', got {self.upper}")
        elif self.upper is not None:
            raise ValueError(f"Check.upper is only for kind 'between', got {self.upper} with "
                             f"kind {self.kind!r}")

    def passes(self, value: float) -> bool:
        if self.kind == "within":
            return abs(value - self.target) <= self.rel_tol * abs(self.target)
        if self.kind == "at_least":
            return value >= self.target
        if self.kind == "between":
            return self.target <= value <= self.upper
        return value <= self.target

    def describe(self) -> str:
        if self.kind == "within":
            tol = f"{self.rel_tol:.0%}" if self.rel_tol >= 0.01 else f"{self.rel_tol:.0e} (relative)"
            return f"within {tol} of {self.target:.4g}"
        if self.kind == "between":
            return f"between {self.target:g} and {self.upper:g}"
        return f"{'>=' if self.kind == 'at_least' else '<='} {self.target:g}"


def between(lo: float, hi: float, *, reason: str) -> Check:
    """``lo <= reproduced <= hi``: a published range, checked at both ends."""
    return Check(kind="between", target=lo, upper=hi, reason=reason)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One published number and our reproduction of it, computed from the records."""

    claim_id: str
    """Stable key (golden files and tests refer to it)."""
    text: str
    source: str
    """Paper and place, e.g. 'SlimPipe arXiv 2504.14519 (abstract)'."""
    paper_value: str
    """The paper's number as it states it ('124K', 'up to 2.8x')."""
    reproduced: float
    """Our value (NaN when the records hold no data for it)."""
    unit: str
    check: Check
    hardware: str
    """Hardware preset the number belongs to (golden files are kept per preset)."""
    golden_rel_tol: float | None = 0.02
    """How far the reproduced value may move between code versions before regression fails;
    None for wall-clock numbers, which are not regression headlines."""
    kind: str = "claim"
    """``claim`` or ``consistency`` (see :data:`CLAIM_KINDS`)."""
    bracket: tuple[tuple[str, float], ...] = ()
    """The same ratio against each baseline of a bracket, ``(baseline, value)``, first the one
    ``reproduced`` is (and the verdict judges): e.g. SlimPack over ``megatron`` (document
    masks) and over ``megatron-causal`` (no masks), since which one the paper ran is not known."""
    analysis: str = ""
    """What the records show about why the value is what it is, computed from them (shown in
    REPORT.md for every claim that is not reproduced)."""

    def __post_init__(self) -> None:
        if self.kind not in CLAIM_KINDS:
            raise ValueError(f"Claim {self.claim_id}: kind must be one of {CLAIM_KINDS}, "
                             f"got {self.kind!r}")
        if self.bracket:
            first = self.bracket[0][1]
            same = (first == self.reproduced
                    or (math.isnan(first) and math.isnan(self.reproduced)))
            if not same:
                raise ValueError(f"Claim {self.claim_id}: bracket[0] ({self.bracket[0][0]} = "
                                 f"{first}) must be the reproduced value {self.reproduced}")

    @property
    def verdict(self) -> str:
        if not math.isfinite(self.reproduced):
            return "no data"
        return "reproduced" if self.check.passes(self.reproduced) else "not reproduced"

    def reproduced_text(self) -> str:
        if self.bracket:
            return ", ".join(
                f"{format_value(v, self.unit) if math.isfinite(v) else 'n/a'} vs {name}"
                for name, v in self.bracket)
        if not math.isfinite(self.reproduced):
            return "n/a"
        return format_value(self.reproduced, self.unit)


def format_value(value: float, unit: str) -> str:
    if unit == "K tokens":
        return f"{value:,.0f}K"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f}%"
    if unit in ("ms", "s", "GiB"):
        return f"{value:.3g} {unit}"
    return f"{value:.4g}{(' ' + unit) if unit else ''}"


# -- experiments ------------------------------------------------------------------------------


def no_plots(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    return []


def no_claims(records: pd.DataFrame) -> list[Claim]:
    return []


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """One paper figure or claim as a sweep.

    ``points(quick)`` must be deterministic, and the quick sweep must be a subset of the full
    one (so records from either mode mean the same thing and can share one CSV).
    ``run_point(point)`` returns flat rows (scalars or JSON strings), normally
    ``StepRecord.to_row()`` plus the point's own keys.
    """

    name: str
    description: str
    points: Callable[[bool], list[Point]]
    run_point: Callable[[Point], list[Row]]
    plot: Callable[[pd.DataFrame, Path], list[Path]] = no_plots
    claims: Callable[[pd.DataFrame], list[Claim]] = no_claims
    backends: tuple[str, ...] = ("sim",)
    """Backends the sweep can run on; 'sim' also covers purely analytic experiments."""
    needs: tuple[str, ...] = ()
    """Library modules the sweep imports (shown by ``repro list`` and in errors)."""
    timing_columns: tuple[str, ...] = ()
    """Columns holding wall-clock measurements: the only ones allowed to differ between runs."""
    tables: Callable[[pd.DataFrame], list[tuple[str, pd.DataFrame]]] | None = None
    """Optional (title, frame) tables computed from the records, shown in REPORT.md under the
    experiment's section (e.g. per-component gains with their spread)."""
    point_cost: Callable[[Point], float] | None = None
    """Optional hint: a point's expected cost (roughly seconds of one core; None means 1 for
    every point). ``repro run --jobs N`` starts the costliest points of all selected
    experiments first, so a long point does not start last and leave the other cores idle.
    Called in the parent with the point's config (``backend`` included); it orders work and
    never enters a record or a point's key."""

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.strip().lower() or " " in self.name:
            raise ValueError(f"Experiment.name must be a lower-case slug, got {self.name!r}")
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad or not self.backends:
            raise ValueError(f"Experiment.backends must be a non-empty subset of {BACKENDS}, got "
                             f"{self.backends!r}")
