"""``RuntimeConfig``: how a plan is executed (device, dtype, communication backend, seed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ATTENTION_BACKENDS = ("auto", "flash", "torch-varlen", "sdpa", "dense")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    device: str = "cpu"
    """"cpu" or "cuda" (each rank then uses cuda:LOCAL_RANK)."""
    dtype: str = "fp32"
    """Parameter and activation dtype: fp32, bf16 or fp16 (the loss is always fp32)."""
    dist_backend: str = "gloo"
    """torch.distributed backend: gloo (CPU) or nccl (CUDA)."""
    attention: str = "auto"
    """Attention backend, see :func:`slimpack.runtime.attention.choose_backend`."""
    seed: int = 0
    """Seeds both the weights (per parameter name) and the token ids (per sequence)."""
    warmup_steps: int = 0
    """Untimed identical steps run first, so the measured one excludes first-call costs."""
    measured_steps: int = 1
    """Timed steps; the record keeps the one with the median step time (noise on shared
    machines)."""
    record_ops: bool = True
    """Time every op; on CUDA this synchronises after each op."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"RuntimeConfig.device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"RuntimeConfig.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.dist_backend not in ("gloo", "nccl"):
            raise ValueError(
                f"RuntimeConfig.dist_backend must be 'gloo' or 'nccl', got {self.dist_backend!r}"
            )
        if self.dist_backend == "nccl" and self.device != "cuda":
            raise ValueError("RuntimeConfig: dist_backend='nccl' needs device='cuda'")
        if self.warmup_steps < 0:
            raise ValueError(f"RuntimeConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.measured_steps < 1:
            raise ValueError(f"RuntimeConfig.measured_steps must be >= 1, got "
                             f"{self.measured_steps}")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"RuntimeConfig.attention must be one of {ATTENTION_BACKENDS}, got {self.attention!r}"
            )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
