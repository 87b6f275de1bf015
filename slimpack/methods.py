"""Planner protocol and the registry that finds planners by name.

A planner turns a global batch into a :class:`~slimpack.plan.Plan`::

    plan(batch, model, hardware, parallel, cost, **options) -> Plan

The registry is an immutable table of ``name -> "module:function"`` resolved lazily, so it
holds no mutable global state, importing it is cheap, and a planner whose module is missing
is reported clearly when asked for. Baselines add their row here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

from slimpack.batch import Batch
from slimpack.cost.model import CostModel
from slimpack.plan import Plan
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec


class Planner(Protocol):
    def __call__(self, batch: Batch, model: ModelSpec, hardware: HardwareSpec,
                 parallel: ParallelSpec, cost: CostModel, **options: Any) -> Plan: ...


PLANNERS: Mapping[str, str] = MappingProxyType({
    "reference": "baselines.reference:plan",
    "naive": "baselines.naive:plan",
    "megatron": "baselines.megatron:plan",
    "megatron-dcp": "baselines.megatron_dcp:plan",
    "wlb-llm": "baselines.wlb_llm:plan",
    "flexsp": "baselines.flexsp:plan",
    "slimpipe": "baselines.slimpipe:plan",
    "slimpack": "slimpack.slimpack_planner:plan",
})


def get_planner(name: str) -> Planner:
    """Return the planner registered as ``name``; ValueError lists the available ones."""
    target = PLANNERS.get(name)
    if target is None:
        raise ValueError(f"unknown planner {name!r}; allowed: {', '.join(available_planners())}")
    module_name, func_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ValueError(
                f"planner {name!r} is registered but its module {module_name} is not built yet; "
                f"available: {', '.join(available_planners())}"
            ) from None
        raise
    return getattr(module, func_name)


def available_planners() -> list[str]:
    """Registered planners whose module can be imported."""
    names = []
    for name, target in PLANNERS.items():
        if importlib.util.find_spec(target.split(":")[0]) is not None:
            names.append(name)
    return names
