"""SlimPipe's two mechanisms, tried on SlimPack's chosen plan (issue 24: SlimPack's search
space holds every mechanism SlimPipe's does).

* **Activation offload** (SlimPipe, arXiv 2504.14519): when the search's best plan still
  overflows memory (its memory repairs could not fit a group), the same plan with a share of
  every group's activations offloaded to host memory, the smallest share of
  :data:`OFFLOAD_SHARES` that the simulator says fits. The simulator charges the copies on the
  host link beside compute (``sim.costs.with_host_copies``), so offload is never free.
* **Attention redistribution** (SlimPipe): with pipeline stages, the same plan with
  ``attention_redistribution`` on, kept when the simulator times it faster. Its pairing rule
  (``slimpack.sim.redistribution``) generalises to MicroPacks of several documents.

Both are tried on the one plan the slice-length search chose (*reconstructed* order: the
paper's own search is not public), so they cost at most a few simulations, never a rebuild.
"""

from __future__ import annotations

import dataclasses

from slimpack.plan import Phase, Plan

OFFLOAD_SHARES = (0.25, 0.5, 0.75, 1.0)
"""Offloaded shares of activations tried, smallest first: the least host traffic that fits."""


def with_offload(plan: Plan, share: float) -> Plan:
    """``plan`` with every group offloading ``share`` of its activations."""
    phases = tuple(Phase(groups=tuple(dataclasses.replace(g, offload=share)
                                      for g in phase.groups)) for phase in plan.phases)
    return dataclasses.replace(plan, phases=phases)


def try_mechanisms(plan: Plan, record, simulate, *, offload: float | None,
                   attention_redistribution: bool | None) -> tuple[Plan, object, list[dict]]:
    """(plan, its simulated record, what was tried) after the mechanisms of the module
    docstring. ``simulate(plan)`` returns a record; ``offload`` None tries the shares, a
    number forces it on every group (0: never); ``attention_redistribution`` None tries it,
    True forces it, False never."""
    tried: list[dict] = []
    if offload is None and record.oom:
        for share in OFFLOAD_SHARES:
            candidate = with_offload(plan, share)
            rec = simulate(candidate)
            tried.append({"offload": share, "step_time_s": rec.step_time_s, "oom": rec.oom})
            if not rec.oom:
                plan, record = candidate, rec
                break
    elif offload:
        plan = with_offload(plan, offload)
        record = simulate(plan)
        tried.append({"offload": offload, "step_time_s": record.step_time_s, "oom": record.oom})
    staged = any(g.pp > 1 for g in plan.groups())
    if attention_redistribution is None and staged:
        candidate = dataclasses.replace(plan, attention_redistribution=True)
        rec = simulate(candidate)
        tried.append({"attention_redistribution": True, "step_time_s": rec.step_time_s,
                      "oom": rec.oom})
        if (rec.oom, rec.step_time_s) < (record.oom, record.step_time_s):
            plan, record = candidate, rec
    elif attention_redistribution:
        plan = dataclasses.replace(plan, attention_redistribution=True)
        record = simulate(plan)
    return plan, record, tried
