"""Slice attention backends and per-slice autograd, single process (no torch.distributed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slimpack.runtime.attention import (
    VarlenLayout,
    choose_backend,
    dense_reference_attention,
    varlen_causal_attention,
)
from slimpack.runtime.data import make_tokens, num_label_tokens, segment_labels
from slimpack.runtime.examples import slimpack_plan
from slimpack.runtime.layout import GroupLayout, slice_inputs
from slimpack.runtime.model import IGNORE_INDEX
from slimpack.runtime.reference import reference_step
from slimpack.runtime.slice_autograd import SliceRunner
from slimpack.runtime.stage import build_chunks
from slimpack.specs import model_preset


def _qkv(layout: VarlenLayout, heads=4, kv_heads=2, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(layout.q_lens), heads, dim, generator=gen, requires_grad=True)
    k = torch.randn(sum(layout.k_lens), kv_heads, dim, generator=gen, requires_grad=True)
    v = torch.randn(sum(layout.k_lens), kv_heads, dim, generator=gen, requires_grad=True)
    return q, k, v


def test_layout_rejects_queries_longer_than_keys():
    with pytest.raises(ValueError, match="len_q <= len_k"):
        VarlenLayout(q_lens=(5,), k_lens=(4,))


def test_sdpa_backend_matches_dense_reference_forward_and_backward():
    # Three documents: one with a 9-token KV prefix, one without, one 1-token query.
    layout = VarlenLayout(q_lens=(7, 5, 1), k_lens=(16, 5, 4))
    q, k, v = _qkv(layout)
    out = varlen_causal_attention(q, k, v, layout, backend="sdpa")
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    want = dense_reference_attention(q, k, v, layout)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    # fp32 with O(1) values: the two paths sum in different orders (~1e-6 apart measured).
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_prefix_attention_is_bottom_right_aligned():
    # Queries [p, L) of a sequence with keys [0, L) must equal rows [p, L) of full causal
    # attention; SDPA's is_causal would align them top-left instead (ECOSYSTEM.md).
    length, prefix = 12, 5
    full = VarlenLayout(q_lens=(length,), k_lens=(length,))
    q, k, v = _qkv(full, heads=2, kv_heads=2)
    whole = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)),
                                           is_causal=True).transpose(0, 1)
    part = varlen_causal_attention(q[prefix:], k, v,
                                   VarlenLayout(q_lens=(length - prefix,), k_lens=(length,)))
    torch.testing.assert_close(part, whole[prefix:], rtol=1e-5, atol=1e-6)


def test_auto_backend_on_cpu_is_exact_sdpa():
    assert choose_backend(torch.device("cpu"), torch.float32) == "sdpa"
    assert choose_backend(torch.device("cpu"), torch.bfloat16) == "sdpa"
    with pytest.raises(ValueError, match="flash"):
        choose_backend(torch.device("cpu"), torch.bfloat16, "flash")


def test_labels_stop_at_the_end_of_each_sequence():
    tokens = torch.tensor([5, 6, 7, 8])
    assert segment_labels(tokens, 0, 2).tolist() == [6, 7]
    assert segment_labels(tokens, 2, 4).tolist() == [8, IGNORE_INDEX]
    assert num_label_tokens({0: 4, 1: 1}) == 3


def test_per_slice_autograd_matches_unsliced_model_without_distributed():
    # One replica of the SlimPack-style plan on one chunk holding the whole model: forward
    # units and backward units group the slices differently and nothing is recomputed.
    spec = model_preset("tiny")
    plan = slimpack_plan(pp=1, dp=1)
    group = next(plan.groups())
    assert group.is_asymmetric
    (chunk,) = build_chunks(spec, pp=1, vpp=1, stage=0, seed=0, device=torch.device("cpu"),
                            dtype=torch.float32)
    denom = num_label_tokens(plan.sequence_lengths)
    runner = SliceRunner(chunk, GroupLayout(group), attention_backend="sdpa",
                         head_dim=spec.head_dim, loss_scale=1.0 / denom)
    tokens = make_tokens(plan.sequence_lengths, vocab_size=spec.vocab_size, seed=0)
    loss = 0.0
    for unit in group.forward_units:
        for sl in group.unit_slices(unit):
            ids, labels, positions = slice_inputs(sl, tokens, torch.device("cpu"))
            loss += float(runner.forward(sl, ids, positions=positions, labels=labels))
    for unit in group.backward_units:
        for sl in group.unit_slices(unit):
            assert runner.backward(sl, None) is None  # first block: no input gradient
    assert runner.pending() == [] and runner.kv_cache == {} and runner.dkv == {}
    ref = reference_step(spec, plan.sequence_lengths, seed=0)
    assert loss == pytest.approx(ref.loss, rel=1e-6)
    for name, p in chunk.global_named_parameters():
        want = ref.grads[name]
        assert float((p.grad - want).norm() / want.norm()) < 1e-5, name
