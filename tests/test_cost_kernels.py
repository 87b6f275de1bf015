"""Kernel-level models (slimpack.cost.kernels) against the cited kernel data."""

from __future__ import annotations

import pytest

from slimpack.cost import kernel_fit, kernels
from slimpack.cost.kernel_model import KernelCostModel
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

A100 = hardware_preset("a100")
H100 = hardware_preset("h100")


def test_shipped_constants_are_the_fit_of_the_kernel_data():
    fit = kernel_fit.fit_all()
    assert fit.gemm == kernels.GEMM_CONSTANTS
    assert fit.attention == kernels.ATTENTION_CONSTANTS
    assert fit.network == kernels.NETWORK_EFFICIENCY
    assert fit.ceiling == kernels.GEMM_CEILING


def test_bf16_layer_gemms_hold_out_on_transformer_engine_h200_nvl():
    """Transformer Engine's GEMM profiling tutorial, H200 NVL (835.5 dense bf16 TFLOP/s, 600 W):
    one layer's four bf16 GEMMs at 15,872 tokens (6.391e12 FLOPs per pass) take 10.653 /
    10.813 / 10.548 ms (fprop / dgrad / wgrad). The tile model with the Hopper constants of
    our H200 SXM sweep (eta 0.75, k0 224: a k=4096 GEMM runs at 0.75 x 4096/4320 = 0.711 of
    peak; dgrad and wgrad reduce over 16,384 and 15,872) gives 10.868 / 10.819 / 10.695 ms,
    within 1.5% of each, above the sustained ceiling (6.391e12 / (0.72772 x 835.5e12) =
    10.511 ms), which no longer binds at these k; the best-case 792.1/989 ceiling (9.551 ms)
    was 10-12% fast."""
    rows = [r for r in kernel_fit.layer_residuals() if r["recipe"] == "bf16"]
    assert [r["pass"] for r in rows] == ["fprop", "dgrad", "wgrad"]
    for r, expected in zip(rows, (10.808, 10.772, 10.674), strict=True):
        assert r["predicted_ms"] == pytest.approx(expected, rel=1e-3)
        assert r["predicted_ms"] == pytest.approx(r["published_ms"], rel=0.015), r


