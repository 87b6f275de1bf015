"""The correctness oracle: the whole unsliced batch through one single-process model.

Same weights (name-seeded init), same tokens (seeded per sequence), same label convention and
token-weighted loss as the runtime; each sequence runs whole with plain causal attention, no
slices, no KV prefix, no packing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from slimpack.runtime.attention import VarlenLayout, varlen_causal_attention
from slimpack.runtime.data import make_tokens, num_label_tokens, segment_labels
from slimpack.runtime.model import rope_tables
from slimpack.runtime.stage import build_chunks
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class ReferenceResult:
    loss: float
    grads: dict[str, torch.Tensor]
    """Global parameter name -> gradient (CPU, fp32)."""


def reference_step(spec: ModelSpec, sequence_lengths: Mapping[int, int], *, seed: int = 0,
                   device: str = "cpu", dtype: torch.dtype = torch.float32,
                   attention_backend: str = "sdpa") -> ReferenceResult:
    dev = torch.device(device)
    (model,) = build_chunks(spec, pp=1, vpp=1, stage=0, seed=seed, device=dev, dtype=dtype)
    tokens = make_tokens(sequence_lengths, vocab_size=spec.vocab_size, seed=seed)
    denom = num_label_tokens(sequence_lengths)
    total = torch.zeros((), dtype=torch.float32, device=dev)
    for seq_id, length in sorted(sequence_lengths.items()):
        ids = tokens[seq_id].to(dev)
        labels = segment_labels(tokens[seq_id], 0, length).to(dev)
        cos, sin = rope_tables(torch.arange(length, device=dev), spec.head_dim, dtype)
        whole = VarlenLayout(q_lens=(length,), k_lens=(length,))

        def attend_for_layer(_layer: int, whole=whole):
            return lambda q, k, v: varlen_causal_attention(q, k, v, whole,
                                                           backend=attention_backend)

        loss_sum, _ = model(ids, cos=cos, sin=sin, attend_for_layer=attend_for_layer,
                            labels=labels)
        (loss_sum / denom).backward()
        total += loss_sum.detach() / denom
    grads = {name: p.grad.detach().float().cpu().clone()
             for name, p in model.global_named_parameters()}
    return ReferenceResult(loss=float(total), grads=grads)
