"""The calibrated cost model: per-layer times interpolated from a ``slimpack profile`` table.

The table (CSV written by :mod:`slimpack.runtime.profiler`) holds, for a grid of (query tokens,
KV prefix) on one device: a whole decoder layer over one document (``layer``), the attention
kernel alone (``attention``), and the LM head with its loss (``head``). A unit's work on a
device is a list of per-document pieces ``(tokens, prefix)``, priced as

    layer(T, 0) - attention(T, 0) + sum_i attention(t_i, p_i),    T = sum_i t_i

i.e. the linear part of one layer over all the pack's tokens (one GEMM over the packed
buffer) plus attention per document, because packing never makes attention span documents.
Interpolation is piecewise linear in prefix (attention is linear in it) and in tokens; beyond
the largest profiled size, times scale with FLOPs; below the smallest, the smallest point's
time is used (launch-bound work does not get cheaper).
"""

from __future__ import annotations

import bisect
import csv
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slimpack.cost.comm import CommModel
from slimpack.cost.flops import Piece, as_piece_list, attention_flops, head_flops, linear_flops_per_token
from slimpack.cost.model import ZERO_TIMES, PassTimes
from slimpack.specs.hardware import HardwareSpec
from slimpack.specs.model import ModelSpec
from slimpack.specs.recompute import check_recompute
from slimpack.specs.training import TrainingSpec

KINDS = ("layer", "attention", "head")


@dataclass(frozen=True, kw_only=True)
class ProfileTable:
    """``(kind, tokens, prefix) -> (forward_s, backward_s)`` measured on one device."""

    model: str
    device: str
    dtype: str
    points: dict[tuple[str, int, int], tuple[float, float]]

    def __post_init__(self) -> None:
        for kind in KINDS:
            if not any(k[0] == kind for k in self.points):
                raise ValueError(f"profile table has no {kind!r} rows; re-run `slimpack profile`")
        for kind in ("layer", "attention"):
            if not any(k[0] == kind and k[2] == 0 for k in self.points):
                raise ValueError(f"profile table needs {kind!r} rows with prefix 0")

    def grid(self, kind: str) -> tuple[list[int], list[int]]:
        tokens = sorted({t for k, t, _ in self.points if k == kind})
        prefixes = sorted({p for k, _, p in self.points if k == kind})
        return tokens, prefixes


def load_profile(path: str | Path) -> ProfileTable:
    """Read the CSV ``slimpack profile --out`` wrote; raise ValueError on a malformed file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"profile {str(path)!r} does not exist; create it with "
                         f"`slimpack profile --model M --out {path}`")
    points: dict[tuple[str, int, int], tuple[float, float]] = {}
    meta: set[tuple[str, str, str]] = set()
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.DictReader(fh), start=2):
            try:
                key = (row["kind"], int(row["tokens"]), int(row["prefix"]))
                points[key] = (float(row["forward_s"]), float(row["backward_s"]))
                meta.add((row["model"], row["device"], row["dtype"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"profile {str(path)!r} line {i}: bad row ({exc})") from None
    if len(meta) != 1:
        raise ValueError(f"profile {str(path)!r} must hold one (model, device, dtype), found "
                         f"{sorted(meta) or 'none'}")
    model, device, dtype = meta.pop()
    return ProfileTable(model=model, device=device, dtype=dtype, points=points)


def cpu_hardware(*, peak_tflops: float = 0.1, p2p_gbps: float = 2.0,
                 latency_s: float = 50e-6) -> HardwareSpec:
    """A HardwareSpec for CPU processes talking gloo over loopback (p2p and all-reduce
    priced by ``CommModel``; compute comes from the profile, not from these numbers)."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return HardwareSpec(name="cpu-gloo", peak_tflops=peak_tflops, memory_gib=mem,
                        hbm_tbps=0.02, gpus_per_node=1024, intra_node_gbps=p2p_gbps,
                        inter_node_gbps=p2p_gbps, intra_node_latency_s=latency_s,
                        inter_node_latency_s=latency_s)


