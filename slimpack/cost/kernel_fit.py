"""Fit the kernel constants of :mod:`slimpack.cost.kernels` to ``datasets/kernels/*.csv``.

Only rows with ``role == fit`` are used; ``holdout`` rows (other hardware, power-capped
parts, FP8 attention, the causal/non-causal pairs) check that the forms generalise. Which
rows set which constant:

* GEMM ``eta, k0, launch_s`` per kernel family: least squares in log throughput over the
  GEMM rows of that family's GPU. ``ampere``: the square GEMMs of an A100 PCIe (fp16 and bf16
  pooled, they run on the same tensor cores). ``hopper``: our own H200 SXM sweep
  (``python -m slimpack.cli.gpu_check``, :mod:`slimpack.runtime.kernel_bench`: square GEMMs
  and every fprop/dgrad/wgrad GEMM of Llama 7B/13B/70B decoder layers at tp 1-8 and 1K-16K
  tokens, sustained back-to-back on the 700 W part); the H100 SXM square GEMMs it replaced are
  held out (their short 4096^3/8192^3 runs, 789/798 TFLOP/s, are the best-case rates
  :data:`~slimpack.cost.kernels.GEMM_CEILING` already discounts). ``hopper/fp8``: the same least squares over
  DeepGEMM's published H800 FP8 sweep at M=4096, taken as the CUTLASS 3.6 baseline it states
  its speedup against (TFLOPS / speedup: the class of per-tensor cuBLASLt GEMMs Transformer
  Engine runs; DeepGEMM's own block-scaled numbers are held out).
* GEMM ceiling per kernel family (bf16): the ``role=ceiling`` row of that family's GPU, its
  throughput over its peak (A100 SXM: the brute-force maximum of stas00/ml-engineering; H100
  SXM: the sustained 10240^3 GEMM of the torch sweep). ``gemm_layers.csv`` (Transformer
  Engine's per-layer GEMM times on an H200 NVL, bf16 and fp8) holds the capped model out.
* Network efficiency (NCCL bus bandwidth over link bandwidth, intra- and inter-node):
  ``nccl.csv`` all-reduce runs on A100 nodes (``ampere``); the NCCL maintainers' effective
  NVLink4 (370 of 450 GB/s) and NDR (46-48 of 50 GB/s per NIC) figures (``hopper``).
* Attention ``row_fwd, row_bwd`` (per-query-tile overhead) and the backward/forward asymptote
  ratio: the FlashAttention-2 seqlen sweep (Ampere, RTX A5000); forward ``eta`` of ``ampere``
  from the FlashAttention-2 paper's stated A100 asymptote. ``hopper``: ``row_fwd`` from the
  FlashAttention-3 sweep on a PCIe H100, ``eta_fwd`` from the FlashAttention-3 paper's 740
  TFLOP/s; Hopper backward ``eta_bwd, row_bwd`` from FlashAttention-3's H100 backward sweep
  (tritonbench PR #1256, head dim 128, 1K-8K tokens). ``hopper-fa2`` (FlashAttention-2-class
  kernels on Hopper, as containers before FlashAttention-3 ran them): our H200 SXM sweep of
  torch's FlashAttention-2 kernels, forward and backward each fitted on its own (head dim
  128, non-causal); the FlashAttention-3 paper's stated 35% utilization of FlashAttention-2 on
  an H100 is held out. ``d0`` from the head-dim 64/128 pair on H20.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slimpack.cost import kernels as K
from slimpack.specs.hardware import HardwareSpec

KERNEL_DIR = Path(__file__).resolve().parents[2] / "datasets" / "kernels"

# The benchmarked parts as HardwareSpecs (datasheet numbers; only peak, SMs, HBM matter here).
BENCH_GPUS: dict[str, HardwareSpec] = {
    "a100-pcie-40g": HardwareSpec(name="a100-pcie-40g", peak_tflops=312, memory_gib=40,
                                  hbm_tbps=1.555, intra_node_gbps=32, inter_node_gbps=25,
                                  num_sms=108, kernel_family="ampere"),
    "h100-sxm-80g": HardwareSpec(name="h100-sxm-80g", peak_tflops=989, memory_gib=80,
                                 hbm_tbps=3.35, intra_node_gbps=450, inter_node_gbps=50,
                                 num_sms=132, peak_fp8_tflops=1979, kernel_family="hopper"),
    # H800 SXM: the H100 die (132 SMs, dense FP8 1979 TFLOP/s), export NVLink.
    "h800-sxm-80g": HardwareSpec(name="h800-sxm-80g", peak_tflops=989, memory_gib=80,
                                 hbm_tbps=3.35, intra_node_gbps=200, inter_node_gbps=50,
                                 num_sms=132, peak_fp8_tflops=1979, kernel_family="hopper"),
    # H200 SXM: the H100 die at 700 W with HBM3e (NVIDIA H200 datasheet: 4.8 TB/s).
    "h200-sxm-141g": HardwareSpec(name="h200-sxm-141g", peak_tflops=989, memory_gib=141,
                                  hbm_tbps=4.8, intra_node_gbps=450, inter_node_gbps=50,
                                  num_sms=132, peak_fp8_tflops=1979, kernel_family="hopper"),
    "b200": HardwareSpec(name="b200", peak_tflops=2250, memory_gib=180, hbm_tbps=8.0,
                         intra_node_gbps=900, inter_node_gbps=50, num_sms=148,
                         kernel_family="hopper"),
}
GEMM_FAMILY_GPU = {"ampere": "a100-pcie-40g", "hopper": "h200-sxm-141g"}
CEILING_FAMILY_GPU = {"ampere": "a100-sxm-80g", "hopper": "h100-sxm-80g"}
"""Whose ``role=ceiling`` row sets each family's GEMM ceiling (the training parts: SXM)."""


