"""A last backward MicroPack long enough to hide the data-parallel gradient sync.

Megatron-style data parallelism reduces gradients during the backward of the *last*
micro-batch only (the earlier ones accumulate without communication), so the sync overlaps
that one backward and what it does not cover is exposed after compute
(``slimpack.sim.dp_sync``: it starts at a stage's last backward). Finer MicroPacks make that
last backward short, and the sync exposed where a method with fewer, longer micro-batches
hides it (an example with numbers: docs/slimpack-planner.md, step 6).

:func:`with_sync_tail` merges a group's last backward MicroPacks (*reconstructed*: SlimPack's
own answer is not public) until, on every stage, the merged one's backward lasts at least the
sync, as the simulator prices each unit. Merging consecutive backward units at the end keeps
their slices in run order (a valid backward order) and frees no activation earlier than
before, so only the time changes; the planner simulates the result and keeps it when faster.
"""

from __future__ import annotations

import dataclasses

from slimpack.cost.model import CostModel
from slimpack.plan import Group, Phase, Plan, Unit
from slimpack.sim.costs import group_costs
from slimpack.specs import ModelSpec


def tail_units_to_merge(bwd_s: list[list[float]], pp: int, sync_s: float) -> int:
    """How many of the last backward units must run as one so that, on every physical stage,
    their backward (chunk 0, the stage's last op) lasts at least ``sync_s``; all of them when
    even that is shorter. ``bwd_s[v][u]``: seconds of unit u on virtual stage v."""
    units = len(bwd_s[0])
    need = 1
    for stage in range(pp):
        total, k = 0.0, 0
        while k < units and total < sync_s:
            total += bwd_s[stage][units - 1 - k]
            k += 1
        need = max(need, k)
    return need


def _merged(group: Group, k: int) -> Group:
    units = group.backward_units
    tail = tuple(sid for unit in units[len(units) - k:] for sid in unit.slice_ids)
    return dataclasses.replace(group, backward_units=units[:len(units) - k] + (
        Unit(slice_ids=tail),))


def with_sync_tail(plan: Plan, *, sync_s: float, model: ModelSpec, cost: CostModel) -> Plan | None:
    """``plan`` with the last phase's groups ending on one backward MicroPack that lasts at
    least ``sync_s`` seconds (module docstring); None when no group needs a merge."""
    last = plan.phases[-1]
    groups, changed = [], False
    for group in last.groups:
        costs = group_costs(group, model=model, cost=cost,
                            gpus_per_node=plan.parallel.gpus_per_node)
        k = tail_units_to_merge(costs.bwd_s, group.pp, sync_s)
        if k > 1:
            group, changed = _merged(group, k), True
        groups.append(group)
    if not changed:
        return None
    return dataclasses.replace(plan, phases=plan.phases[:-1] + (Phase(groups=tuple(groups)),))
