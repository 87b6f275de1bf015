"""The naive packing family: what a training script does before any balancing.

Packing strategies (``packing=``):

* ``concat-chunk``: concatenate documents, cut every ``context`` tokens, document masks
  (Megatron-LM's GPTDataset; see :mod:`baselines.common.fixed_length`).
* ``ffd`` / ``bfd``: first-fit / best-fit decreasing bin packing of whole documents into packs
  of at most ``context`` tokens (the packed-SFT default; documents are never cut).
* ``sorted``: LongAlign's sorted batching (arXiv 2401.18058, section 3.2): sort by length, cut
  into groups of consecutive sequences, shuffle the groups; each group is one micro-batch.

The packs are dealt to data-parallel replicas round-robin; with ``microbatches_per_rank`` each
replica runs exactly that many micro-batches (packs are merged or split by count, as a data
loader with a fixed micro-batch size does). CP is static and per-sequence, the schedule 1F1B
(interleaved when vpp > 1), recompute the cheapest that fits the largest micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from baselines.common.finish import finish_plan
from baselines.common.fixed_length import deal_round_robin, fixed_length_samples
from slimpack.batch import Batch
from slimpack.plan import DocumentMap, Phase, Plan, Segment
from slimpack.planning import (
    GroupLayout,
    best_fit_decreasing,
    contiguous_partition,
    first_fit_decreasing,
    packed_group,
    replica_groups,
    resolve_recompute,
    schedule_for,
    sorted_batching,
    whole,
)
from slimpack.planning.method import MethodSpec
from slimpack.planning.setup import PlanSetup
from slimpack.specs.recompute import AUTO

PACKINGS = ("concat-chunk", "ffd", "bfd", "sorted")


@dataclass(frozen=True, kw_only=True)
class NaiveOptions:
    packing: str = "bfd"
    context: int | None = None
    """Pack capacity in tokens; default: the longest sequence in the batch."""
    microbatches_per_rank: int | None = None
    """Fixed micro-batch count per DP rank; default: as many as the packing produces
    (for ``sorted``: enough that an average micro-batch holds ``context`` tokens)."""
    recompute: str = "auto"
    seed: int = 0
    """Shuffle seed of sorted batching."""
    time_limit_s: float | None = 1.0

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            raise ValueError(f"naive: packing must be one of {PACKINGS}, got {self.packing!r}")
        if self.context is not None and self.context < 1:
            raise ValueError(f"naive: context must be >= 1 token, got {self.context}")
        if self.microbatches_per_rank is not None and self.microbatches_per_rank < 1:
            raise ValueError(f"naive: microbatches_per_rank must be >= 1, "
                             f"got {self.microbatches_per_rank}")
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"naive: time_limit_s must be >= 0, got {self.time_limit_s}")


def _packs(batch: Batch, opts: NaiveOptions, context: int, dp: int,
           ) -> tuple[list[list[Segment]], dict[int, int], dict]:
    ids, lengths = [s.seq_id for s in batch.sequences], batch.lengths
    seq_lengths = {s.seq_id: s.length for s in batch.sequences}
    if opts.packing == "concat-chunk":
        layout = fixed_length_samples(batch, context)
        return ([list(s) for s in layout.samples], layout.sequence_lengths,
                dict(layout.document_pieces))
    if opts.packing == "sorted":
        total_mbs = opts.microbatches_per_rank and opts.microbatches_per_rank * dp
        total_mbs = total_mbs or max(dp, -(-batch.num_tokens // context))
        group_size = max(1, -(-len(lengths) // total_mbs))
        bins = sorted_batching(lengths, group_size, seed=opts.seed)
    elif opts.packing == "ffd":
        bins = first_fit_decreasing(lengths, context)
    else:
        bins = best_fit_decreasing(lengths, context)
    packs = [[whole(ids[i], lengths[i]) for i in b] for b in bins]
    return packs, seq_lengths, {}


def _fix_count(packs: list[list[Segment]], count: int) -> list[list[Segment]]:
    """Exactly ``count`` micro-batches from ``packs`` (in order): merge consecutive packs
    balanced by tokens when there are too many, split the largest when too few."""
    if len(packs) > count:
        weights = [sum(s.num_tokens for s in p) for p in packs]
        runs = contiguous_partition(weights, count)
        return [[seg for k in run for seg in packs[k]] for run in runs if run]
    packs = [list(p) for p in packs]
    while len(packs) < count:
        k = max(range(len(packs)), key=lambda i: len(packs[i]))
        if len(packs[k]) < 2:
            break
        big = packs.pop(k)
        packs[k:k] = [big[: len(big) // 2], big[len(big) // 2:]]
    return packs


def plan(batch: Batch, setup: PlanSetup, options: NaiveOptions) -> Plan:
    opts, parallel = options, setup.parallel
    context = opts.context or max(batch.lengths)
    if opts.packing in ("ffd", "bfd") and context < max(batch.lengths):
        raise ValueError(f"naive: context={context} is shorter than the longest sequence "
                         f"({max(batch.lengths)}); {opts.packing} never cuts documents")
    packs, seq_lengths, pieces = _packs(batch, opts, context, parallel.dp)
    per_rank = deal_round_robin(packs, parallel.dp)
    if opts.microbatches_per_rank is not None and opts.packing != "sorted":
        flat = _fix_count(packs, opts.microbatches_per_rank * parallel.dp)
        per_rank = deal_round_robin(flat, parallel.dp)
    schedule = schedule_for(parallel)
    largest = max(sum(s.num_tokens for s in mb) for r in per_rank for mb in r)
    recompute, _ = resolve_recompute(opts.recompute, setup.model, setup.hardware, parallel,
                                     largest, schedule)
    layout = GroupLayout(tp=parallel.tp, cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp,
                         schedule=schedule, recompute=recompute)
    groups = [packed_group(d, ranks, layout, mbs)
              for d, (ranks, mbs) in enumerate(zip(replica_groups(parallel), per_rank,
                                                   strict=True)) if mbs]
    return finish_plan(
        method="naive", setup=setup, sequence_lengths=seq_lengths,
        phases=[Phase(groups=tuple(groups))],
        metadata={"packing": opts.packing, "context": context, "recompute": recompute,
                  "schedule": schedule, "num_microbatches": sum(len(r) for r in per_rank)},
        documents=DocumentMap(pieces=pieces), escalate_recompute=opts.recompute == AUTO,
    )


METHOD = MethodSpec(
    name="naive", planner=plan, options=NaiveOptions,
    cuts_at_sample_boundaries=True,  # packing="concat-chunk"
    ring_cp_at_layout_degree=True,
    summary="documents packed into fixed-length samples (BFD/FFD/sorted), static CP, 1F1B",
    source="common practice (docs/methods.md)")