def read_rows(name: str, directory: Path | None = None) -> list[dict[str, str]]:
    path = (directory or KERNEL_DIR) / name
    if not path.is_file():
        raise ValueError(f"kernel data {str(path)!r} does not exist")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@dataclass(frozen=True, kw_only=True)
class FitResult:
    gemm: dict[tuple[str, str], K.GemmConstants]
    attention: dict[str, K.AttentionConstants]
    network: dict[str, tuple[float, float]]
    ceiling: dict[tuple[str, str], float]


def fit_network(rows: Iterable[dict[str, str]]) -> dict[str, tuple[float, float]]:
    """Bus bandwidth / link bandwidth of the fit rows: NVLink (intra) and InfiniBand (inter):
    Ampere from NVLink3 and HDR runs, Hopper from the NCCL maintainers' NVLink4 and NDR
    figures (nccl-tests issues #212 and #290)."""
    rows = [r for r in rows if r["role"] == "fit"]
    ratio = {r["link"]: float(r["busbw_gbps"]) / float(r["link_gbps"]) for r in rows}
    return {"ampere": (round(ratio["nvlink3"], 2), round(ratio["ib-hdr"], 2)),
            "hopper": (round(ratio["nvlink4"], 2), round(ratio["ib-ndr"], 2))}


def _gemm_loss(hw: HardwareSpec, rows: list[dict[str, str]], c: K.GemmConstants,
               dtype: str = "bf16") -> float:
    err = 0.0
    for r in rows:
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        predicted = 2.0 * m * n * k / K.gemm_seconds(hw, m, n, k, consts=c, dtype=dtype) / 1e12
        err += float(np.log(predicted / float(r["tflops"]))) ** 2
    return err


def _grid_fit(hw: HardwareSpec, rows: list[dict[str, str]], dtype: str) -> K.GemmConstants:
    best = None
    for eta in np.arange(0.60, 1.0001, 0.01):
        for k0 in np.arange(0, 1025, 32):
            for launch in np.arange(0, 21e-6, 2e-6):
                c = K.GemmConstants(eta=round(float(eta), 2), k0=float(k0),
                                    launch_s=float(launch))
                loss = _gemm_loss(hw, rows, c, dtype)
                if best is None or loss < best[0]:
                    best = (loss, c)
    assert best is not None
    return best[1]


def fit_gemm(rows: Iterable[dict[str, str]]) -> dict[tuple[str, str], K.GemmConstants]:
    rows = [r for r in rows if r["role"] == "fit"]
    out: dict[tuple[str, str], K.GemmConstants] = {}
    for family, gpu in GEMM_FAMILY_GPU.items():
        sel = [r for r in rows if r["gpu"] == gpu and r["dtype"] in ("bf16", "fp16")]
        out[(family, "bf16")] = _grid_fit(BENCH_GPUS[gpu], sel, "bf16")
    fp8 = [r for r in rows if r["dtype"] == "fp8" and int(r["m"]) > 0]
    if fp8:
        out[("hopper", "fp8")] = _grid_fit(BENCH_GPUS[fp8[0]["gpu"]], fp8, "fp8")
    return out


def fit_ceiling(rows: Iterable[dict[str, str]]) -> dict[tuple[str, str], float]:
    """(family, dtype) -> the one ``role=ceiling`` row's throughput over its peak, per family's
    training GPU (:data:`CEILING_FAMILY_GPU`)."""
    rows = [r for r in rows if r["role"] == "ceiling"]
    out: dict[tuple[str, str], float] = {}
    for family, gpu in CEILING_FAMILY_GPU.items():
        sel = [r for r in rows if r["gpu"] == gpu and r["dtype"] == "bf16"]
        if len(sel) != 1:
            raise ValueError(f"GEMM ceiling of {family!r}: want one bf16 role=ceiling row of "
                             f"{gpu!r}, found {len(sel)}")
        out[(family, "bf16")] = float(sel[0]["tflops"]) / float(sel[0]["peak_tflops"])
    return out


