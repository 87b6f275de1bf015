"""Parametric "-like" profiles for corpora we have no raw samples of (Common Crawl, GitHub,
ByteScale's production mix), fitted to published facts.

The model is a spliced distribution: a lognormal body on [1, b0] holding mass F(b0), then
truncated power-law (Pareto) segments [b_k, b_k+1] up to ``max_length``, each with its own
exponent. Break points sit at the thresholds the facts talk about, so a published share such
as "80% of samples <= 4K" is the CDF at a break point, met exactly; the exponents and the
longest length are fitted to the remaining facts (token shares). A single lognormal + Pareto
mixture cannot meet ByteScale's facts together (the tail's count and token shares pull its
exponent in opposite directions), hence one exponent per segment.

The fit minimises squared log-errors of the facts, evaluated exactly on the quantile table that
ships (``profile_math``), so the reported achieved values are those of the shipped profile.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from slimpack.data.nelder_mead import nelder_mead
from slimpack.data.profile import Profile
from slimpack.data.profile_moments import quantile_at, share_at_least

BODY_QUANTILES = 2048
TAIL_KNOTS = 1024
SMALLEST_TAIL_PROBABILITY = 1e-9
CDF_GRID_POINTS = 4000
FIT_RESTARTS = 4


@dataclass(frozen=True, kw_only=True)
class SplicedParetoModel:
    """Lognormal body on [1, breaks[0]], power-law segments from each break to the next."""

    mu: float
    sigma: float
    """Log-mean and log-sd of the (truncated) lognormal body."""
    breaks: tuple[float, ...]
    cdf_at_breaks: tuple[float, ...]
    """F(breaks[k]): the fraction of documents of length <= breaks[k]."""
    alphas: tuple[float, ...]
    """Pareto exponent of the segment that starts at breaks[k]."""
    max_length: float

    def __post_init__(self) -> None:
        edges = (1.0, *self.breaks, self.max_length)
        masses = (0.0, *self.cdf_at_breaks, 1.0)
        if len(self.breaks) != len(self.cdf_at_breaks) or len(self.breaks) != len(self.alphas):
            raise ValueError("breaks, cdf_at_breaks and alphas must have the same length")
        if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
            raise ValueError(f"breaks must rise from 1 to max_length, got {edges}")
        if any(b <= a for a, b in zip(masses, masses[1:], strict=False)):
            raise ValueError(f"cdf_at_breaks must rise strictly inside (0, 1), got {masses}")
        if self.sigma <= 0 or any(a <= 0 for a in self.alphas):
            raise ValueError("sigma and alphas must be positive")

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        body_end = self.breaks[0]
        lo, hi = _lognormal_cdf(np.array([1.0, body_end]), self.mu, self.sigma)
        body = (_lognormal_cdf(np.clip(x, 1.0, body_end), self.mu, self.sigma) - lo) / (hi - lo)
        out = self.cdf_at_breaks[0] * body
        edges = (*self.breaks, self.max_length)
        masses = (*self.cdf_at_breaks, 1.0)
        for k, alpha in enumerate(self.alphas):
            start, end = edges[k], edges[k + 1]
            inside = np.clip(x, start, end)
            fraction = (1 - (start / inside) ** alpha) / (1 - (start / end) ** alpha)
            segment = masses[k] + (masses[k + 1] - masses[k]) * fraction
            out = np.where(x > start, segment, out)
        return out


def _lognormal_cdf(x: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    z = (np.log(np.maximum(x, 1e-300)) - mu) / (sigma * math.sqrt(2.0))
    return 0.5 * (1.0 + np.array([math.erf(v) for v in z.ravel()]).reshape(z.shape))


def quantile_table(model: SplicedParetoModel) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities (uniform body + log-spaced tail down to 1e-9) and the model's quantiles."""
    grid = np.unique(
        np.concatenate(
            [np.geomspace(1.0, model.max_length, CDF_GRID_POINTS), list(model.breaks)]
        )
    )
    cdf = model.cdf(grid)
    keep = np.concatenate([[True], np.diff(cdf) > 0])  # interp needs a strictly rising CDF
    grid, cdf = grid[keep], cdf[keep]
    probs = np.unique(
        np.concatenate(
            [
                np.linspace(0.0, 1.0, BODY_QUANTILES),
                1.0 - np.geomspace(0.1, SMALLEST_TAIL_PROBABILITY, TAIL_KNOTS),
            ]
        )
    )
    lengths = np.exp(np.interp(probs, cdf, np.log(grid)))
    lengths = np.maximum.accumulate(np.maximum(lengths, 1.0))
    return probs, np.round(lengths, 2)


