"""SlimPack's uniform candidate: SlimPipe's plan shape inside SlimPack's search (*reconstructed*).

SlimPack's slices and MicroPacks generalise SlimPipe's uniform slices (arXiv 2509.26246
compares against SlimPipe, which cuts each packed sample into ``n`` equal slices run in
slice-level 1F1B, arXiv 2504.14519, section 4), so a search over SlimPack's plans should
hold SlimPipe's. The cost-balanced MicroPacks of :mod:`.assemble` do not always reach it:
under memory pressure at deep pipelines (pp 16, vpp 5) their memory repair shrinks rounds
until long sequences drain the pipeline one by one (docs/slimpack-planner.md, "SlimPack vs
SlimPipe on the same layout"). This candidate builds the uniform shape with SlimPack's own
data path, and the search simulates it beside the others and keeps the fastest:

* whole sequences packed, in batch order, first fit into bins of the training context
  (SlimPipe cuts a document at a sample boundary; SlimPack keeps every document whole, so on
  Megatron-LM's sample pieces the bins are SlimPipe's samples exactly);
* bins dealt to data-parallel replicas by SlimPack's phase 1 (LPT on estimated seconds; by
  tokens under ``no_dp_aware``) where SlimPipe deals them round robin;
* each bin cut into ``n`` uniform slices, ``n`` the fewest of pp, 2pp, 4pp, ... whose
  activations fit (SlimPipe's rule, the analytic memory model), backward mirrored.

Offload, recompute, attention redistribution and the sync tail reach it as they reach every
candidate (the planner's later passes).
"""

from __future__ import annotations

from slimpack.cost.model import training_of
from slimpack.plan import Group, Phase, Plan, Segment
from slimpack.planning.groups import GroupLayout, sliced_group
from slimpack.planning.memory_fit import fits_memory
from slimpack.planning.packing import first_fit
from slimpack.planning.ranks import replica_groups
from slimpack.planning.uniform_slices import cut_sample, slice_length
from slimpack.schedules import Op
from slimpack.sim.memory import peaks_and_schedule
from slimpack.slimpack_planner.assemble import BuildContext, vocab_over_pp
from slimpack.slimpack_planner.assign import lpt_assign, token_assign

MIN_SLICE_TOKENS = 1024
"""The shortest uniform slice the count search goes down to (SlimPipe's default
``min_slice_tokens``)."""


def uniform_applies(ctx: BuildContext) -> bool:
    """Whether the candidate is built: a pipeline to slice for (pp > 1, as SlimPipe needs),
    slicing allowed (not the ``no_slicing`` ablation) and the option on."""
    opts = ctx.options
    return ctx.parallel.pp > 1 and not opts.no_slicing and opts.uniform_candidate


def uniform_plan(ctx: BuildContext) -> tuple[Plan, dict[int, list[list[Op]]]]:
    """The uniform candidate (module docstring) under ``ctx``'s recompute mode, and the op
    lists its memory walk built (group id -> ops, for the simulator). Its metadata's
    ``peak_bytes`` is the simulator's own memory walk, as for every candidate."""
    par, opts, model = ctx.parallel, ctx.options, ctx.model
    sequences = ctx.batch.sequences
    lengths = {s.seq_id: s.length for s in sequences}
    capacity = max(opts.context or 0, max(lengths.values()))
    bins = [[sequences[i].seq_id for i in members]
            for members in first_fit([s.length for s in sequences], capacity)]
    if opts.no_dp_aware:
        deal = token_assign([sum(lengths[s] for s in b) for b in bins], par.dp)
    else:
        work = ctx.work(ctx.estimator(par.cp), lengths)
        deal = lpt_assign([sum(work[s] for s in b) for b in bins], par.dp)
    longest = max(sum(lengths[s] for s in b) for b in bins)
    mode = opts.recompute_mode
    num_slices = par.pp
    while 2 * num_slices <= max(1, longest // MIN_SLICE_TOKENS) and not fits_memory(
            model, ctx.hardware, tokens=longest, schedule="slimpipe", slices=num_slices,
            recompute=mode, tp=par.tp, cp=par.cp, pp=par.pp, vpp=par.vpp, dp=par.dp):
        num_slices *= 2
    length = slice_length(longest, num_slices)
    layout = GroupLayout(tp=par.tp, cp=par.cp, pp=par.pp, vpp=par.vpp, schedule="slimpipe",
                         cp_sharding=opts.cp_sharding, recompute=mode,
                         vocab_parallel_pp=vocab_over_pp(ctx))
    training = training_of(ctx.cost)
    groups: list[Group] = []
    schedules: dict[int, list[list[Op]]] = {}
    peak = 0.0
    for replica, (ranks, members) in enumerate(zip(replica_groups(par), deal, strict=True)):
        if not members:
            continue
        samples = [[Segment(seq_id=s, start=0, end=lengths[s]) for s in bins[b]]
                   for b in sorted(members)]  # the batch's order within a replica
        group = sliced_group(replica, ranks, layout,
                             [cut_sample(sample, length) for sample in samples])
        peaks, ops = peaks_and_schedule(group, model, par.dp, training)
        peak = max(peak, *peaks)
        if ops is not None:
            schedules[group.group_id] = ops
        groups.append(group)
    info = {"candidate": "uniform", "slice_tokens": length, "num_slices": num_slices,
            "outliers": [], "merge_factor": 1, "backward": "mirrored",
            "phase1": "tokens" if opts.no_dp_aware else "lpt", "peak_bytes": peak}
    plan = Plan(method="slimpack", model=model.name, parallel=par, sequence_lengths=lengths,
                phases=(Phase(groups=tuple(groups)),), metadata={"slimpack": info},
                zero_stage=training.zero_stage)
    return plan, schedules
