"""SlimPipe (arXiv 2504.14519): uniform sequence slicing with slice-level 1F1B.

* One packed sample (Megatron-LM's fixed-length layout, :mod:`baselines.common.fixed_length`)
  per micro-batch, cut into ``n >= pp`` uniform slices whose length is a multiple of 128; a
  document crossing a slice boundary continues in the next slice with a KV prefix.
* Slice-level 1F1B with interleaving (``schedule='slimpipe'``, warm-up ``n*v + 2(p-1-r)``
  slice-chunks): forward units are the slices in order, backward units the same slices in
  reverse, because a slice's backward needs dK/dV from every later slice.
* The vocabulary (LM head and loss) is spread over the pipeline ranks
  (``vocab_parallel_pp``), removing the last stage's logits peak.
* ``n`` is the smallest count (pp, 2pp, 4pp, ...) whose peak memory fits without recompute;
  recompute only when no slice length down to ``min_slice_tokens`` fits.
* Attention redistribution: later slices carry longer KV prefixes, so pipeline ranks busy with
  different slices at the same time have different attention work. Ranks are paired by KV
  prefix (longest with shortest); the heavy rank ships its query and half the difference of
  its cached KV to the light one, which computes that part and returns partial outputs that
  are merged with the log-sum-exp trick. The plan flags it in the typed field
  ``Plan.attention_redistribution`` with each group's chosen ``Group.attention_moves``; the
  simulator moves that work between the ops that run concurrently
  (:mod:`slimpack.sim.redistribution`) and the runtime executes the same moves.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from baselines.common.finish import finish_plan
from baselines.common.fixed_length import deal_round_robin, fixed_length_samples
from slimpack.batch import Batch
from slimpack.plan import DocumentMap, Group, Phase, Plan
from slimpack.planning import (
    WALL_CLOCK_FALLBACK,
    GroupLayout,
    choose_recompute,
    fits_memory,
    replica_groups,
    sliced_group,
)
from slimpack.planning.method import MethodSpec
from slimpack.planning.setup import PlanSetup
from slimpack.planning.uniform_slices import SLICE_ALIGN, cut_sample, slice_length
from slimpack.schedules import Op, build_schedule
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec


@dataclass(frozen=True, kw_only=True)
class SlimPipeOptions:
    context: int | None = None
    """Sample length; default: the longest sequence in the batch."""
    num_slices: int | None = None
    """Slices per sample; default: the smallest of pp, 2pp, 4pp... that fits memory."""
    min_slice_tokens: int = 1024
    attention_redistribution: bool = True
    offload: float | None = None
    """Share of activations copied to host between forward and backward (0-1). None: when
    memory forces recompute, also try offloading every activation without recompute (as
    SlimPipe's artifact does at 2048K) and keep whichever the simulator finds faster."""
    max_trials: int = 3
    """When several settings fit, how many the simulator times (offload first, then the fewest
    slices): a count, so the plan is the same on every machine."""
    time_limit_s: float | None = 30.0
    """Wall-clock safety net over those trials (the plan's metadata says when it stopped
    them)."""

    def __post_init__(self) -> None:
        if self.context is not None and self.context < 1:
            raise ValueError(f"slimpipe: context must be >= 1 token, got {self.context}")
        if self.num_slices is not None and self.num_slices < 1:
            raise ValueError(f"slimpipe: num_slices must be >= 1, got {self.num_slices}")
        if self.min_slice_tokens < SLICE_ALIGN:
            raise ValueError(f"slimpipe: min_slice_tokens must be >= {SLICE_ALIGN}")
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"slimpipe: time_limit_s must be >= 0, got {self.time_limit_s}")
        if self.max_trials < 1:
            raise ValueError(f"slimpipe: max_trials must be >= 1, got {self.max_trials}")
        if self.offload is not None and not 0.0 <= self.offload <= 1.0:
            raise ValueError(f"slimpipe: offload must be in [0, 1] or None (auto), got "
                             f"{self.offload}")


