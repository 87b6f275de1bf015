"""Length profiles: a compact, shippable inverse CDF of a length distribution.

A profile is a quantile table (probabilities ``p`` and lengths ``Q(p)``) for the body, plus the
exact longest records of the source, each carrying probability ``1 / n_source``. Between table
knots the quantile function is interpolated linearly in log-length, which keeps heavy tails
smooth; the top records keep the extreme tail exact, where a few documents hold a large share
of tokens and of attention work.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TRUNCATION_POLICIES = ("split", "truncate", "drop")
PROFILE_KINDS = ("empirical", "parametric")
PROFILE_DIR_ENV = "SLIMPACK_PROFILE_DIR"


@dataclass(frozen=True, kw_only=True, eq=False)
class Profile:
    name: str
    kind: str
    """"empirical" (from real samples) or "parametric" (fitted to published facts)."""
    description: str
    provenance: str
    licence: str
    n_source: int
    """Documents in the source sample (empirical) or 0 (parametric)."""
    probabilities: np.ndarray
    """Increasing, from 0 to ``body_mass``; knots of the body's quantile function."""
    quantile_lengths: np.ndarray
    """Non-decreasing lengths at ``probabilities``."""
    top_records: np.ndarray
    """Exact longest lengths (ascending), each with probability ``top_record_mass``."""
    top_record_mass: float
    default_truncation: str = "split"
    truncation_note: str = ""
    parameters: dict = field(default_factory=dict)
    fitted_facts: list = field(default_factory=list)
    source_stats: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"profile {self.name!r}"
        if self.kind not in PROFILE_KINDS:
            raise ValueError(f"{where}: kind must be one of {PROFILE_KINDS}, got {self.kind!r}")
        if self.default_truncation not in TRUNCATION_POLICIES:
            raise ValueError(
                f"{where}: default_truncation must be one of {TRUNCATION_POLICIES}, "
                f"got {self.default_truncation!r}"
            )
        p, q = self.probabilities, self.quantile_lengths
        if p.ndim != 1 or p.size < 2 or p.size != q.size:
            raise ValueError(f"{where}: quantile table needs >= 2 matching probabilities/lengths")
        if p[0] != 0.0 or np.any(np.diff(p) <= 0):
            raise ValueError(f"{where}: probabilities must start at 0 and strictly increase")
        if np.any(np.diff(q) < 0) or q[0] < 1:
            raise ValueError(f"{where}: quantile lengths must be >= 1 and non-decreasing")
        if not math.isclose(self.body_mass + self.top_records.size * self.top_record_mass, 1.0,
                            rel_tol=0, abs_tol=1e-9):
            raise ValueError(
                f"{where}: last probability ({self.body_mass}) plus top-record mass "
                f"({self.top_records.size} x {self.top_record_mass}) must equal 1"
            )

    @property
    def body_mass(self) -> float:
        return float(self.probabilities[-1])

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF at ``u`` in [0, 1): float lengths (the sampler rounds them)."""
        u = np.asarray(u, dtype=np.float64)
        log_q = np.log(self.quantile_lengths.astype(np.float64))
        out = np.exp(np.interp(u, self.probabilities, log_q))
        if self.top_records.size:
            in_top = u >= self.body_mass
            rank = ((u[in_top] - self.body_mass) / self.top_record_mass).astype(np.int64)
            rank = np.minimum(rank, self.top_records.size - 1)
            out[in_top] = self.top_records[rank]
        return out

    def to_json_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "provenance": self.provenance,
            "licence": self.licence,
            "n_source": self.n_source,
            "truncation": {"default": self.default_truncation, "note": self.truncation_note},
            "parameters": self.parameters,
            "fitted_facts": self.fitted_facts,
            "source_stats": self.source_stats,
            "quantiles": {
                "probabilities": [float(f"{x:.12g}") for x in self.probabilities],
                "lengths": [_compact_number(x) for x in self.quantile_lengths],
            },
            "top_records": {
                "probability_each": self.top_record_mass,
                "lengths": [int(x) for x in self.top_records],
            },
        }

    @classmethod
    def from_json_dict(cls, payload: dict, *, where: str) -> Profile:
        try:
            return cls(
                name=payload["name"],
                kind=payload["kind"],
                description=payload["description"],
                provenance=payload["provenance"],
                licence=payload["licence"],
                n_source=int(payload["n_source"]),
                probabilities=np.array(payload["quantiles"]["probabilities"], dtype=np.float64),
                quantile_lengths=np.array(payload["quantiles"]["lengths"], dtype=np.float64),
                top_records=np.array(payload["top_records"]["lengths"], dtype=np.int64),
                top_record_mass=float(payload["top_records"]["probability_each"]),
                default_truncation=payload["truncation"]["default"],
                truncation_note=payload["truncation"].get("note", ""),
                parameters=payload.get("parameters", {}),
                fitted_facts=payload.get("fitted_facts", []),
                source_stats=payload.get("source_stats", {}),
            )
        except KeyError as exc:
            raise ValueError(f"{where}: profile JSON lacks field {exc.args[0]!r}") from None


def _compact_number(x: float) -> int | float:
    # One monotone rounding rule for every value, so a non-decreasing table stays so.
    rounded = float(f"{x:.7g}")
    return int(rounded) if rounded.is_integer() else rounded


def profiles_dir() -> Path:
    """``datasets/profiles`` of the repository (the package is installed editable)."""
    import os

    override = os.environ.get(PROFILE_DIR_ENV)
    directory = (
        Path(override) if override else Path(__file__).resolve().parents[2] / "datasets" / "profiles"
    )
    if not directory.is_dir():
        raise ValueError(
            f"profile directory {directory} not found; slimpack must run from a checkout of the "
            f"suite (pip install -e .), or set {PROFILE_DIR_ENV}"
        )
    return directory


def available_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name (e.g. ``"wikipedia"``) or a profile JSON by path."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".json" and candidate.exists():
        path = candidate
    else:
        path = profiles_dir() / f"{name_or_path}.json"
        if not path.exists():
            raise ValueError(
                f"unknown profile {str(name_or_path)!r}; available: {available_profiles()}"
            )
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: line {exc.lineno}: invalid JSON ({exc.msg})") from None
    return Profile.from_json_dict(payload, where=str(path))


def save_profile(profile: Profile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_json_dict(), indent=1) + "\n", encoding="utf-8")
    return path
