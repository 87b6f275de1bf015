"""What every planner plans for: the model, the hardware, the parallel layout and the cost
model (whose recipe, ``training_of(cost)``, every memory check and the simulator charge).

A planner is ``plan(batch, setup, options) -> Plan``: the setup is this one value and the
options the method's own typed dataclass, already checked; ``slimpack.compare.plan_method``
builds both, checks the layout against the model, times the planner and gives the plan its
recipe's memory verdict, so no planner repeats that opening or closing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slimpack.cost.model import CostModel, training_of
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec
from slimpack.specs.training import TrainingSpec


@dataclass(frozen=True, kw_only=True)
class PlanSetup:
    """The workload's fixed side: a planner decides everything else."""

    model: ModelSpec
    hardware: HardwareSpec
    parallel: ParallelSpec
    """The layout to plan on (FlexSP reshapes it into its SP pool)."""
    cost: CostModel
    """Prices the planner's estimates; its recipe is the one the plan is checked under."""
    priced: dict[int, Any] | None = None
    """The caller's scratch space, not part of the workload: where the plan's closing leaves
    the groups it already priced under ``cost`` (``slimpack.sim.redistribution.PricedGroup``
    by group id, from ``with_attention_moves(priced=...)``; typed loosely because planning
    sits below the simulator), so the caller's simulation of the plan
    (``simulate(priced=...)``) does not price them again. None: nothing is kept."""

    @property
    def training(self) -> TrainingSpec:
        """The recipe (ZeRO stage, dtype) ``cost`` prices: the plan's memory is checked under it."""
        return training_of(self.cost)
