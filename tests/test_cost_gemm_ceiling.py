"""The GEMM ceiling (docs/cost-model.md, "Scale terms"): no GEMM runs faster than the measured
maximum achievable matmul throughput of its GPU, checked on hand-computed numbers."""

from __future__ import annotations

import pytest

from slimpack.cost import kernels
from slimpack.cost.kernel_model import KernelCostModel
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

A100 = hardware_preset("a100-80g")
H100 = hardware_preset("h100")
LLAMA7 = model_preset("llama-7b")


def test_ceiling_is_the_measured_maximum_achievable_matmul_flops():
    """MAMF table: A100 SXM 267.9 TFLOP/s, H100 SXM 792.1 TFLOP/s (bf16). A 16384^3 GEMM is
    2 * 16384^3 = 8.796e12 FLOPs: 32.83 ms on A100, 11.10 ms on H100."""
    flops = 2.0 * 16384**3
    assert kernels.gemm_ceiling_seconds(A100, 16384, 16384, 16384) == pytest.approx(
        flops / 267.9e12, rel=1e-12)
    assert kernels.gemm_ceiling_seconds(H100, 16384, 16384, 16384) == pytest.approx(
        flops / 792.1e12, rel=1e-12)
    # No FP8 measurement: FP8 GEMMs are not capped.
    assert kernels.gemm_ceiling_seconds(H100, 16384, 16384, 16384, dtype="fp8") == 0.0


def test_cost_model_caps_the_tile_model_where_it_exceeds_the_ceiling():
    """A100, 16384^3: the tile model gives 152 waves x 2*128*128*(16384 + 416) FLOPs at
    0.90 x 312/108 TFLOP/s per SM + 6 us = 32.19 ms (273.3 TFLOP/s), above the 267.9 TFLOP/s
    ceiling, so the cost model charges the ceiling's 32.83 ms. At 2048^3 the tile model
    (thin k: 2048/(2048 + 416) of the asymptote) is below the ceiling and stands."""
    cost = KernelCostModel(model=LLAMA7, hardware=A100)
    tile = kernels.gemm_seconds(A100, 16384, 16384, 16384)
    assert tile == pytest.approx(152 * 2 * 128 * 128 * (16384 + 416) / (312e12 / 108 * 0.9)
                                 + 6e-6, rel=1e-12)
    assert cost._gemm(16384, 16384, 16384) == pytest.approx(2.0 * 16384**3 / 267.9e12,
                                                            rel=1e-12)
    assert cost._gemm(2048, 2048, 2048) == kernels.gemm_seconds(A100, 2048, 2048, 2048)


def test_fp8_recipe_gemms_are_not_capped_but_its_bf16_head_is():
    fp8 = KernelCostModel(model=LLAMA7, hardware=H100, training=TrainingSpec(dtype="fp8"))
    assert fp8._gemm(16384, 16384, 16384) == kernels.gemm_seconds(H100, 16384, 16384, 16384,
                                                                  dtype="fp8")
    assert fp8._gemm(16384, 16384, 16384, dtype="bf16") == pytest.approx(
        2.0 * 16384**3 / 792.1e12, rel=1e-12)
