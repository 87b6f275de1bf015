"""Kernel-level time models: GEMMs with tile and wave quantisation, FlashAttention fwd/bwd.

Both are small closed forms whose constants are fitted to published kernel benchmarks
(``datasets/kernels/``, fitted by :mod:`slimpack.cost.kernel_fit`; never to end-to-end
training runs, which only validate). The *forms* are ours (*reconstructed*); the data and
its citations are in the CSV files.

GEMM ``(m x k) @ (k x n)``: the output is cut into ``TILE_M x TILE_N`` tiles, which run in
waves of ``num_sms`` (one tile per SM at a time), so a GEMM with one tile more than a wave
pays a whole second wave (wave quantisation) and a ragged edge pays a whole tile (tile
quantisation). One tile over ``k`` costs ``2*TILE_M*TILE_N*(k + k0)`` FLOPs at ``eta`` of an
SM's peak: ``k0`` is the main loop's prologue/epilogue in equivalent k, so thin-k GEMMs (small
hidden sizes) run below the asymptote. A fixed ``launch_s`` covers launch and tail; a GEMM is
never faster than moving its operands through HBM.

FlashAttention over one document: a query tile of 128 rows visits the key tiles it needs
(all of them non-causal; those at or below the diagonal causal), each at ``eta`` of peak, and
pays a fixed cost of ``row_overhead`` tiles (loading Q, the softmax rescale and writing O
forward; dQ accumulation and the preprocessing pass backward). Short documents therefore run
far below the asymptote, more so backward (its row overhead is larger), so the backward/
forward time ratio of an attention-priced unit falls with document length, as the kernels'
published throughput curves do. Head dimension scales eta by ``d/(d + d0)`` (normalised at
128).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from slimpack.specs.hardware import HardwareSpec

ATTN_TILE = 128
"""FlashAttention's query/key tile edge, in tokens."""
GEMM_TILE_M = 128
GEMM_TILE_N = 128
HBM_FRACTION = 0.8
"""Share of datasheet HBM bandwidth a streaming kernel reaches (*reconstructed*, not fitted:
no cited measurement here; used for memory-bound elementwise work and the GEMM floor)."""
BWD_ATTENTION_FLOP_RATIO = 2.5
"""FlashAttention's backward FLOP convention: 2x the forward matmuls plus the recomputed
QK^T (benchmarks/benchmark_flash_attention.py in Dao-AILab/flash-attention)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmConstants:
    eta: float
    """Asymptotic fraction of the dtype's peak one tile reaches."""
    k0: float
    """Per-tile fixed cost in equivalent k (prologue/epilogue of the main loop)."""
    launch_s: float
    """Fixed seconds per GEMM (launch, tail)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionConstants:
    eta_fwd: float
    eta_bwd: float
    """Asymptotic fraction of peak, backward counted at 2.5x the forward FLOPs."""
    row_fwd: float
    row_bwd: float
    """Fixed cost per query tile (per document), in tiles of work."""
    d0: float
    """Head-dimension scale: eta x (d/(d+d0)) / (128/(128+d0))."""


# Fitted by slimpack.cost.kernel_fit from datasets/kernels/*.csv (tests/test_cost_kernels.py
# refits and checks these). Which rows fit which constant: docs/cost-model.md, "Kernel data".
GEMM_CONSTANTS: dict[tuple[str, str], GemmConstants] = {
    ("ampere", "bf16"): GemmConstants(eta=0.90, k0=416.0, launch_s=6.0e-6),
    ("hopper", "bf16"): GemmConstants(eta=0.75, k0=224.0, launch_s=2.0e-6),
    ("hopper", "fp8"): GemmConstants(eta=0.64, k0=544.0, launch_s=0.0),
}
ATTENTION_CONSTANTS: dict[str, AttentionConstants] = {
    "ampere": AttentionConstants(eta_fwd=0.73, eta_bwd=0.71, row_fwd=0.0, row_bwd=2.05, d0=6.8),
    "hopper": AttentionConstants(eta_fwd=0.76, eta_bwd=0.65, row_fwd=1.95, row_bwd=8.25, d0=6.8),
    # FlashAttention-2-class kernels on Hopper (TrainingSpec.hopper_attention="fa2"): our H200
    # SXM sweep of torch's FlashAttention-2 kernels (datasets/kernels/flash_attention.csv).
    "hopper-fa2": AttentionConstants(eta_fwd=0.36, eta_bwd=0.31, row_fwd=0.55, row_bwd=3.2,
                                     d0=6.8),
}

NETWORK_EFFICIENCY: dict[str, tuple[float, float]] = {
    "ampere": (0.67, 0.96),
    "hopper": (0.82, 0.94),
}
"""(intra-node, inter-node) NCCL bus bandwidth / link bandwidth (datasets/kernels/nccl.csv):
Ampere from nccl-tests all-reduce runs, Hopper from the NCCL maintainers' figures (effective
NVLink4 370 of 450 GB/s; NDR 46-48 of 50 GB/s per NIC)."""


GEMM_CEILING: dict[tuple[str, str], float] = {
    ("ampere", "bf16"): 267.9 / 312,
    ("hopper", "bf16"): 719.72 / 989,
}
"""The most a GEMM of any shape sustains, as a fraction of the dtype's peak, per (kernel family,
dtype); fitted by :func:`slimpack.cost.kernel_fit.fit_ceiling` from the ``role=ceiling`` rows
of ``datasets/kernels/gemm.csv``. Ampere: the best of a brute-force shape search
(stas00/ml-engineering, "Maximum Achievable Matmul FLOPS comparison table": A100 SXM 267.9 of
312 TFLOP/s). Hopper: the largest, longest-running bf16 GEMM of an H100 SXM sweep (10240^3:
719.72 of 989 TFLOP/s, zzc0721/torch-performance-test-data issue #79), the rate a 700 W part
holds when GEMMs run back to back as in training; the brute-force table's 792.1 and the sweep's
short 8192^3 797.5 are best cases it does not hold (the H200 NVL per-layer GEMM times of
Transformer Engine's GEMM profiling tutorial, ``gemm_layers.csv``, hold out at this fraction).
The tile model's asymptote (``eta`` x peak) is capped there; kernel families or dtypes without
a measurement (FP8) are not capped."""


def gemm_ceiling_seconds(hw: HardwareSpec, m: int, n: int, k: int, *, dtype: str = "bf16",
                         batch: int = 1) -> float:
    """Seconds of ``batch`` ``(m x k) @ (k x n)`` GEMMs at the measured maximum achievable
    matmul throughput (:data:`GEMM_CEILING`); 0 where none is measured."""
    frac = GEMM_CEILING.get((hw.kernel_family, dtype))
    if frac is None or m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    return batch * 2.0 * m * n * k / (_peak(hw, dtype) * frac)


def capped_gemm_seconds(hw: HardwareSpec, m: int, n: int, k: int, *, dtype: str = "bf16",
                        batch: int = 1) -> float:
    """Seconds of ``batch`` ``(m x k) @ (k x n)`` GEMMs: the tile/wave model, never faster than
    the sustained ceiling (:data:`GEMM_CEILING`)."""
    return max(gemm_seconds(hw, m, n, k, batch=batch, dtype=dtype),
               gemm_ceiling_seconds(hw, m, n, k, batch=batch, dtype=dtype))


def _peak(hw: HardwareSpec, dtype: str) -> float:
    if dtype == "fp8":
        if hw.peak_fp8_tflops <= 0:
            raise ValueError(f"dtype fp8 needs FP8 tensor cores; {hw.name} has none "
                             f"(HardwareSpec.peak_fp8_tflops = 0)")
        return hw.peak_fp8_tflops * 1e12
    return hw.peak_flops


def gemm_constants(hw: HardwareSpec, dtype: str) -> GemmConstants:
    key = (hw.kernel_family, dtype)
    if key not in GEMM_CONSTANTS:
        raise ValueError(f"no fitted GEMM constants for kernel_family={hw.kernel_family!r}, "
                         f"dtype={dtype!r}; known: {sorted(GEMM_CONSTANTS)}")
    return GEMM_CONSTANTS[key]


def gemm_seconds(hw: HardwareSpec, m: int, n: int, k: int, *, dtype: str = "bf16",
                 batch: int = 1, consts: GemmConstants | None = None) -> float:
    """Seconds of ``batch`` independent ``(m x k) @ (k x n)`` GEMMs in one launch."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    c = consts or gemm_constants(hw, dtype)
    tiles = batch * math.ceil(m / GEMM_TILE_M) * math.ceil(n / GEMM_TILE_N)
    waves = math.ceil(tiles / hw.num_sms)
    per_sm = _peak(hw, dtype) / hw.num_sms * c.eta
    compute = waves * 2.0 * GEMM_TILE_M * GEMM_TILE_N * (k + c.k0) / per_sm
    elem = 1 if dtype == "fp8" else 2
    memory = batch * (m * k + k * n + m * n) * elem / (hw.hbm_tbps * 1e12 * HBM_FRACTION)
    return max(compute, memory) + c.launch_s


def gemm_efficiency(hw: HardwareSpec, m: int, n: int, k: int, *, dtype: str = "bf16") -> float:
    """Achieved fraction of peak of one GEMM (for plots and tests)."""
    return 2.0 * m * n * k / gemm_seconds(hw, m, n, k, dtype=dtype) / _peak(hw, dtype)


def attention_tiles(tokens: int, prefix: int, *, causal: bool = True) -> tuple[float, int]:
    """(key tiles visited, query tiles) of one document piece: ``tokens`` queries after
    ``prefix`` earlier keys. Causal: query tile t reaches ``ceil(p/128) + t + 1`` key tiles."""
    nq = -(-tokens // ATTN_TILE)
    if causal:
        return nq * -(-prefix // ATTN_TILE) + nq * (nq + 1) / 2, nq
    return nq * -(-(tokens + prefix) // ATTN_TILE), nq


VECTORISE_FROM = 64
"""Piece lists at least this long are summed with numpy (a unit of a paper-size batch holds
thousands of CP chunks); shorter ones in Python, where numpy's call overhead dominates. Both
sums are exact integers, so the two paths agree to the last bit."""


def attention_work(pieces: Iterable[tuple[int, int]] | np.ndarray, *,
                   causal: bool = True) -> tuple[int, int]:
    """(key tiles visited, query tiles) summed over ``pieces`` of ``(tokens, prefix)``;
    pieces without tokens are skipped. ``pieces`` may be an ``(n, 2)`` integer array."""
    if isinstance(pieces, np.ndarray) and len(pieces) < VECTORISE_FROM:
        pieces = pieces.tolist()
    if not isinstance(pieces, np.ndarray):
        pieces = list(pieces)
        if len(pieces) < VECTORISE_FROM:
            tiles = queries = 0
            for tokens, prefix in pieces:
                if tokens <= 0:
                    continue
                nq = -(-int(tokens) // ATTN_TILE)
                reach = -(-int(prefix) // ATTN_TILE) if causal else \
                    -(-(int(tokens) + int(prefix)) // ATTN_TILE)
                tiles += nq * reach + (nq * (nq + 1) // 2 if causal else 0)
                queries += nq
            return tiles, queries
    arr = np.asarray(pieces, dtype=np.int64).reshape(-1, 2)
    arr = arr[arr[:, 0] > 0]
    tokens, prefix = arr[:, 0], arr[:, 1]
    nq = -(-tokens // ATTN_TILE)
    if causal:
        tiles = nq * -(-prefix // ATTN_TILE) + nq * (nq + 1) // 2
    else:
        tiles = nq * -(-(tokens + prefix) // ATTN_TILE)
    return int(tiles.sum()), int(nq.sum())


def attention_seconds(hw: HardwareSpec, pieces, *, heads: float, head_dim: int,
                      backward: bool, causal: bool = True,
                      consts: AttentionConstants | None = None) -> float:
    """FlashAttention seconds of one pass over ``pieces`` (one varlen launch), ``heads``
    query heads on this GPU."""
    tiles, queries = attention_work(pieces, causal=causal)
    return attention_seconds_of_work(hw, tiles, queries, heads=heads, head_dim=head_dim,
                                     backward=backward, consts=consts)


def attention_seconds_of_work(hw: HardwareSpec, tiles: int, queries: int, *, heads: float,
                              head_dim: int, backward: bool,
                              consts: AttentionConstants | None = None) -> float:
    """:func:`attention_seconds` from :func:`attention_work`'s sums: each query tile pays
    its row overhead on top of the key tiles it visits. ``tiles`` and ``queries`` may be
    integer arrays (the simulator prices all units of a group at once): the same operations
    in the same order, so each element equals the scalar call's result."""
    c = consts or ATTENTION_CONSTANTS[hw.kernel_family]
    work = tiles + (c.row_bwd if backward else c.row_fwd) * queries
    if not isinstance(work, np.ndarray) and work == 0.0:
        return 0.0
    scale = (head_dim / (head_dim + c.d0)) / (128 / (128 + c.d0))
    eta = (c.eta_bwd if backward else c.eta_fwd) * scale
    flops = 4.0 * head_dim * ATTN_TILE * ATTN_TILE * heads * work
    if backward:
        flops *= BWD_ATTENTION_FLOP_RATIO
    return flops / (hw.peak_flops * eta)


def attention_efficiency(hw: HardwareSpec, seqlen: int, *, head_dim: int = 128,
                         backward: bool = False, causal: bool = False,
                         consts: AttentionConstants | None = None) -> float:
    """Throughput in the flash-attn benchmark's convention (``4*s^2*d`` per head, halved when
    causal, x2.5 backward) as a fraction of peak: what the kernel data tabulate."""
    t = attention_seconds(hw, [(seqlen, 0)], heads=1, head_dim=head_dim, backward=backward,
                          causal=causal, consts=consts)
    flops = 4.0 * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
    if backward:
        flops *= BWD_ATTENTION_FLOP_RATIO
    return flops / t / hw.peak_flops


def memory_seconds(hw: HardwareSpec, nbytes: float) -> float:
    """A streaming (memory-bound) kernel moving ``nbytes`` through HBM."""
    return nbytes / (hw.hbm_tbps * 1e12 * HBM_FRACTION) if nbytes > 0 else 0.0