def _saturation_fit(nq: np.ndarray, eff: np.ndarray) -> tuple[float, float]:
    """(eta, row) minimising log error of ``eff = eta * nq / (nq + row)`` (non-causal)."""
    best = None
    for row in np.arange(0.0, 16.0001, 0.05):
        shape = nq / (nq + row)
        eta = float(np.exp(np.mean(np.log(eff / shape))))
        loss = float(np.sum(np.log(eta * shape / eff) ** 2))
        if best is None or loss < best[0]:
            best = (loss, eta, float(row))
    assert best is not None
    return best[1], best[2]


def _sweep(rows: list[dict[str, str]], gpu: str, kernel: str, pass_: str):
    sel = [r for r in rows if r["gpu"] == gpu and r["kernel"] == kernel and r["pass"] == pass_
           and r["causal"] == "0" and r["kind"] == "measured" and r["role"] == "fit"]
    nq = np.array([-(-int(r["seqlen"]) // K.ATTN_TILE) for r in sel], dtype=float)
    eff = np.array([float(r["tflops"]) / float(r["peak_tflops"]) for r in sel])
    return nq, eff


def _stated(rows: list[dict[str, str]], gpu: str, kernel: str) -> tuple[float, int]:
    r = next(r for r in rows if r["gpu"] == gpu and r["kernel"] == kernel and r["kind"] == "stated"
             and r["role"] == "fit")
    return float(r["tflops"]) / float(r["peak_tflops"]), -(-int(r["seqlen"]) // K.ATTN_TILE)


def fit_attention(rows: Iterable[dict[str, str]]) -> dict[str, K.AttentionConstants]:
    rows = list(rows)
    # Head-dim scale from the H20 FlashAttention-3 pair (same kernel, same seqlen).
    h20 = {int(r["head_dim"]): float(r["tflops"]) for r in rows
           if r["gpu"] == "h20" and r["kernel"] == "fa3" and r["causal"] == "0"}
    ratio = h20[64] / h20[128]
    d0 = round((64 * 128 * (1 - ratio)) / (ratio * 128 - 64), 1)
    eta_f5, row_f = _saturation_fit(*_sweep(rows, "a5000", "fa2", "fwd"))
    eta_b5, row_b = _saturation_fit(*_sweep(rows, "a5000", "fa2", "bwd"))
    bwd_ratio = eta_b5 / eta_f5
    stated_a100, nq_a100 = _stated(rows, "a100-sxm-80g", "fa2")
    eta_fa = stated_a100 * (nq_a100 + row_f) / nq_a100
    _, row_fh = _saturation_fit(*_sweep(rows, "h100-pcie-80g", "fa3", "fwd"))
    stated_h100, nq_h100 = _stated(rows, "h100-sxm-80g", "fa3")
    eta_fh = stated_h100 * (nq_h100 + row_fh) / nq_h100
    # Hopper backward: FlashAttention-3's own H100 backward sweep (tritonbench PR #1256).
    eta_bh, row_bh = _saturation_fit(*_sweep(rows, "h100-sxm-80g", "fa3", "bwd"))
    # FlashAttention-2-class kernels on Hopper (before FlashAttention-3): our H200 SXM sweep of
    # torch's FlashAttention-2 kernels (head dim 128, non-causal, 512-32K tokens), forward and
    # backward each by its own saturation fit (the FA3 paper's stated 35% is held out).
    eta_f2h, row_f2h = _saturation_fit(*_sweep(rows, "h200-sxm-141g", "fa2", "fwd"))
    eta_b2h, row_b2h = _saturation_fit(*_sweep(rows, "h200-sxm-141g", "fa2", "bwd"))
    r2 = lambda x: round(float(x), 2)  # noqa: E731
    return {
        "hopper-fa2": K.AttentionConstants(eta_fwd=r2(eta_f2h), eta_bwd=r2(eta_b2h),
                                           row_fwd=r2(row_f2h), row_bwd=r2(row_b2h), d0=d0),
        "ampere": K.AttentionConstants(eta_fwd=r2(eta_fa), eta_bwd=r2(eta_fa * bwd_ratio),
                                       row_fwd=r2(row_f), row_bwd=r2(row_b), d0=d0),
        "hopper": K.AttentionConstants(eta_fwd=r2(eta_fh), eta_bwd=r2(eta_bh),
                                       row_fwd=r2(row_fh), row_bwd=r2(row_bh), d0=d0),
    }


def fit_all(directory: Path | None = None) -> FitResult:
    gemm_rows = read_rows("gemm.csv", directory)
    return FitResult(gemm=fit_gemm(gemm_rows),
                     attention=fit_attention(read_rows("flash_attention.csv", directory)),
                     network=fit_network(read_rows("nccl.csv", directory)),
                     ceiling=fit_ceiling(gemm_rows))


def layer_gemm_shapes(row: dict[str, str]) -> list[tuple[int, int, int]]:
    """(m, n, k) of the four GEMMs of one layer row of ``gemm_layers.csv`` in its pass, as
    Transformer Engine's GEMM benchmark derives them (fprop: QKV, out-projection, up, down;
    dgrad swaps n and k; wgrad is the ``k x n`` weight from ``m`` tokens)."""
    m, h = int(row["tokens"]), int(row["hidden"])
    fprop = [(m, int(row["qkv_out"]), h), (m, h, h), (m, int(row["ffn"]), h),
             (m, h, int(row["ffn"]))]
    if row["pass"] == "fprop":
        return fprop
    if row["pass"] == "dgrad":
        return [(a, k, n) for a, n, k in fprop]
    if row["pass"] == "wgrad":
        return [(k, n, a) for a, n, k in fprop]
    raise ValueError(f"gemm_layers.csv: pass must be fprop, dgrad or wgrad, got {row['pass']!r}")


def layer_residuals(directory: Path | None = None) -> list[dict[str, object]]:
    """Published vs modelled milliseconds of one layer's four GEMMs (``gemm_layers.csv``):
    the shipped tile model capped at :data:`~slimpack.cost.kernels.GEMM_CEILING`, on a
    HardwareSpec of the row's peak and SM count. FP8 rows price the GEMMs only (the autocast
    rows' published times include Transformer Engine's input quantization)."""
    out: list[dict[str, object]] = []
    for r in read_rows("gemm_layers.csv", directory):
        hw = HardwareSpec(name=r["gpu"], peak_tflops=float(r["peak_tflops"]), memory_gib=80,
                          hbm_tbps=4.8, intra_node_gbps=1, inter_node_gbps=1,
                          num_sms=int(r["num_sms"]), peak_fp8_tflops=float(r["peak_fp8_tflops"]),
                          kernel_family="hopper")
        seconds = sum(K.capped_gemm_seconds(hw, m, n, k, dtype=r["dtype"])
                      for m, n, k in layer_gemm_shapes(r))
        out.append({"gpu": r["gpu"], "recipe": r["recipe"], "pass": r["pass"], "role": r["role"],
                    "published_ms": float(r["ms"]), "predicted_ms": seconds * 1e3})
    return out


def residuals(directory: Path | None = None) -> list[dict[str, object]]:
    """Predicted vs published throughput of every row (fit and holdout), with the shipped
    constants: what ``docs/cost-model.md`` tabulates."""
    out: list[dict[str, object]] = []
    for r in read_rows("gemm.csv", directory):
        hw = BENCH_GPUS.get(r["gpu"])
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        if hw is None or m == 0:
            continue
        dtype = "bf16" if r["dtype"] in ("bf16", "fp16") else r["dtype"]
        if dtype == "fp8" and hw.peak_fp8_tflops <= 0:
            continue
        pred = 2.0 * m * n * k / K.gemm_seconds(hw, m, n, k, dtype=dtype) / 1e12
        out.append({"kernel": "gemm", "gpu": r["gpu"], "shape": f"{m}x{n}x{k} {r['dtype']}",
                    "role": r["role"], "published": float(r["tflops"]), "predicted": pred})
    for r in read_rows("flash_attention.csv", directory):
        family = "ampere" if r["gpu"].startswith("a") else "hopper"
        hw = HardwareSpec(name=r["gpu"], peak_tflops=float(r["peak_tflops"]), memory_gib=80,
                          hbm_tbps=2.0, intra_node_gbps=1, inter_node_gbps=1,
                          kernel_family=family)
        if "FP8" in r["location"]:
            continue  # FP8 attention is not priced
        consts = (K.ATTENTION_CONSTANTS["hopper-fa2"]
                  if r["kernel"] == "fa2" and family == "hopper" else None)
        eff = K.attention_efficiency(hw, int(r["seqlen"]), head_dim=int(r["head_dim"]),
                                     backward=r["pass"] == "bwd", causal=r["causal"] == "1",
                                     consts=consts)
        out.append({"kernel": f"{r['kernel']}-{r['pass']}", "gpu": r["gpu"],
                    "shape": f"s={r['seqlen']} d={r['head_dim']} causal={r['causal']}",
                    "role": r["role"], "published": float(r["tflops"]),
                    "predicted": eff * float(r["peak_tflops"])})
    return out
