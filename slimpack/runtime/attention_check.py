"""Two attention backends on the same varlen inputs: forward output and dQ/dK/dV compared.

The GPU check uses it for flash-attn's varlen kernel against the exact per-document SDPA path
(`slimpack.runtime.attention`), forward and backward; the CPU tests for SDPA against the dense
masked reference. Both backends see the same inputs in the same dtype and the same output
gradient, so the errors measure the kernels, not the rounding of the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slimpack.runtime.attention import VarlenLayout, varlen_causal_attention


@dataclass(frozen=True, kw_only=True)
class BackendAgreement:
    backend: str
    reference: str
    dtype: str
    out_rel: float
    """||out - out_ref|| / ||out_ref||."""
    grad_rel: dict[str, float]
    """The same norm-relative error for dq, dk and dv."""

    @property
    def worst(self) -> float:
        return max(self.out_rel, *self.grad_rel.values())


def backend_agreement(layout: VarlenLayout, *, heads: int, kv_heads: int, head_dim: int,
                      backend: str, reference: str = "sdpa", device: torch.device,
                      dtype: torch.dtype, seed: int = 0) -> BackendAgreement:
    """Run ``backend`` and ``reference`` on one set of random q, k, v (GQA when ``kv_heads``
    < ``heads``) with bottom-right causal masks per document, and one random output gradient."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(rows: int, h: int) -> torch.Tensor:
        return torch.randn(rows, h, head_dim, device=device, dtype=torch.float32,
                           generator=gen).to(dtype)

    q = rand(sum(layout.q_lens), heads)
    k, v = rand(sum(layout.k_lens), kv_heads), rand(sum(layout.k_lens), kv_heads)
    d_out = rand(sum(layout.q_lens), heads)

    def run(name: str) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = varlen_causal_attention(*leaves, layout, backend=name)
        out.backward(d_out)
        return (out.detach().float(), *(t.grad.float() for t in leaves))

    got, want = run(backend), run(reference)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    return BackendAgreement(
        backend=backend, reference=reference, dtype=str(dtype).removeprefix("torch."),
        out_rel=rel(got[0], want[0]),
        grad_rel={name: rel(a, b) for name, a, b in zip(("dq", "dk", "dv"), got[1:], want[1:],
                                                         strict=True)})
