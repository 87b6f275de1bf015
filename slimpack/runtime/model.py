"""Llama-style decoder pieces: RMSNorm, RoPE, GQA attention, SwiGLU, embedding and LM head.

Every parameter is initialised from a generator seeded by ``(seed, its global name)``, so a
pipeline stage that builds only its own layers gets exactly the weights the unsliced reference
model has, without ever materialising the whole model.

Attention itself is injected into :meth:`DecoderLayer.forward` as ``attend(q, k, v)``: the layer
does not know whether its queries see a KV prefix, a packed set of documents, or a whole
sequence; the per-slice autograd code decides that.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from slimpack.specs.model import ModelSpec

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(q [T,H,D], k [T,Hkv,D], v [T,Hkv,D]) -> o [T,H,D]``; k and v are the layer's own."""

IGNORE_INDEX = -100
"""Label of a token with no next token (the last token of every sequence)."""

INIT_STD = 0.02
ROPE_THETA = 10_000.0


def name_generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    return gen


def init_named(param: torch.Tensor, global_name: str, seed: int) -> None:
    """Norm weights start at one; every matrix at N(0, 0.02) from its own named stream."""
    with torch.no_grad():
        if global_name.endswith("norm.weight"):
            param.fill_(1.0)
            return
        # Draw in fp32 so bf16 and fp32 runs start from the same (rounded) weights.
        gen = name_generator(seed, global_name, param.device)
        values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        values.normal_(0.0, INIT_STD, generator=gen)
        param.copy_(values)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, *, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # normalise in fp32 whatever the activation dtype
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_tables(positions: torch.Tensor, head_dim: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, 1, D]`` for absolute token positions (rotate-half convention)."""
    half = head_dim // 2
    inv_freq = ROPE_THETA ** (-torch.arange(half, device=positions.device, dtype=torch.float32)
                              / half)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DecoderLayer(nn.Module):
    """Pre-norm block: x + Attn(norm(x)), then + SwiGLU(norm(x)); GQA with RoPE."""

    def __init__(self, spec: ModelSpec, *, device=None, dtype=None) -> None:
        super().__init__()
        if spec.head_dim % 2:
            raise ValueError(f"ModelSpec.head_dim must be even for RoPE, got {spec.head_dim}")
        kw = {"bias": False, "device": device, "dtype": dtype}
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_heads, spec.num_kv_heads, spec.head_dim)
        self.attn_norm = RMSNorm(spec.hidden, device=device, dtype=dtype)
        self.wq = nn.Linear(spec.hidden, spec.q_dim, **kw)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, **kw)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, **kw)
        self.wo = nn.Linear(spec.q_dim, spec.hidden, **kw)
        self.mlp_norm = RMSNorm(spec.hidden, device=device, dtype=dtype)
        self.w_gate = nn.Linear(spec.hidden, spec.ffn_hidden, **kw)
        self.w_up = nn.Linear(spec.hidden, spec.ffn_hidden, **kw)
        self.w_down = nn.Linear(spec.ffn_hidden, spec.hidden, **kw)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [T, hidden]`` -> (``x [T, hidden]``, own ``k``, own ``v`` ``[T, Hkv, D]``)."""
        t = x.shape[0]
        h = self.attn_norm(x)
        q = apply_rope(self.wq(h).view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.wk(h).view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.wv(h).view(t, self.num_kv_heads, self.head_dim)
        o = attend(q, k, v)
        x = x + self.wo(o.reshape(t, self.num_heads * self.head_dim))
        h = self.mlp_norm(x)
        x = x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))
        return x, k, v


class LMHead(nn.Module):
    """Final norm, vocabulary projection and the summed cross-entropy (fp32)."""

    def __init__(self, spec: ModelSpec, *, tied_weight: nn.Parameter | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.final_norm = RMSNorm(spec.hidden, device=device, dtype=dtype)
        if tied_weight is not None:
            self._tied = [tied_weight]  # a list so nn.Module does not register it twice
            self.weight = None
        else:
            self._tied = []
            self.weight = nn.Parameter(
                torch.empty(spec.vocab_size, spec.hidden, device=device, dtype=dtype))

    def loss_sum(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Sum (not mean) of next-token cross-entropy over labelled tokens: the caller
        divides by the global label count, so slicing and packing do not change the loss."""
        weight = self._tied[0] if self._tied else self.weight
        logits = F.linear(self.final_norm(x), weight).float()
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