@dataclass(frozen=True, kw_only=True)
class CalibratedCostModel:
    """A :class:`~slimpack.cost.model.CostModel` that prices work from a profile table."""

    model: ModelSpec
    hardware: HardwareSpec
    table: ProfileTable
    training: TrainingSpec | None = None
    """The recipe priced (:func:`slimpack.cost.model.training_of`; None: the default)."""
    comm: CommModel = field(init=False)

    def __post_init__(self) -> None:
        if self.table.model != self.model.name:
            raise ValueError(f"profile was measured for model {self.table.model!r}, not "
                             f"{self.model.name!r}; profile this model first")
        object.__setattr__(self, "comm", CommModel(hardware=self.hardware))

    @classmethod
    def from_csv(cls, path: str | Path, *, model: ModelSpec,
                 hardware: HardwareSpec | None = None) -> CalibratedCostModel:
        table = load_profile(path)
        return cls(model=model, hardware=hardware or cpu_hardware(), table=table)

    # -- CostModel --------------------------------------------------------------------------
    def layer_times(self, pieces: Sequence[Piece], *, tp: int = 1,
                    recompute: str = "none") -> PassTimes:
        check_recompute("layer_times", recompute)
        pieces = [(t, p) for t, p in as_piece_list(pieces) if t > 0]
        if not pieces:
            return ZERO_TIMES
        total = sum(t for t, _ in pieces)
        layer_f, layer_b = self._lookup("layer", total, 0)
        attn0_f, attn0_b = self._lookup("attention", total, 0)
        # The linear part never goes below zero, even where noise makes attention look
        # dearer than the layer around it.
        fwd, bwd = max(layer_f - attn0_f, 0.0), max(layer_b - attn0_b, 0.0)
        for t, p in pieces:
            af, ab = self._lookup("attention", t, p)
            fwd += af
            bwd += ab
        if recompute == "full":
            bwd += fwd
        # The profile is for tp = 1: a tp-way group shares the compute (no TP comm priced).
        return PassTimes(forward_s=fwd / tp, backward_s=bwd / tp)

    def head_times(self, tokens: int, *, tp: int = 1, vocab_shards: int = 1) -> PassTimes:
        if tokens <= 0:
            return ZERO_TIMES
        f, b = self._lookup("head", tokens, 0)
        shards = tp * vocab_shards
        return PassTimes(forward_s=f / shards, backward_s=b / shards)

    # -- interpolation ----------------------------------------------------------------------
    def _flops(self, kind: str) -> Callable[[int, int], float]:
        if kind == "attention":
            return lambda t, p: attention_flops(self.model, t, p)
        if kind == "head":
            return lambda t, p: head_flops(self.model, t)
        per_token = linear_flops_per_token(self.model)
        return lambda t, p: per_token * t + attention_flops(self.model, t, p)

    def _lookup(self, kind: str, tokens: int, prefix: int) -> tuple[float, float]:
        ts, ps = self.table.grid(kind)
        if tokens > ts[-1]:
            flops = self._flops(kind)
            scale = flops(tokens, prefix) / flops(ts[-1], prefix)
            f, b = self._lookup(kind, ts[-1], prefix)
            return f * scale, b * scale
        tokens = max(tokens, ts[0])
        i = bisect.bisect_left(ts, tokens)
        if ts[i] == tokens:
            return self._along_prefix(kind, ts[i], prefix, ps)
        lo, hi = ts[i - 1], ts[i]
        w = (tokens - lo) / (hi - lo)
        f0, b0 = self._along_prefix(kind, lo, prefix, ps)
        f1, b1 = self._along_prefix(kind, hi, prefix, ps)
        return f0 + w * (f1 - f0), b0 + w * (b1 - b0)

    def _along_prefix(self, kind: str, tokens: int, prefix: int,
                      ps: list[int]) -> tuple[float, float]:
        pts = self.table.points
        avail = [p for p in ps if (kind, tokens, p) in pts]
        if len(avail) == 1 or prefix <= avail[0]:
            return pts[(kind, tokens, avail[0])]
        # Linear in prefix inside the grid and, beyond it, along the last segment.
        j = min(max(bisect.bisect_left(avail, prefix), 1), len(avail) - 1)
        lo, hi = avail[j - 1], avail[j]
        w = (prefix - lo) / (hi - lo)
        (f0, b0), (f1, b1) = pts[(kind, tokens, lo)], pts[(kind, tokens, hi)]
        return max(f0 + w * (f1 - f0), 0.0), max(b0 + w * (b1 - b0), 0.0)
