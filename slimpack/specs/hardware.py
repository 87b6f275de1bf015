"""Accelerator and network descriptions (``HardwareSpec``) with vendor-datasheet presets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from slimpack.specs._validate import (
    require_fraction,
    require_non_negative,
    require_positive,
    unknown_preset,
)

KERNEL_FAMILIES = ("ampere", "hopper")


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One GPU type and the network between GPUs.

    Bandwidths are per GPU and per direction, in GB/s (1e9 bytes/s). Efficiency fields turn
    peak FLOP/s into achievable FLOP/s in the analytic cost model: a GEMM over ``m`` rows
    runs at ``gemm_efficiency * m / (m + half_efficiency_tokens)`` of peak, so small
    micro-batches are priced as the less efficient kernels they are.
    """

    name: str
    peak_tflops: float
    """Dense bf16 tensor-core peak, TFLOP/s."""
    memory_gib: float
    hbm_tbps: float
    """Device memory bandwidth, TB/s."""
    gpus_per_node: int = 8
    intra_node_gbps: float
    """NVLink bandwidth per GPU per direction, GB/s."""
    inter_node_gbps: float
    """Network (InfiniBand/RoCE) bandwidth per GPU per direction, GB/s."""
    intra_node_latency_s: float = 5e-6
    inter_node_latency_s: float = 15e-6
    gemm_efficiency: float = 0.75
    """Fraction of peak a large GEMM reaches (measured on an H200 here: ~790/989 = 0.80)."""
    attention_efficiency: float = 0.55
    """Fraction of peak a large FlashAttention forward reaches."""
    half_efficiency_tokens: int = 256
    """Per-GPU rows at which a GEMM reaches half of gemm_efficiency."""
    usable_memory_fraction: float = 0.92
    """Share of memory_gib left after the CUDA context, NCCL buffers and fragmentation."""
    num_sms: int = 108
    """Streaming multiprocessors: the wave size of GEMM tile quantisation (A100 108, H100 132)."""
    peak_fp8_tflops: float = 0.0
    """Dense FP8 tensor-core peak, TFLOP/s; 0 where the GPU has no FP8 tensor cores (A100)."""
    kernel_family: str = "ampere"
    """Which fitted kernel constants apply (slimpack.cost.kernels): ``ampere`` or ``hopper``."""
    host_link_gbps: float = 32.0
    """GPU-host link per direction, GB/s: PCIe Gen4 x16 (A100 datasheet: 64 GB/s both ways);
    activation offload travels over it."""

    def __post_init__(self) -> None:
        for f in ("peak_tflops", "memory_gib", "hbm_tbps", "gpus_per_node",
                  "intra_node_gbps", "inter_node_gbps"):
            require_positive("HardwareSpec", f, getattr(self, f))
        for f in ("intra_node_latency_s", "inter_node_latency_s", "half_efficiency_tokens"):
            require_non_negative("HardwareSpec", f, getattr(self, f))
        for f in ("gemm_efficiency", "attention_efficiency", "usable_memory_fraction"):
            require_fraction("HardwareSpec", f, getattr(self, f))
        require_positive("HardwareSpec", "num_sms", self.num_sms)
        require_positive("HardwareSpec", "host_link_gbps", self.host_link_gbps)
        require_non_negative("HardwareSpec", "peak_fp8_tflops", self.peak_fp8_tflops)
        if self.kernel_family not in KERNEL_FAMILIES:
            raise ValueError(f"HardwareSpec.kernel_family must be one of "
                             f"{', '.join(KERNEL_FAMILIES)}, got {self.kernel_family!r}")

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def usable_memory_bytes(self) -> float:
        return self.memory_gib * 2**30 * self.usable_memory_fraction

    def with_gpus_per_node(self, gpus_per_node: int) -> HardwareSpec:
        return replace(self, gpus_per_node=gpus_per_node)


# Vendor datasheets (dense bf16, no sparsity). NVLink per direction = half the bidirectional
# figure; inter-node = one 400 Gb/s NIC per GPU (50 GB/s), 200 Gb/s (25 GB/s) for A100 pods.
# Hopper SXM: 132 SMs, dense FP8 1979 TFLOP/s (NVIDIA H100 datasheet; H800/H200 share the die).
# Host link: PCIe Gen5 x16, 128 GB/s both ways (NVIDIA H100 datasheet).
_HOPPER = {"num_sms": 132, "peak_fp8_tflops": 1979.0, "kernel_family": "hopper",
           "host_link_gbps": 64.0}

HARDWARE_PRESETS: dict[str, Callable[[], HardwareSpec]] = {
    "a100-40g": lambda: HardwareSpec(name="a100-40g", peak_tflops=312, memory_gib=40,
                                     hbm_tbps=1.555, intra_node_gbps=300, inter_node_gbps=25),
    "a100-80g": lambda: HardwareSpec(name="a100-80g", peak_tflops=312, memory_gib=80,
                                     hbm_tbps=2.039, intra_node_gbps=300, inter_node_gbps=25),
    "h100-80g": lambda: HardwareSpec(name="h100-80g", peak_tflops=989, memory_gib=80,
                                     hbm_tbps=3.35, intra_node_gbps=450, inter_node_gbps=50,
                                     **_HOPPER),
    # H800: the export part; NVLink 400 GB/s bidirectional (docs/architecture.md, core types).
    "h800-80g": lambda: HardwareSpec(name="h800-80g", peak_tflops=989, memory_gib=80,
                                     hbm_tbps=3.35, intra_node_gbps=200, inter_node_gbps=50,
                                     **_HOPPER),
    "h200-141g": lambda: HardwareSpec(name="h200-141g", peak_tflops=989, memory_gib=141,
                                      hbm_tbps=4.8, intra_node_gbps=450, inter_node_gbps=50,
                                      **_HOPPER),
}

_ALIASES = {"a100": "a100-80g", "h100": "h100-80g", "h800": "h800-80g", "h200": "h200-141g"}


def hardware_preset(name: str) -> HardwareSpec:
    """Return the preset called ``name`` (case-insensitive; ``h100`` means ``h100-80g``)."""
    key = _ALIASES.get(name.lower(), name.lower())
    try:
        return HARDWARE_PRESETS[key]()
    except KeyError:
        raise unknown_preset("hardware", name, list(HARDWARE_PRESETS) + list(_ALIASES)) from None
