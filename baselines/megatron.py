"""Megatron-LM as users run it: fixed-length packing + static context parallelism.

* Data: GPTDataset concatenates documents and cuts a sample every ``context`` tokens, with
  document masks (attention never crosses a document boundary); see
  :mod:`baselines.common.fixed_length`.
* Every micro-batch is one ``context``-token sample; samples are dealt to data-parallel
  replicas round-robin (Megatron's sampler, micro-batch size 1).
* Static CP: the degree in ``parallel`` for every micro-batch, ring attention with
  per-document sharding: every document of the packed sample is cut into 2*cp zigzag chunks
  on its own, as Transformer Engine's packed ``thd`` format does for Megatron-LM with
  document masks (``slimpack.cost.cp_sharding``, the one home of the rule). Cutting the packed
  buffer whole (one zigzag per sample) would leave one rank with the cheap documents and
  another with the tail of a long one, an imbalance Megatron-LM does not have.
* Attention semantics: document masks. ``megatron-causal`` (:mod:`baselines.megatron_causal`)
  is the same method without them, as stock Megatron-LM pretraining runs.
* Schedule: 1F1B, or interleaved 1F1B when vpp > 1.
* Recompute: none, then selective, then full, the first that the memory model says fits
  ("when memory forces it"); ``recompute=`` overrides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from baselines.common.finish import finish_plan
from baselines.common.fixed_length import deal_round_robin, fixed_length_samples
from slimpack.batch import Batch
from slimpack.plan import DocumentMap, Phase, Plan, Segment
from slimpack.planning import (
    GroupLayout,
    packed_group,
    replica_groups,
    resolve_recompute,
    schedule_for,
)
from slimpack.planning.method import MethodSpec
from slimpack.planning.setup import PlanSetup
from slimpack.specs.recompute import AUTO, check_recompute, recompute_layers_problem


@dataclass(frozen=True, kw_only=True)
class MegatronOptions:
    context: int | None = None
    """Sample length in tokens; default: the longest sequence in the batch."""
    recompute: str = "auto"
    """``auto`` picks the cheapest mode that fits (docs/methods.md), or force one."""
    recompute_layers: int | None = None
    """With ``recompute="full"``: fully recompute only the first this many layers of each
    virtual stage, keep the rest (Megatron-Core ``--recompute-method block
    --recompute-num-layers N``); None: every layer."""
    time_limit_s: float | None = 1.0
    """Unused by this closed-form planner except as a contract: it never takes longer."""

    def __post_init__(self) -> None:
        if self.context is not None and self.context < 1:
            raise ValueError(f"megatron: context must be >= 1 token, got {self.context}")
        check_recompute("megatron", self.recompute, allow_auto=True)
        problem = recompute_layers_problem(self.recompute_layers, self.recompute)
        if problem:
            raise ValueError(f"megatron: {problem}")
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"megatron: time_limit_s must be >= 0, got {self.time_limit_s}")


def plan(batch: Batch, setup: PlanSetup, options: MegatronOptions) -> Plan:
    context = options.context or max(batch.lengths)
    layout = fixed_length_samples(batch, context)
    return plan_samples(
        method="megatron", samples=layout.samples, sequence_lengths=layout.sequence_lengths,
        setup=setup, recompute=options.recompute, recompute_layers=options.recompute_layers,
        metadata={"context": context, "attention": "document masks"},
        documents=DocumentMap(pieces=layout.document_pieces))


def plan_samples(*, method: str, samples: Sequence[Sequence[Segment]],
                 sequence_lengths: dict[int, int], setup: PlanSetup, recompute: str,
                 metadata: dict[str, Any], documents: DocumentMap,
                 recompute_layers: int | None = None) -> Plan:
    """Megatron-LM's step for fixed-length ``samples`` (one per micro-batch): dealt to DP
    replicas round-robin, 1F1B or interleaved, per-document CP sharding, recompute resolved
    ("auto": the cheapest mode the memory model accepts, escalated by ``finish_plan`` until
    the simulator's memory walk agrees). Shared by ``megatron``
    and ``megatron-causal``, which differ only in what a sample's sequences are."""
    parallel = setup.parallel
    schedule = schedule_for(parallel)
    mode, _ = resolve_recompute(recompute, setup.model, setup.hardware, parallel,
                                max(sum(s.num_tokens for s in smp) for smp in samples), schedule)
    group_layout = GroupLayout(tp=parallel.tp, cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp,
                               schedule=schedule, cp_sharding="per-document", recompute=mode,
                               recompute_layers=recompute_layers,
                               virtual_stage_layers=None if parallel.pipeline_split == "even"
                               else parallel.virtual_stage_layers(setup.model.num_layers))
    groups = []
    for dp_rank, (ranks, dealt) in enumerate(zip(replica_groups(parallel),
                                                 deal_round_robin(list(samples), parallel.dp),
                                                 strict=True)):
        if dealt:
            groups.append(packed_group(dp_rank, ranks, group_layout, dealt))
    return finish_plan(
        method=method, setup=setup, sequence_lengths=sequence_lengths,
        phases=[Phase(groups=tuple(groups))],
        metadata={**metadata, "recompute": mode, "schedule": schedule,
                  "cp_sharding": "per-document", "num_microbatches": len(samples)},
        documents=documents, escalate_recompute=recompute == AUTO,
    )


METHOD = MethodSpec(
    name="megatron", planner=plan, options=MegatronOptions,
    cuts_at_sample_boundaries=True, ring_cp_at_layout_degree=True,
    pipeline_splits=("even", "embedding-and-loss"),
    summary="Megatron-LM fixed-length packing with document masks, static CP sharded per "
            "document (TE thd), 1F1B/interleaved",
    source="Megatron-LM (Narayanan et al. 2021, arXiv 2104.04473; Korthikanti et al. 2022)")