def test_hopper_bf16_fit_reproduces_the_h200_sweep_and_holds_out_on_h100_squares():
    """Our H200 SXM sweep (results/gpu/kernels.csv, datasets/kernels/gemm.csv; 196 fitted bf16
    GEMMs: squares from 2048^3 and every layer GEMM of Llama 7B/13B/70B at tp 1-8, 1K-16K
    tokens): the fitted tile model's median |error| is under 4% and no row is off by more than
    33% (the worst are 1,024-token GEMMs, where cuBLAS avoids the wave quantisation the model
    charges, and the thin-k attention-out GEMMs at tp 8). Held out: the launch-bound 1024^3
    (not fitted), and the H100 SXM square sweep of torch 2.7 (zzc0721/torch-performance-test-
    data issue #79) from 2048^3 up, within 15% (short best-case runs, faster than sustained)."""
    rows = [r for r in kernel_fit.residuals() if r["gpu"] == "h200-sxm-141g"
            and "bf16" in r["shape"] and r["role"] == "fit"]
    assert len(rows) == 196
    errors = sorted(abs(r["predicted"] / r["published"] - 1) for r in rows)
    assert errors[len(errors) // 2] < 0.04
    assert errors[-1] < 0.33
    held = [r for r in kernel_fit.residuals() if r["gpu"] == "h100-sxm-80g"
            and r["role"] == "holdout" and r["published"] > 600 and "x" in r["shape"]]
    assert len(held) >= 5
    for r in held:
        assert r["predicted"] == pytest.approx(r["published"], rel=0.15), r


def test_fit_rows_are_reproduced_within_tolerance():
    # Fit rows of the GPUs the constants belong to: within 26% each (the A100 2048^3 rows
    # disagree with each other: bf16 138 vs fp16 215 TFLOP/s on the same tensor cores). The
    # H200 sweep has its own test (above).
    own = {"a100-pcie-40g", "a100-sxm-80g", "h100-pcie-80g"}
    rows = [r for r in kernel_fit.residuals() if r["role"] == "fit" and r["gpu"] in own]
    assert len(rows) >= 12
    for r in rows:
        assert r["predicted"] == pytest.approx(r["published"], rel=0.26), r


def test_wave_quantisation_one_tile_over_a_wave_costs_a_second_wave():
    # 108 SMs on an A100: 12 x 9 = 108 output tiles of 128x128 fill one wave; one row more
    # (a ragged 13th tile row: tile quantisation) makes 117 tiles, two waves.
    one = kernels.gemm_seconds(A100, 128 * 12, 128 * 9, 8192)
    two = kernels.gemm_seconds(A100, 128 * 12 + 1, 128 * 9, 8192)
    assert two / one == pytest.approx(2.0, rel=0.05)  # the fixed launch cost is not doubled


def test_gemm_efficiency_rises_with_k_thin_hidden_sizes_are_slower():
    assert (kernels.gemm_efficiency(A100, 16384, 6912, 2304)
            < kernels.gemm_efficiency(A100, 16384, 6912, 20480))


def test_attention_bwd_fwd_ratio_falls_with_document_length_as_published():
    """FlashAttention-2 seqlen sweep (gpu-mode/ring-attention issue #10, non-causal, d=64):
    bwd/fwd time = 2.5 * fwd_rate / bwd_rate = 2.5*84.08/52.88 = 3.97 at 512 tokens and
    2.5*81.86/77.42 = 2.64 at 8192. The model (fitted to that sweep) within 5%."""
    def ratio(s: int) -> float:
        f = kernels.attention_seconds(A100, [(s, 0)], heads=1, head_dim=64, backward=False,
                                      causal=False)
        b = kernels.attention_seconds(A100, [(s, 0)], heads=1, head_dim=64, backward=True,
                                      causal=False)
        return b / f
    assert ratio(512) == pytest.approx(2.5 * 84.08 / 52.88, rel=0.05)
    assert ratio(8192) == pytest.approx(2.5 * 81.86 / 77.42, rel=0.05)
    # and for a causal unit priced by the cost model: short documents, dearer backward.
    cost = KernelCostModel(model=model_preset("llama-7b"), hardware=A100)
    short = cost.attention_times([(512, 0)] * 64)
    long = cost.attention_times([(32768, 0)])
    assert short.backward_s / short.forward_s > 1.2 * long.backward_s / long.forward_s


def test_causal_tile_accounting_holds_out_on_h20():
    """Held out (not fitted): FlashAttention-3 on H20 (Dao-AILab/flash-attention issue #1310),
    s=2048, d=128: causal 107.8 vs non-causal 126.2 TFLOP/s (ratio 0.854)."""
    causal = kernels.attention_efficiency(H100, 2048, head_dim=128, causal=True)
    full = kernels.attention_efficiency(H100, 2048, head_dim=128, causal=False)
    assert causal / full == pytest.approx(107.8 / 126.2, rel=0.03)


def test_fp8_gemms_need_fp8_tensor_cores():
    with pytest.raises(ValueError, match="fp8"):
        KernelCostModel(model=model_preset("llama-7b"), hardware=A100,
                        training=TrainingSpec(dtype="fp8"))
    bf16 = KernelCostModel(model=model_preset("llama-7b"), hardware=H100)
    fp8 = KernelCostModel(model=model_preset("llama-7b"), hardware=H100,
                          training=TrainingSpec(dtype="fp8"))
    b, f = bf16.linear_times(16384), fp8.linear_times(16384)
    assert 1.2 < b.forward_s / f.forward_s < 2.0  # faster, but far from the 2x peak ratio
    # One large tile-aligned GEMM: FP8 peak is 2x bf16; the fits' eta 0.64 (fp8, CUTLASS-class
    # rows of DeepGEMM's H800 sweep) vs 0.75 (bf16, our H200 sweep) and their k0 (544 vs 224)
    # give 2 * 0.64/0.75 * (16384+224)/(16384+544) = 1.674; launch costs are 0.01%.
    n = 16384
    ratio = (kernels.gemm_seconds(H100, n, n, n) / kernels.gemm_seconds(H100, n, n, n, dtype="fp8"))
    assert ratio == pytest.approx(2 * 0.64 / 0.75 * (n + 224) / (n + 544), rel=0.005)


def test_fp8_gemm_fit_rows_within_seven_percent():
    """DeepGEMM README (deepseek-ai/DeepGEMM a6d97a1), dense GEMMs at M=4096 on H800: the
    CUTLASS 3.6 baseline (TFLOPS / stated speedup), e.g. 4096x7168x16384: 1358/1.2 = 1131.7."""
    rows = [r for r in kernel_fit.residuals()
            if r["gpu"] == "h800-sxm-80g" and r["role"] == "fit" and "fp8" in r["shape"]]
    assert len(rows) == 6
    for r in rows:
        assert r["predicted"] == pytest.approx(r["published"], rel=0.07), r


def test_training_spec_rejects_unknown_values():
    with pytest.raises(ValueError, match="zero_stage"):
        TrainingSpec(zero_stage=2)
    with pytest.raises(ValueError, match="attention_kernel"):
        TrainingSpec(attention_kernel="xformers")


def test_hopper_fa2_constants_fit_the_h200_flashattention2_sweep():
    """Our H200 SXM sweep of torch's FlashAttention-2 kernels (datasets/kernels/
    flash_attention.csv): the 14 fitted rows (head dim 128, non-causal, 512-32K tokens, forward
    and backward) within 4% each. Held out: the causal rows' backward within 6%; their forward
    runs 5-26% slower than the causal tile accounting predicts (most at 512 tokens), a known
    gap of the FA2-class constants."""
    rows = [r for r in kernel_fit.residuals() if r["gpu"] == "h200-sxm-141g"
            and r["kernel"].startswith("fa2-")]
    fitted = [r for r in rows if r["role"] == "fit"]
    assert len(fitted) == 14
    for r in fitted:
        assert r["predicted"] == pytest.approx(r["published"], rel=0.04), r
    causal = [r for r in rows if "d=128 causal=1" in r["shape"]]
    assert len(causal) == 14
    for r in causal:
        ratio = r["predicted"] / r["published"]
        if r["kernel"] == "fa2-bwd":
            assert ratio == pytest.approx(1.0, abs=0.06), r
        else:
            assert 1.04 < ratio < 1.26, r
