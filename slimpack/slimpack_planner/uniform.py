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
* bins dealt to data-parallel replicas by SlimPack's phase 1 (LPT on estimated seconds) and,
  as a second candidate, by tokens (SlimPipe deals them round robin: on equal samples the
  same split; by tokens alone under ``no_dp_aware``);
* each bin cut into ``n`` uniform slices, for each ``n`` of SlimPipe's trials
  (:func:`uniform_counts`: the fewest of pp, 2pp, 4pp, ... whose activations fit, by the
  analytic memory model; under recompute the first three that fit), each doubled while the
  simulator's memory walk still puts the schedule over the limit, backward mirrored.

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
UNIFORM_TRIALS = 3
"""Slice counts the candidate is built with under recompute (SlimPipe's ``max_trials``)."""


def uniform_applies(ctx: BuildContext) -> bool:
    """Whether the candidate is built: a pipeline to slice for (pp > 1, as SlimPipe needs),
    slicing allowed (not the ``no_slicing`` ablation) and the option on."""
    opts = ctx.options
    return ctx.parallel.pp > 1 and not opts.no_slicing and opts.uniform_candidate


def uniform_deals(ctx: BuildContext) -> tuple[bool, ...]:
    """The ``by_tokens`` choices the search builds the candidate with: SlimPack's phase 1
    (seconds) and SlimPipe's deal (tokens); tokens alone under ``no_dp_aware``. Both, because
    phase 1 balances *estimated* seconds: on llama-70b at 128K (pp 16, cp 4, dp 2, Megatron's
    sample pieces) its deal ran 1% slower than SlimPipe's on the same slices."""
    return (True,) if ctx.options.no_dp_aware else (False, True)


def uniform_counts(ctx: BuildContext) -> list[int]:
    """The slice counts the search builds the candidate with, SlimPipe's trials: of pp, 2pp,
    4pp, ... (slices of at least :data:`MIN_SLICE_TOKENS`), the fewest whose activations fit
    without recompute (the analytic memory model, SlimPipe's rule), or under recompute,
    where memory no longer asks for many slices, the first :data:`UNIFORM_TRIALS` that fit
    (on llama-70b at 256K, pp 16, cp 8, selective recompute: 16 slices fit, and 32 ran 13%
    faster); the most slices when none fits."""
    par, model = ctx.parallel, ctx.model
    longest = _longest_bin(ctx)
    most = max(1, longest // MIN_SLICE_TOKENS)
    counts = [par.pp]
    while 2 * counts[-1] <= most:
        counts.append(2 * counts[-1])
    mode = ctx.options.recompute_mode
    fitting = [n for n in counts if fits_memory(
        model, ctx.hardware, tokens=longest, schedule="slimpipe", slices=n, recompute=mode,
        tp=par.tp, cp=par.cp, pp=par.pp, vpp=par.vpp, dp=par.dp, ep=par.ep)]
    if not fitting:
        return counts[-1:]
    return fitting[:1] if mode == "none" else fitting[:UNIFORM_TRIALS]


def _bins(ctx: BuildContext) -> tuple[tuple[int, ...], ...]:
    """Whole sequences, in batch order, first fit into bins of the training context (once per
    batch and context: every count, deal and layout packs the same bins); read-only."""
    sequences = ctx.batch.sequences
    capacity = max(ctx.options.context or 0, max(s.length for s in sequences))
    return ctx.batch.derived(("uniform_bins", capacity), lambda: tuple(
        tuple(sequences[i].seq_id for i in members)
        for members in first_fit([s.length for s in sequences], capacity)))


def _longest_bin(ctx: BuildContext) -> int:
    lengths = {s.seq_id: s.length for s in ctx.batch.sequences}
    return max(sum(lengths[s] for s in b) for b in _bins(ctx))


def uniform_plan(ctx: BuildContext, *, num_slices: int, by_tokens: bool = False,
                 ) -> tuple[Plan, dict[int, list[list[Op]]]]:
    """The uniform candidate (module docstring) with ``num_slices`` slices per bin (one of
    :func:`uniform_counts`) under ``ctx``'s recompute mode, and the op lists its memory walk
    built (group id -> ops, for the simulator). Its metadata's ``peak_bytes`` is the
    simulator's own memory walk, as for every candidate. ``by_tokens`` deals the bins by
    tokens, as SlimPipe does (always under ``no_dp_aware``)."""
    par, opts, model = ctx.parallel, ctx.options, ctx.model
    lengths = {s.seq_id: s.length for s in ctx.batch.sequences}
    bins = _bins(ctx)
    by_tokens = by_tokens or opts.no_dp_aware
    if by_tokens:
        deal = token_assign([sum(lengths[s] for s in b) for b in bins], par.dp)
    else:
        work = ctx.work(ctx.estimator(par.cp), lengths)
        deal = lpt_assign([sum(work[s] for s in b) for b in bins], par.dp)
    longest = max(sum(lengths[s] for s in b) for b in bins)
    most_slices = max(1, longest // MIN_SLICE_TOKENS)
    while True:
        groups, schedules, peak = _uniform_groups(ctx, bins, deal, lengths,
                                                  slice_length(longest, num_slices))
        # The analytic model can pass a count whose schedule the simulator's memory walk
        # puts over the limit; SlimPipe's trials then keep the next count that fits (on
        # llama-70b at 128K, pp 16, selective recompute: 32 slices, where the model said 16).
        if peak <= ctx.hardware.usable_memory_bytes or 2 * num_slices > most_slices:
            break
        num_slices *= 2
    length = slice_length(longest, num_slices)
    info = {"candidate": "uniform", "slice_tokens": length, "num_slices": num_slices,
            "outliers": [], "merge_factor": 1, "backward": "mirrored",
            "phase1": "tokens" if by_tokens else "lpt", "peak_bytes": peak}
    plan = Plan(method="slimpack", model=model.name, parallel=par, sequence_lengths=lengths,
                phases=(Phase(groups=tuple(groups)),), metadata={"slimpack": info},
                zero_stage=training_of(ctx.cost).zero_stage)
    return plan, schedules


def _uniform_groups(ctx: BuildContext, bins: tuple[tuple[int, ...], ...], deal: list[list[int]],
                    lengths: dict[int, int], length: int,
                    ) -> tuple[list[Group], dict[int, list[list[Op]]], float]:
    """Each replica's bins cut into uniform slices of ``length`` tokens: the groups, the op
    lists their memory walk built and the highest peak."""
    par, model = ctx.parallel, ctx.model
    layout = GroupLayout(tp=par.tp, cp=par.cp, pp=par.pp, vpp=par.vpp, schedule="slimpipe",
                         cp_sharding=ctx.options.cp_sharding, recompute=ctx.options.recompute_mode,
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
        peaks, ops = peaks_and_schedule(group, model, par.dp, training, ep=par.ep)
        peak = max(peak, *peaks)
        if ops is not None:
            schedules[group.group_id] = ops
        groups.append(group)
    return groups, schedules, peak
