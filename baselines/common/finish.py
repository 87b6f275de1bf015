"""Assemble, validate, memory-check and time-stamp a plan (every baseline ends here)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from slimpack.plan import DocumentMap, Phase, Plan
from slimpack.planning.setup import PlanSetup
from slimpack.schedules import Op
from slimpack.sim.memory import plan_fits_memory
from slimpack.sim.redistribution import PricedGroup, with_attention_moves
from slimpack.specs import ParallelSpec
from slimpack.specs.recompute import RECOMPUTE_MODES


def finish_plan(*, method: str, setup: PlanSetup, sequence_lengths: dict[int, int],
                phases: list[Phase], metadata: dict[str, Any],
                parallel: ParallelSpec | None = None,
                escalate_recompute: bool = False, documents: DocumentMap | None = None,
                attention_redistribution: bool = False,
                schedules: Mapping[int, list[list[Op]]] | None = None,
                chosen_moves: Mapping[int, PricedGroup] | None = None,
                ) -> Plan:
    """Build and validate the plan, then check memory with the simulator's own walk.

    ``Plan.memory_fits`` is :func:`slimpack.sim.memory.plan_fits_memory` of the final
    plan, so a planner never claims a fit the simulator denies. With ``escalate_recompute``
    (the method chose its recompute mode itself, "when memory forces it"), groups that do not
    fit move to the next costlier recompute mode until the plan fits or full recompute is
    reached; ``metadata['recompute']`` then names the mode(s) the plan runs. Memory is
    checked under ``setup.training``, the cost model's recipe, whose ZeRO stage the simulator
    will charge, so no planner checks memory under another recipe; the plan states that stage
    (``Plan.zero_stage``). ``parallel``: the layout the plan runs on when the planner reshaped
    ``setup.parallel`` (FlexSP's SP pool). ``schedules``: op lists the planner already built
    for some group ids (recompute does not change them, so they hold for the escalated plans
    too). ``chosen_moves``: the ``SimResult.chosen_moves`` of the planner's simulation of
    these groups on ``schedules`` (:func:`~slimpack.sim.redistribution.with_attention_moves`).
    ``slimpack.compare.plan_method`` times the planner (``metadata['plan_seconds']``).
    """
    model, hardware, training = setup.model, setup.hardware, setup.training
    parallel = parallel or setup.parallel
    plan = Plan(method=method, model=model.name, parallel=parallel,
                sequence_lengths=dict(sequence_lengths), phases=tuple(phases),
                metadata=dict(metadata), documents=documents or DocumentMap(),
                attention_redistribution=attention_redistribution,
                zero_stage=training.zero_stage)
    plan.validate()
    fits = plan_fits_memory(plan, model, hardware, training, schedules)
    while not fits and escalate_recompute:
        escalated = _with_costlier_recompute(plan)
        if escalated is None:
            break
        plan = escalated
        fits = plan_fits_memory(plan, model, hardware, training, schedules)
    # The plan carries the moves its redistribution runs, chosen under the cost model it was
    # planned with, on the recompute modes it ends with.
    plan = with_attention_moves(plan, model=model, cost=setup.cost, schedules=schedules,
                                chosen=chosen_moves, priced=setup.priced)
    modes = sorted({g.recompute for g in plan.groups()}, key=RECOMPUTE_MODES.index)
    if escalate_recompute or "recompute" in plan.metadata:
        plan.metadata["recompute"] = modes[0] if len(modes) == 1 else ",".join(modes)
    return dataclasses.replace(plan, memory_fits=fits)


def _with_costlier_recompute(plan: Plan) -> Plan | None:
    """Every group one recompute mode costlier (full stays full); None when all are full."""
    last = RECOMPUTE_MODES[-1]
    if all(g.recompute == last for g in plan.groups()):
        return None

    def bump(mode: str) -> str:
        return RECOMPUTE_MODES[min(RECOMPUTE_MODES.index(mode) + 1, len(RECOMPUTE_MODES) - 1)]

    phases = tuple(Phase(groups=tuple(dataclasses.replace(g, recompute=bump(g.recompute))
                                      for g in phase.groups)) for phase in plan.phases)
    return dataclasses.replace(plan, phases=phases, metadata=dict(plan.metadata))
