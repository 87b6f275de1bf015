"""FLOP counts per layer for segments with a KV prefix (docs/cost-model.md).

A *piece of work* is ``(tokens, kv_prefix)``: ``tokens`` query tokens of one document whose
keys/values include the ``kv_prefix`` tokens before them. A packed slice of several documents
is a list of such pieces; attention is summed per document, never over the whole pack, which
is what makes packing short documents cheap.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from slimpack.specs.model import ModelSpec

Piece = tuple[int, int]
"""(query tokens, KV prefix tokens) of one document on one device."""


def as_piece_list(pieces: Iterable[Piece]) -> list[Piece]:
    """``pieces`` as a list of ``(tokens, kv_prefix)`` Python ints, whether given as pairs or
    as the simulator's ``(n, 2)`` integer array."""
    if hasattr(pieces, "tolist"):
        return [(int(t), int(p)) for t, p in pieces.tolist()]
    return list(pieces)


@dataclass(frozen=True, kw_only=True, slots=True)
class FlopCount:
    """Forward FLOPs of one layer split by kind, because their backward ratios differ."""

    linear: float = 0.0
    attention: float = 0.0

    def __add__(self, other: FlopCount) -> FlopCount:
        return FlopCount(linear=self.linear + other.linear,
                         attention=self.attention + other.attention)

    def scaled(self, factor: float) -> FlopCount:
        return FlopCount(linear=self.linear * factor, attention=self.attention * factor)

    @property
    def total(self) -> float:
        return self.linear + self.attention


def linear_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token per layer of QKV, out-projection and the MLP.

    ``2*(h*(q + 2*kv) + q*h + M*h*ffn*top_k)`` with M = 3 matrices for SwiGLU, 2 for GeLU;
    for MHA (q = kv = h) this is docs/cost-model.md's
    ``2*(h*(h + 2*kv_dim) + h*h + 3*h*ffn)``. MoE multiplies the MLP term by top_k.
    """
    h = model.hidden
    attn = h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h
    mlp = model.mlp_matrices * h * model.ffn_hidden * model.moe_top_k
    return 2.0 * (attn + mlp)


def attention_flops(model: ModelSpec, tokens: int, kv_prefix: int) -> float:
    """Causal attention forward FLOPs of one layer: ``4*q_dim*(l*p + l*(l+1)/2)``.

    Each query attends to the prefix plus the causal part of its own segment (QK^T and PV,
    2 FLOPs per multiply-add each).
    """
    if tokens < 0 or kv_prefix < 0:
        raise ValueError(f"tokens and kv_prefix must be >= 0, got {tokens}, {kv_prefix}")
    return 4.0 * model.q_dim * (tokens * kv_prefix + tokens * (tokens + 1) / 2)


def layer_flops(model: ModelSpec, pieces: Iterable[Piece]) -> FlopCount:
    """Forward FLOPs of one layer over pieces of (possibly several) documents."""
    per_token = linear_flops_per_token(model)
    linear = 0.0
    attention = 0.0
    for tokens, prefix in pieces:
        linear += per_token * tokens
        attention += attention_flops(model, tokens, prefix)
    return FlopCount(linear=linear, attention=attention)


def head_flops(model: ModelSpec, tokens: int) -> float:
    """LM head forward FLOPs (``2*l*h*vocab``); the embedding is a gather and costs none."""
    return 2.0 * tokens * model.hidden * model.vocab_size


def model_flops(model: ModelSpec, sequence_lengths: Iterable[int]) -> float:
    """FLOPs the step *needs*, for MFU: forward + backward at the conventional 2x.

    Causal attention is counted once (no recompute, no padding, no softmax recompute of
    FlashAttention's backward): linear terms grow with sum L, attention with sum L^2,
    Megatron-LM's varlen form.
    """
    # Written over arrays for a paper-size batch (10^5 documents, once per simulated layout),
    # with the scalar form's float operations in its order: attention_flops(model, L, 0) is
    # 4*q_dim*(L(L+1)/2), head_flops is ((2*L)*hidden)*vocab, and the running total is
    # a cumulative sum, which numpy adds strictly left to right (a plain sum would pair).
    lengths = np.fromiter(sequence_lengths, dtype=np.int64)
    if not len(lengths):
        return 0.0
    if (lengths < 0).any():
        raise ValueError(f"sequence lengths must be >= 0, got {int(lengths.min())}")
    per_token = linear_flops_per_token(model)
    attention = 4.0 * model.q_dim * (lengths * (lengths + 1) / 2)
    fwd = model.num_layers * (per_token * lengths + attention)
    fwd += 2.0 * lengths * model.hidden * model.vocab_size
    return float(np.cumsum(3.0 * fwd)[-1])


def mfu(needed_flops: float, step_time_s: float, num_gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: needed FLOPs / (elapsed * GPUs * peak)."""
    if step_time_s <= 0 or num_gpus <= 0:
        raise ValueError(f"step_time_s and num_gpus must be > 0, got {step_time_s}, {num_gpus}")
    return needed_flops / (step_time_s * num_gpus * peak_flops)
