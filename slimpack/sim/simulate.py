"""``simulate``: time a whole plan and report it in the shared StepRecord schema.

Phases run one after another (a stage of a later phase starts when its devices are free),
the groups of a phase independently on disjoint devices, then data-parallel gradient
synchronisation closes the step. Per-unit costs are computed once per group before the walk,
so planners can call this inside a search loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from slimpack.cost.flops import mfu, model_flops
from slimpack.cost.kernel_model import default_cost_model
from slimpack.cost.model import CostModel, training_of
from slimpack.plan import Group, Plan
from slimpack.planning.gc_pause import gc_paused
from slimpack.records import OpTiming, StepRecord
from slimpack.schedules import Op, build_schedule, validate_schedule
from slimpack.sim.costs import GroupCosts, SliceShards, group_costs, with_host_copies
from slimpack.sim.dp_sync import DpSync, dp_sync
from slimpack.sim.engine import GroupTimeline, run_group
from slimpack.sim.expert_dispatch import check_expert_parallel, with_expert_dispatch
from slimpack.sim.memory import GroupMemory, check_zero_stage, group_memory
from slimpack.sim.redistribution import PricedGroup, apply_moves, group_moves, merge_stats
from slimpack.specs.hardware import HardwareSpec
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """A simulated step: its record, and (with ``trace=True``) every op's timing."""

    record: StepRecord
    plan: Plan
    ops: tuple[OpTiming, ...] = ()
    schedules: Mapping[int, list[list[Op]]] = field(default_factory=dict)
    """Op lists per group id, as simulated."""
    chosen_moves: Mapping[int, PricedGroup] = field(default_factory=dict)
    """Per group id, for groups without ``attention_moves`` whose attention this simulation
    redistributed: the group, the moves it chose and their prices (what
    :func:`~slimpack.sim.redistribution.with_attention_moves` would choose for that group on
    the same op lists and cost model, so a planner need not choose them again)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _GroupRun:
    group: Group
    costs: GroupCosts
    memory: GroupMemory
    timeline: GroupTimeline


def simulate(plan: Plan, *, model: ModelSpec, hardware: HardwareSpec,
             cost: CostModel | None = None, trace: bool = False, overlap_dp_sync: bool = True,
             schedules: Mapping[int, list[list[Op]]] | None = None,
             validate: bool = True, schedules_built: bool = False,
             price_cache: dict | None = None,
             priced: Mapping[int, PricedGroup] | None = None) -> SimResult:
    """Simulate one training step of ``plan``.

    ``cost`` defaults to :func:`~slimpack.cost.kernel_model.default_cost_model` (the
    kernel-level model validated against published runs). ``schedules`` overrides the op lists of
    some groups (by group id; they are checked with ``validate_schedule``); the others use
    :func:`build_schedule`. ``validate=False`` skips ``Plan.validate`` for planners that
    already validated. ``schedules_built=True`` says the given ``schedules`` are
    :func:`build_schedule`'s own for those groups (a planner that built them for its memory
    check), so they are not checked again. ``price_cache`` (a dict the caller keeps for one
    cost model) reuses unit prices between simulations (see
    :func:`~slimpack.sim.costs.group_costs`). ``priced``: the groups the planner already
    priced under ``cost`` (``with_attention_moves(priced=...)``), taken as they are for the
    very group objects of ``plan`` whose op lists are not overridden by ``schedules``.
    Raises PlanError for a malformed plan or
    schedule and DeadlockError
    (a RuntimeError) if op lists cannot complete.
    """
    with gc_paused():  # ~10^5 short-lived objects per group: see gc_pause
        return _simulate(plan, model=model, hardware=hardware, cost=cost, trace=trace,
                         overlap_dp_sync=overlap_dp_sync, schedules=schedules,
                         validate=validate, schedules_built=schedules_built,
                         price_cache=price_cache, priced=priced)


def _simulate(plan: Plan, *, model: ModelSpec, hardware: HardwareSpec, cost: CostModel | None,
              trace: bool, overlap_dp_sync: bool, schedules: Mapping[int, list[list[Op]]] | None,
              validate: bool, schedules_built: bool, price_cache: dict | None,
              priced: Mapping[int, PricedGroup] | None) -> SimResult:
    if validate:
        plan.validate()
    check_expert_parallel(plan, model)
    cost = cost if cost is not None else default_cost_model(model, hardware)
    check_zero_stage(plan, training_of(cost))
    world = plan.world_size
    gpus_per_node = plan.parallel.gpus_per_node
    rank_free = [0.0] * world
    runs: list[_GroupRun] = []
    used_schedules: dict[int, list[list[Op]]] = {}
    slice_cache: dict = {}
    # SlimPipe's attention redistribution between paired pipeline ranks (its plan flags it;
    # each group's ``attention_moves`` say which ops pair, else they are chosen here).
    redistribute = plan.attention_redistribution
    redistributed = []
    chosen_moves: dict[int, PricedGroup] = {}
    for phase in plan.phases:
        for group in phase.groups:
            reuse = _priced(priced, group, cost, schedules) if redistribute else None
            if reuse is not None:
                ops = reuse.ops
            elif schedules is not None and group.group_id in schedules:
                ops = schedules[group.group_id]
                if not schedules_built:
                    validate_schedule(group, ops)
            else:
                ops = build_schedule(group)
            used_schedules[group.group_id] = ops
            memory = group_memory(group, model=model, dp=plan.parallel.dp,
                                  training=training_of(cost), ep=plan.parallel.ep)
            if reuse is not None:
                costs = reuse.costs
                redistributed.append(reuse.stats)
            else:
                shards = SliceShards(group)  # sharded once for pricing and redistribution
                costs = group_costs(group, model=model, cost=cost, gpus_per_node=gpus_per_node,
                                    slice_cache=slice_cache, price_cache=price_cache,
                                    shards=shards)
            if reuse is None and redistribute and group.pp > 1:
                if group.attention_moves is None:  # a plan that did not choose (format 3)
                    costs, stats, moves = group_moves(group, ops, costs, model=model, cost=cost,
                                                      gpus_per_node=gpus_per_node, shards=shards)
                    chosen_moves[group.group_id] = PricedGroup(
                        group=group, moves=moves, cost=cost, ops=ops, costs=costs, stats=stats)
                else:  # the plan's moves, priced under this cost model
                    costs, stats = apply_moves(group, ops, costs, group.attention_moves,
                                               model=model, cost=cost,
                                               gpus_per_node=gpus_per_node, shards=shards)
                redistributed.append(stats)
            costs = with_expert_dispatch(costs, group, model=model, cost=cost,
                                         parallel=plan.parallel)
            costs = with_host_copies(costs, fwd_offload=memory.fwd_offload,
                                     bwd_fetch=memory.bwd_fetch,
                                     host_link_gbps=hardware.host_link_gbps)
            start = [max(rank_free[r] for r in group.stage_ranks(s)) for s in range(group.pp)]
            timeline = run_group(group_id=group.group_id, ops=ops, costs=costs, memory=memory,
                                 start_s=start, record=trace)
            for s in range(group.pp):
                for r in group.stage_ranks(s):
                    rank_free[r] = timeline.compute_end[s]
            runs.append(_GroupRun(group=group, costs=costs, memory=memory, timeline=timeline))
    # Every cost model prices its recipe's ZeRO traffic (the analytic one the default recipe);
    # only those with an optimizer model (KernelCostModel) add the optimizer step.
    training = training_of(cost)
    sync = dp_sync(plan, [(r.group, r.timeline) for r in runs], model=model, comm=cost.comm,
                   overlap=overlap_dp_sync and training.dp_overlap,
                   zero_stage=training.zero_stage,
                   optimizer_step=getattr(cost, "optimizer_step_seconds", None))
    record = _record(plan, runs, sync, model=model, hardware=hardware, trace=trace)
    if redistributed:
        record = dataclasses.replace(record, extra={
            **record.extra, "attention_redistribution": merge_stats(redistributed)})
    return SimResult(record=record, plan=plan, ops=record.ops, schedules=used_schedules,
                     chosen_moves=chosen_moves)


def _priced(priced: Mapping[int, PricedGroup] | None, group: Group, cost: CostModel,
            schedules: Mapping[int, list[list[Op]]] | None) -> PricedGroup | None:
    """The planner's pricing of ``group`` when it holds for this simulation: the same group
    object with moves, the same cost model, no other op lists asked for."""
    got = priced.get(group.group_id) if priced else None
    if (got is None or got.group is not group or got.cost is not cost or group.pp == 1
            or group.attention_moves is None
            or (schedules is not None and group.group_id in schedules)):
        return None
    return got


def _record(plan: Plan, runs: list[_GroupRun], sync: DpSync, *, model: ModelSpec,
            hardware: HardwareSpec, trace: bool) -> StepRecord:
    world = plan.world_size
    compute_end = max((max(r.timeline.compute_end) for r in runs), default=0.0)
    step = max(compute_end, sync.end_s)
    busy = sum(sum(r.timeline.busy_s) * r.group.tp * r.group.cp for r in runs)
    ideal = sum(r.timeline.ideal_s * r.group.tp * r.group.cp for r in runs) / world
    num_stages = max(r.group.pp for r in runs)
    peak = [0.0] * num_stages
    peak_act = [0.0] * num_stages
    kv_cache = [0.0] * num_stages
    states = [0.0] * num_stages
    logits = [0.0] * num_stages
    for r in runs:
        for s in range(r.group.pp):
            total = r.timeline.peak_dynamic[s] + r.memory.static_bytes[s]
            peak[s] = max(peak[s], total)
            peak_act[s] = max(peak_act[s], r.timeline.peak_activation[s])
            kv_cache[s] = max(kv_cache[s], r.timeline.peak_activation[s] * r.memory.kv_share)
            states[s] = max(states[s], r.memory.model_state_bytes[s])
            logits[s] = max(logits[s], r.memory.logits_bytes[s])
    # Per unit, its seconds summed over the virtual stages in order (zip: same sums, in C).
    unit_fwd = [t for r in runs for t in map(sum, zip(*r.costs.fwd_s, strict=True))]
    unit_bwd = [t for r in runs for t in map(sum, zip(*r.costs.bwd_s, strict=True))]
    total_fwd = sum(unit_fwd)
    imbalance = max(unit_fwd) * len(unit_fwd) / total_fwd if total_fwd > 0 else 1.0
    ops: tuple[OpTiming, ...] = ()
    if trace:
        ops = tuple(op for r in runs for op in r.timeline.ops) + sync.ops
    # MFU counts the batch's FLOPs under document masks, the same for every method: a method
    # that cuts documents, or attends across them (megatron-causal), does not change it.
    documents = plan.document_lengths()
    needed = model_flops(model, documents.values())
    return StepRecord(
        method=plan.method, backend="sim", model=model.name, hardware=hardware.name,
        parallel=plan.parallel.to_dict(), num_gpus=world,
        num_sequences=len(documents), num_tokens=plan.num_tokens,
        step_time_s=step, tokens_per_s=plan.num_tokens / step if step > 0 else 0.0,
        mfu=mfu(needed, step, world, hardware.peak_flops) if step > 0 else 0.0,
        bubble_fraction=1.0 - busy / (step * world) if step > 0 else 0.0,
        peak_memory_bytes=tuple(peak),
        oom=any(p > hardware.usable_memory_bytes for p in peak),
        imbalance_degree=imbalance, ideal_step_time_s=ideal,
        unit_forward_s=tuple(unit_fwd), unit_backward_s=tuple(unit_bwd), ops=ops,
        extra={
            "peak_activation_bytes": peak_act,
            "kv_cache_bytes": kv_cache,
            "model_state_bytes": states,
            "logits_bytes": logits,
            "usable_memory_bytes": hardware.usable_memory_bytes,
            "compute_end_s": compute_end,
            "dp_sync_s": sync.duration_s,
            "optimizer_step_s": sync.optimizer_s,
            "num_ops": sum(r.timeline.num_ops for r in runs) + len(sync.stage_end_s),
        },
    )