def choose_slices(model: ModelSpec, hardware: HardwareSpec, parallel: ParallelSpec,
                  tokens: int, opts: SlimPipeOptions) -> tuple[list[int], str]:
    """(candidate slice counts, recompute mode) for samples of ``tokens`` tokens.

    The cheapest recompute mode that fits with some slice count. Without recompute, the
    fewest slices that fit (SlimPipe's rule; more slices also spread the attention imbalance
    between early and late slices further). Under recompute memory no longer asks for many
    slices, and "fewest that fit" would run thousands of tiny slices at 2M tokens, so every
    count that fits is returned and the planner keeps the one the simulator finds fastest.
    """
    degrees = dict(tp=parallel.tp, cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp,
                   dp=parallel.dp, ep=parallel.ep)
    if opts.num_slices is not None:
        n = opts.num_slices
        mode = choose_recompute(model, hardware, tokens=tokens, schedule="slimpipe",
                                slices=n, **degrees)
        return [n], mode or "full"
    most = max(1, tokens // opts.min_slice_tokens)
    candidates = []
    n = max(parallel.pp, 1)
    while True:
        candidates.append(n)
        if n * 2 > most:
            break
        n *= 2
    for mode in ("none", "selective", "full"):
        fitting = [n for n in candidates
                   if fits_memory(model, hardware, tokens=tokens, schedule="slimpipe", slices=n,
                                  recompute=mode, **degrees)]
        if fitting:
            return (fitting[:1] if mode == "none" else fitting), mode
    return [candidates[-1]], "full"


def plan(batch: Batch, setup: PlanSetup, options: SlimPipeOptions) -> Plan:
    started = time.perf_counter()  # the trials' wall-clock safety net (time_limit_s)
    opts, model, hardware, parallel = options, setup.model, setup.hardware, setup.parallel
    context = opts.context or max(batch.lengths)
    layout = fixed_length_samples(batch, context)
    longest = max(sum(s.num_tokens for s in smp) for smp in layout.samples)
    counts, recompute = choose_slices(model, hardware, parallel, longest, opts)
    per_replica = deal_round_robin(list(layout.samples), parallel.dp)
    offload = opts.offload or 0.0

    # A slice count's groups are cut once: the probes and trials that try it under other
    # recompute modes or offload shares run the same slices (a paper-size batch cuts ~10^4).
    sliced: dict[int, tuple[Group, ...]] = {}

    def build(n: int, mode: str, share: float) -> tuple[Group, ...]:
        if n not in sliced:
            group_layout = GroupLayout(tp=parallel.tp, cp=parallel.cp, pp=parallel.pp,
                                       vpp=parallel.vpp, schedule="slimpipe", recompute=mode,
                                       vocab_parallel_pp=True, offload=share)
            length = slice_length(longest, n)
            sliced[n] = tuple(
                sliced_group(d, ranks, group_layout,
                             [cut_sample(smp, length) for smp in samples])
                for d, (ranks, samples) in enumerate(zip(replica_groups(parallel), per_replica,
                                                         strict=True)) if samples)
            return sliced[n]
        return tuple(dataclasses.replace(g, recompute=mode, offload=share) for g in sliced[n])

    # The op lists depend on the slices alone (not on recompute or offload): build each
    # slice count's once for its memory probes, its trial simulation and the final check.
    # Only the counts still in play are kept (a paper-size group has ~10^6 ops).
    built: dict[int, dict[int, list[list[Op]]]] = {}

    def schedules(n: int, groups: tuple[Group, ...]) -> dict[int, list[list[Op]]]:
        if n not in built:
            built[n] = {g.group_id: build_schedule(g) for g in groups}
        return built[n]

    def keep_only(*counts: int) -> None:
        for n in [n for n in built if n not in counts]:
            del built[n]

    def probe(trial: tuple[Group, ...]) -> Plan:
        # The flag travels with the probe so the simulator times each trial as it will run.
        return Plan(method="slimpipe", model=model.name, parallel=parallel,
                    sequence_lengths=layout.sequence_lengths, phases=(Phase(groups=trial),),
                    attention_redistribution=opts.attention_redistribution,
                    zero_stage=setup.training.zero_stage)

    trials = [(n, recompute, offload) for n in counts]
    if opts.offload is None and recompute != "none":
        # Offload instead of recompute: the fewest slices whose plan fits with every
        # activation on host between its forward and backward (the simulator's memory walk).
        from slimpack.sim.memory import plan_fits_memory

        # A fixed num_slices stays fixed: only that count is tried with offload.
        n = opts.num_slices or max(parallel.pp, 1)
        while n <= max(counts[-1], parallel.pp):
            trial = build(n, "none", 1.0)
            fits = plan_fits_memory(probe(trial), model, hardware,
                                    setup.training, schedules(n, trial))
            keep_only(*(trial_n for trial_n, _, _ in trials), *([n] if fits else []))
            if fits:
                trials.insert(0, (n, "none", 1.0))
                break
            n *= 2
    trials = trials[:opts.max_trials]
    n, recompute, offload = trials[0]
    groups = build(n, recompute, offload)
    chosen_moves = {}  # the best trial's redistribution, when trials were simulated
    stopped_by = "max_trials"
    if len(trials) > 1:
        # Several settings fit: time each on the simulator (the best configuration, as
        # SlimPipe's authors tuned theirs); the wall clock is only a safety net.
        from slimpack.sim import simulate

        best = None
        for position, (trial_n, mode, share) in enumerate(trials):
            if best is not None and opts.time_limit_s is not None \
                    and time.perf_counter() - started > opts.time_limit_s:
                stopped_by = "time_limit_s"
                break
            trial = build(trial_n, mode, share)
            result = simulate(probe(trial), model=model, hardware=hardware, cost=setup.cost,
                              validate=False, schedules=schedules(trial_n, trial),
                              schedules_built=True)
            record = result.record
            # A trial that runs out of memory loses to any that fits, however fast: the
            # analytic estimate that admitted it can be optimistic, and finish_plan would
            # escalate its recompute (a slower plan than the one the trial timed).
            key = (record.oom, record.step_time_s)
            if best is None or key < best:
                best, groups, chosen_moves = key, trial, result.chosen_moves
                n, recompute, offload = trial_n, mode, share
            keep_only(n, *(later for later, _, _ in trials[position + 1:]))
    length = slice_length(longest, n)
    return finish_plan(
        method="slimpipe", setup=setup,
        sequence_lengths=layout.sequence_lengths, phases=[Phase(groups=groups)],
        metadata={"context": context, "num_slices": n, "slice_tokens": length,
                  "recompute": recompute, "offload": offload, "schedule": "slimpipe",
                  "trials": len(trials), "stopped_by": stopped_by,
                  **({"fallback": WALL_CLOCK_FALLBACK.format(limit=opts.time_limit_s)}
                     if stopped_by == "time_limit_s" else {}),
                  "vocab_parallel_pp": True},
        documents=DocumentMap(pieces=layout.document_pieces),
        attention_redistribution=opts.attention_redistribution,
        escalate_recompute=True, schedules=schedules(n, groups), chosen_moves=chosen_moves,
    )


def _pipelined(parallel: ParallelSpec) -> bool:
    """SlimPipe is a pipeline schedule: it needs pp > 1."""
    return parallel.pp > 1


METHOD = MethodSpec(
    name="slimpipe", planner=plan, options=SlimPipeOptions, schedule_family="slimpipe",
    allows=_pipelined, layout_rule="pp > 1 (a pipeline schedule)",
    cuts_at_sample_boundaries=True, ring_cp_at_layout_degree=True,
    simulates_to_plan=True,
    summary="uniform sequence slices, slice-level 1F1B, attention redistribution",
    source="SlimPipe, arXiv 2504.14519")
