"""Megatron-LM's two attention semantics (issue: comparisons a reviewer would accept).

``megatron`` trains with document masks and shards CP per document (Transformer Engine's
``thd`` layout); ``megatron-causal`` attends over the whole packed sample. The attention
FLOPs below are what the simulator charges: the plan's segments, sharded by
:func:`slimpack.cost.cp_sharding.shard_pieces` exactly as ``slimpack.sim.costs`` does, priced
with the causal formula of :func:`slimpack.cost.flops.attention_flops`,
``4 * q_dim * (l*p + l*(l+1)/2)`` per layer (QK^T and PV, 2 FLOPs per multiply-add, each
query attending to its KV prefix ``p`` and the causal part of its own piece).
"""

from __future__ import annotations

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.cost.cp_sharding import shard_pieces
from slimpack.cost.flops import attention_flops, model_flops
from slimpack.methods import get_method, method_names
from slimpack.sim import simulate
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODEL, HW = model_preset("llama-7b"), hardware_preset("h100")
COST = AnalyticCostModel(model=MODEL, hardware=HW)
DOCS = [3000, 1200, 700, 2500, 400, 192]  # 7,992 tokens: one sample at context 8192
Q = MODEL.q_dim  # 4096


def _charged(plan):
    """(total attention FLOPs per layer, per-CP-rank attention FLOPs per slice) as charged."""
    total, per_rank = 0.0, []
    for group in plan.groups():
        for sl in group.slices:
            shards = shard_pieces([(s.num_tokens, s.start) for s in sl.segments], group.cp,
                                  group.cp_sharding)
            ranks = [sum(attention_flops(MODEL, t, p) for t, p in r) for r in shards]
            per_rank.append(ranks)
            total += sum(ranks)
    return total, per_rank


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_attention_flops_follow_the_attention_semantics(cp):
    batch = Batch.from_lengths(DOCS)
    par = ParallelSpec(tp=8 // cp, cp=cp)
    masked = plan_method("megatron", batch, MODEL, HW, par, COST, context=8192)
    causal = plan_method("megatron-causal", batch, MODEL, HW, par, COST, context=8192)
    # Formula by hand: 4 * 4096 * n(n+1)/2 per document (sum n(n+1)/2 = 8,692,428), or
    # 4 * 4096 * 7992 * 7993 / 2 over the whole sample: 3.67x the useful attention.
    per_document = 4 * Q * sum(n * (n + 1) // 2 for n in DOCS)
    full_sample = 4 * Q * 7992 * 7993 // 2
    assert (per_document, full_sample) == (142_416_740_352, 523_305_418_752)
    assert _charged(masked)[0] == pytest.approx(per_document, rel=1e-12)
    assert _charged(causal)[0] == pytest.approx(full_sample, rel=1e-12)
    assert {g.cp_sharding for g in masked.groups()} == {"per-document"}


def test_megatron_shards_each_document_so_cp_ranks_balance():
    """Per-document zigzag: every rank holds an early and a late chunk of *every* document, so
    per-rank attention is within a few tokens' worth; one zigzag over the packed buffer
    (the old behaviour) leaves 2.3x between ranks on this sample."""
    batch = Batch.from_lengths(DOCS)
    plan = plan_method("megatron", batch, MODEL, HW, ParallelSpec(tp=2, cp=4), COST,
                       context=8192)
    (ranks,) = _charged(plan)[1]
    assert max(ranks) / min(ranks) < 1.01
    old = [sum(attention_flops(MODEL, t, p) for t, p in r)
           for r in shard_pieces([(n, 0) for n in DOCS], 4, "per-sequence")]
    assert max(old) / min(old) > 2


def test_mfu_numerator_is_the_batch_under_document_masks_for_every_method():
    """A method must not earn MFU for attention work the batch does not need: mfu * step *
    GPUs * peak is the batch's model FLOPs under document masks for every method, including
    megatron (which cuts documents at sample boundaries) and megatron-causal."""
    lengths = [9000, 5000, 3000, 2500, 1200, 700, 300] * 4
    batch = Batch.from_lengths(lengths)
    needed = model_flops(MODEL, lengths)
    par = ParallelSpec(tp=4, cp=2)
    steps = {}
    for method in ("megatron", "megatron-causal", "slimpack"):
        plan = plan_method(method, batch, MODEL, HW, par, COST, context=16384)
        rec = simulate(plan, model=MODEL, hardware=HW, cost=COST).record
        assert sorted(plan.document_lengths().values()) == sorted(lengths)
        assert rec.num_sequences == len(lengths) and rec.num_tokens == sum(lengths)
        assert rec.mfu * rec.step_time_s * 8 * HW.peak_flops == pytest.approx(needed, rel=1e-9)
        steps[method] = rec
    # Full-causal samples do more attention for the same useful work: slower, lower MFU.
    assert steps["megatron-causal"].step_time_s > steps["megatron"].step_time_s
    assert steps["megatron-causal"].mfu < steps["megatron"].mfu


def test_megatron_causal_is_registered_with_its_own_spec():
    assert method_names().index("megatron-causal") == method_names().index("megatron") + 1
    spec = get_method("megatron-causal")
    assert spec is not get_method("megatron")
    assert "without document masks" in spec.summary and "Megatron-LM" in spec.source
    batch = Batch.from_lengths(DOCS * 3)
    plan = plan_method("megatron-causal", batch, MODEL, HW, ParallelSpec(tp=8), COST,
                       context=8192)
    # Every sample is one causal sequence of `context` tokens (the last may be shorter),
    # and the documents it holds add up to the batch.
    assert sorted(plan.sequence_lengths.values()) == [7592, 8192, 8192]  # 3 * 7992 tokens
    held = [n for docs in plan.documents.samples.values() for _, n in docs]
    assert sum(held) == batch.num_tokens
    with pytest.raises(ValueError, match="context"):
        plan_method("megatron-causal", batch, MODEL, HW, ParallelSpec(tp=8), COST, context=0)
