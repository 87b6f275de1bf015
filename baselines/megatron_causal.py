"""Megatron-LM without document masks: full-context causal samples, as stock pretraining runs.

Megatron-LM's GPTDataset concatenates documents and cuts a sample every ``context`` tokens;
unless the user turns document masks on (``--reset-attention-mask``, or Transformer Engine's
packed ``thd`` format), every token of a sample attends to every earlier token of the sample,
across document boundaries. Each sample is then, to the attention kernel, one causal sequence
of ``context`` tokens, and its attention costs ``context^2/2`` however short its documents.

In the plan IR a sample is therefore one sequence (a fresh ``seq_id``) spanning the whole
sample; ``metadata['sample_documents']`` maps it back to the ``(document id, tokens)`` it
holds, so the step's *useful* FLOPs (the MFU numerator, :func:`slimpack.plan.document_lengths`)
are the batch's under document masks, the same as for every other method: attention across
document boundaries is work done, not work needed.

Everything else (round-robin dealing, static CP, 1F1B/interleaved, recompute) is
:func:`baselines.megatron.plan_samples`, so the two Megatron methods differ only in attention.
"""

from __future__ import annotations

from baselines.megatron import MegatronOptions, plan_samples
from slimpack.batch import Batch
from slimpack.plan import DocumentMap, Plan, Segment
from slimpack.planning.method import MethodSpec
from slimpack.planning.packing import concat_and_chunk
from slimpack.planning.setup import PlanSetup


def plan(batch: Batch, setup: PlanSetup, options: MegatronOptions) -> Plan:
    context = options.context or max(batch.lengths)
    ids = [s.seq_id for s in batch.sequences]
    chunks = concat_and_chunk(batch.lengths, context)
    # Fresh ids above every document id, so a sample never shares an id with a document.
    first = max(ids) + 1
    samples, lengths, held = [], {}, {}
    for k, chunk in enumerate(chunks):
        sample_id = first + k
        tokens = sum(end - start for _, start, end in chunk)
        samples.append((Segment(seq_id=sample_id, start=0, end=tokens),))
        lengths[sample_id] = tokens
        held[sample_id] = tuple((ids[i], end - start) for i, start, end in chunk)
    return plan_samples(
        method="megatron-causal", samples=samples, sequence_lengths=lengths, setup=setup,
        recompute=options.recompute, recompute_layers=options.recompute_layers,
        metadata={"context": context, "attention": "full causal (no document masks)"},
        documents=DocumentMap(samples=held))


METHOD = MethodSpec(
    name="megatron-causal", planner=plan, options=MegatronOptions,
    cuts_at_sample_boundaries=True, ring_cp_at_layout_degree=True,
    pipeline_splits=("even", "embedding-and-loss"),
    summary="Megatron-LM fixed-length packing without document masks (full-causal samples, "
            "stock pretraining), static CP, 1F1B/interleaved",
    source="Megatron-LM GPTDataset without --reset-attention-mask (Narayanan et al. 2021, "
           "arXiv 2104.04473)")
