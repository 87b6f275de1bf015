"""FlexSP's own baselines (arXiv 2412.01523, its evaluation): DeepSpeed-Ulysses sequence parallelism
at one SP degree, static or chosen per batch.

* ``ulysses-static``: one SP degree for the whole run, the smallest power of two whose memory
  holds the longest sequence training can meet (``context``; the batch's longest when no
  context is given), as a static DeepSpeed-Ulysses configuration must be set.
* ``ulysses-adaptive``: batch-adaptive SP, the smallest degree that holds *this batch's*
  longest sequence, chosen again every step.

Either way the pool of dp*cp slots splits into slots/d Ulysses groups of degree d (tp kept),
and the step runs in rounds of one micro-batch per group: DeepSpeed keeps one gradient-
accumulation count for every data-parallel rank, and ZeRO-3 gathers each layer's parameters
with a collective over all of them, so the groups advance micro-batch by micro-batch together
(each round is a phase; the simulator charges ZeRO-3 traffic once per step, so without the
rounds the groups would drift apart more freely than DeepSpeed lets them). Rounds are cut as
FlexSP cuts its micro-batches (:func:`baselines.flexsp.planner.search_microbatches`) and each
is LPT-balanced over the groups at the fixed degree (FlexSP's greedy answer at one degree), so
the only difference from FlexSP is the single degree: short sequences pay the all-to-alls of a
degree sized for the longest. Sequences are priced, and memory budgeted, with FlexSP's own
constants (:func:`baselines.flexsp.constants.from_cost_model`), so the three methods see one
cost model. Model states are sharded over every slot at the cost model's ZeRO stage (FlexSP's
paper runs all three with ZeRO-3: pass a cost model whose ``TrainingSpec`` has
``zero_stage=3``). No pipeline parallelism (DeepSpeed-Ulysses with ZeRO-3 has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baselines.common.finish import finish_plan
from baselines.flexsp.assignment import Assignment, SPGroup, greedy, ulysses_degrees
from baselines.flexsp.constants import FlexSPConstants, from_cost_model
from baselines.flexsp.planner import (
    first_fitting_count,
    microbatch_phases,
    search_microbatches,
    sp_pool_layout,
    stopped_by,
    zero_stage_of,
)
from slimpack.batch import Batch
from slimpack.cost.model import CostModel
from slimpack.plan import Plan
from slimpack.planning import (
    WALL_CLOCK_FALLBACK,
    Deadline,
    num_slots,
)
from slimpack.planning.setup import PlanSetup
from slimpack.specs.recompute import AUTO, RECOMPUTE_MODES, check_recompute

MODES = ("static", "adaptive")
EXTRA_COUNTS = 4
"""Round counts tried above the memory minimum (FlexSP's own M_min .. M_min + 4)."""


@dataclass(frozen=True, kw_only=True)
class UlyssesOptions:
    context: int | None = None
    """Longest sequence training can meet: sizes ``ulysses-static``'s degree (default: the
    batch's longest). ``ulysses-adaptive`` sizes its degree from the batch alone."""
    time_limit_s: float | None = 2.0
    """Wall-clock safety net for the round-count search (greedy rounds, milliseconds in
    practice: deterministic unless the net is reached, which ``metadata["stopped_by"]`` says)."""
    recompute: str = "auto"
    """``auto``: the cheapest of none/selective/full with which the sizing sequence fits the
    largest group the pool can form, as FlexSP chooses."""

    def __post_init__(self) -> None:
        if self.context is not None and not (isinstance(self.context, int) and self.context >= 1):
            raise ValueError(f"ulysses: context must be a positive number of tokens, "
                             f"got {self.context!r}")
        if self.time_limit_s is not None and not self.time_limit_s >= 0:
            raise ValueError(f"ulysses: time_limit_s must be >= 0, got {self.time_limit_s}")
        check_recompute("ulysses", self.recompute, allow_auto=True)


@dataclass(frozen=True, kw_only=True)
class DegreeChoice:
    degree: int
    recompute: str
    constants: FlexSPConstants
    fallback: str | None
    """Why no degree holds the sizing sequence (then ``degree`` is the largest), else None."""


def choose_degree(sizing_length: int, slots: int, cost: CostModel, *, tp: int, recompute: str,
                  zero_stage: int) -> DegreeChoice:
    """The smallest Ulysses degree (a power of two <= slots dividing the heads of a tp rank,
    :func:`~baselines.flexsp.assignment.ulysses_degrees`) whose memory holds
    ``sizing_length`` tokens, with the cheapest recompute mode that lets the largest degree
    hold it."""
    degrees = ulysses_degrees(slots, cost.model.num_heads // tp)
    top = degrees[-1]
    modes = RECOMPUTE_MODES if recompute == AUTO else (recompute,)
    for mode in modes:
        k = from_cost_model(cost, tp=tp, num_gpus=slots, state_shards=slots, recompute=mode,
                            zero_stage=zero_stage)
        if sizing_length <= k.max_tokens(top):
            degree = next(d for d in degrees if sizing_length <= k.max_tokens(d))
            return DegreeChoice(degree=degree, recompute=mode, constants=k, fallback=None)
    reason = (f"the sizing sequence ({sizing_length} tokens) exceeds the "
              f"{int(k.max_tokens(top))} tokens an SP group of {top} GPUs holds (recompute "
              f"{mode}); planned at degree {top}, memory is the simulator's to report")
    return DegreeChoice(degree=top, recompute=mode, constants=k, fallback=reason)


def _plan(mode: str, batch: Batch, setup: PlanSetup, opts: UlyssesOptions) -> Plan:
    method, parallel, cost = f"ulysses-{mode}", setup.parallel, setup.cost
    if parallel.pp != 1 or parallel.vpp != 1:
        raise ValueError(f"{method}: DeepSpeed-Ulysses runs without pipeline parallelism; "
                         f"pp and vpp must be 1, got pp={parallel.pp} vpp={parallel.vpp}")
    parallel = sp_pool_layout(parallel)
    slots = num_slots(parallel)
    longest = max(batch.lengths)
    sizing = longest if mode == "adaptive" else max(longest, opts.context or longest)
    zero_stage = zero_stage_of(cost)
    choice = choose_degree(sizing, slots, cost, tp=parallel.tp, recompute=opts.recompute,
                           zero_stage=zero_stage)
    d, k = choice.degree, choice.constants
    order = sorted(batch.sequences, key=lambda s: (s.length, s.seq_id))
    lengths = [s.length for s in order]
    # Rounds of one micro-batch per group, as FlexSP cuts them: at least enough rounds for
    # the pool's memory, then the count with the smallest estimate. Degree d is fixed, so a
    # round may not fit at M_min; then the same window from the first count whose rounds all
    # fit, as FlexSP's (one sequence per round always does when the degree holds the longest).
    m_min = min(len(lengths), max(1, -(-sum(lengths) // max(int(k.max_tokens(d) * (
        slots // d)), 1))))
    deadline = Deadline(time_limit_s=opts.time_limit_s)

    def solve(run: list[int], _share: float) -> Assignment | None:
        return greedy(run, slots, k, degrees=(d,))

    tries = list(range(m_min, min(m_min + EXTRA_COUNTS, len(lengths)) + 1))
    best = search_microbatches(lengths, tries, deadline, solve)
    if best is None:
        first = first_fitting_count(lengths, tries[-1],
                                    lambda run: solve(run, 0.0) is not None,
                                    expired=lambda: deadline.expired)
        if first is not None:
            best = search_microbatches(
                lengths, list(range(first, min(first + EXTRA_COUNTS, len(lengths)) + 1)),
                deadline, solve)
    if best is None:  # only when the degree cannot hold the longest sequence (a fallback)
        answers = [Assignment(groups=(SPGroup(degree=d, members=(0,)),),
                              seconds=k.beta1_s + k.seq_seconds(n, d), source="fallback")
                   for n in lengths]
        best = (sum(a.seconds for a in answers), len(lengths),
                [[i] for i in range(len(lengths))], answers)
    net_reached = deadline.expired  # the wall-clock safety net cut the search of M
    estimate, m, runs, answers = best
    phases = microbatch_phases(order, runs, answers, parallel, choice.recompute)
    metadata: dict[str, Any] = {
        "sp_degree": d, "sizing_length": sizing, "num_groups": slots // d,
        "num_microbatches": m, "recompute": choice.recompute,
        "estimated_seconds": estimate,
        "time_limit_s": opts.time_limit_s,
        "stopped_by": stopped_by([a.source for a in answers], net_reached)}
    if metadata["stopped_by"] == "time-limit":
        metadata["fallback"] = WALL_CLOCK_FALLBACK.format(limit=opts.time_limit_s)
    if choice.fallback is not None:
        metadata["fallback"] = choice.fallback
    return finish_plan(
        method=method, setup=setup, parallel=parallel,
        sequence_lengths={s.seq_id: s.length for s in batch.sequences},
        phases=phases, metadata=metadata, escalate_recompute=opts.recompute == AUTO)


def plan_static(batch: Batch, setup: PlanSetup, options: UlyssesOptions) -> Plan:
    """``ulysses-static``: one SP degree sized for ``context`` (see the module docstring)."""
    return _plan("static", batch, setup, options)


def plan_adaptive(batch: Batch, setup: PlanSetup, options: UlyssesOptions) -> Plan:
    """``ulysses-adaptive``: one SP degree per step, sized for the batch's longest sequence."""
    return _plan("adaptive", batch, setup, options)