@dataclass(frozen=True, kw_only=True)
class Fact:
    """One number a parametric profile is fitted to."""

    quantity: str
    """median | docs_at_most | docs_at_least | tokens_at_least (fractions, not percent)."""
    threshold: float
    target: float
    source: str
    published: bool
    """False marks our own assumption, made where the literature gives only a direction."""

    def evaluate(self, profile: Profile) -> float:
        if self.quantity == "median":
            return quantile_at(profile, 0.5)
        docs, tokens = share_at_least(profile, self.threshold)
        if self.quantity == "docs_at_least":
            return docs
        if self.quantity == "docs_at_most":
            return 1.0 - share_at_least(profile, self.threshold + 1)[0]
        if self.quantity == "tokens_at_least":
            return tokens
        raise ValueError(f"Fact.quantity {self.quantity!r} is not one of the four supported")


@dataclass(frozen=True, kw_only=True)
class ParametricSpec:
    name: str
    description: str
    provenance: str
    facts: tuple[Fact, ...]
    start: SplicedParetoModel
    free: tuple[str, ...]
    """Model fields the fit may move, e.g. ``"mu"``, ``"alphas[1]"``, ``"max_length"``; the
    others stay at ``start`` (stated assumptions or facts met by construction)."""
    default_truncation: str = "split"
    truncation_note: str = ""


_FIELD = re.compile(r"^(?P<name>\w+)(\[(?P<index>\d+)\])?$")


def _get(model: SplicedParetoModel, field_name: str) -> float:
    match = _FIELD.match(field_name)
    value = getattr(model, match["name"])
    return value[int(match["index"])] if match["index"] is not None else value


def _to_vector(model: SplicedParetoModel, free: tuple[str, ...]) -> np.ndarray:
    # Unconstrained coordinates: identity for mu, logit for probabilities, log otherwise.
    out = []
    for field_name in free:
        value = _get(model, field_name)
        if field_name == "mu":
            out.append(value)
        elif field_name.startswith("cdf_at_breaks"):
            out.append(math.log(value / (1 - value)))
        else:
            out.append(math.log(value))
    return np.array(out)


def _from_vector(
    vector: np.ndarray, base: SplicedParetoModel, free: tuple[str, ...]
) -> SplicedParetoModel:
    values = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(base).items()}
    for field_name, coordinate in zip(free, vector, strict=True):
        if field_name == "mu":
            value = float(coordinate)
        elif field_name.startswith("cdf_at_breaks"):
            value = 1 / (1 + math.exp(-coordinate))
        else:
            value = math.exp(coordinate)
        match = _FIELD.match(field_name)
        if match["index"] is None:
            values[match["name"]] = value
        else:
            values[match["name"]][int(match["index"])] = value
    return SplicedParetoModel(
        **{k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items()}
    )


def _profile_from_model(spec: ParametricSpec, model: SplicedParetoModel) -> Profile:
    probs, lengths = quantile_table(model)
    return Profile(
        name=spec.name,
        kind="parametric",
        description=spec.description,
        provenance=spec.provenance,
        licence="Own reconstruction (Apache-2.0, as the suite); the facts are cited, no data copied.",
        n_source=0,
        probabilities=probs,
        quantile_lengths=lengths,
        top_records=np.zeros(0, dtype=np.int64),
        top_record_mass=0.0,
        default_truncation=spec.default_truncation,
        truncation_note=spec.truncation_note,
    )


def fit_parametric_profile(spec: ParametricSpec) -> Profile:
    def loss(vector: np.ndarray) -> float:
        try:
            model = _from_vector(vector, spec.start, spec.free)
            profile = _profile_from_model(spec, model)
        except (ValueError, OverflowError, ZeroDivisionError):
            return 1e6
        errors = [
            math.log(max(f.evaluate(profile), 1e-12) / f.target) for f in spec.facts
        ]
        return float(np.sum(np.square(errors)))

    # Restart from the best point: Nelder-Mead simplices collapse early on ridged losses.
    best = _to_vector(spec.start, spec.free)
    for _ in range(FIT_RESTARTS):
        best = nelder_mead(loss, best, step=0.3, max_iterations=1500)
    model = _from_vector(best, spec.start, spec.free)
    profile = _profile_from_model(spec, model)
    achieved = [
        {**asdict(fact), "achieved": round(fact.evaluate(profile), 6)} for fact in spec.facts
    ]
    return Profile(
        **{
            **{k: getattr(profile, k) for k in _PROFILE_FIELDS},
            "parameters": {
                "model": "LogNormal(mu, sigma) body on [1, breaks[0]], then a truncated "
                "Pareto(alphas[k]) segment from each break to the next / max_length; "
                "cdf_at_breaks[k] = share of documents <= breaks[k]",
                **_rounded(asdict(model)),
                "fitted": list(spec.free),
            },
            "fitted_facts": achieved,
        }
    )


def _rounded(values: dict) -> dict:
    def one(v):
        return [one(x) for x in v] if isinstance(v, list | tuple) else round(float(v), 6)

    return {k: one(v) for k, v in values.items()}


_PROFILE_FIELDS = (
    "name",
    "kind",
    "description",
    "provenance",
    "licence",
    "n_source",
    "probabilities",
    "quantile_lengths",
    "top_records",
    "top_record_mass",
    "default_truncation",
    "truncation_note",
)
