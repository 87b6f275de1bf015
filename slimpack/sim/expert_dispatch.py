"""Expert parallelism (MoE): the token dispatcher's all-to-alls, priced per unit and layer.

Megatron-Core's ``alltoall`` token dispatcher (``MoEAlltoAllTokenDispatcher``) sends each
token's hidden state to the ranks holding its ``top_k`` experts and brings the expert outputs
back: per MoE layer, forward, two all-to-alls over the ``ep`` ranks of an expert group
(dispatch, combine), and two more in backward (their gradients). One rank sends its
``tokens * top_k`` routed rows of ``hidden`` bf16 values, ``(ep - 1) / ep`` of them to other
ranks. Routing is taken as balanced (every expert receives ``top_k / num_experts`` of the
tokens: Megatron-Bridge's performance recipes force load balancing, and an unbalanced
router's stragglers are not modelled). The all-to-alls are priced exposed, on the compute
stream; Megatron-Core's optional overlap of one micro-batch's all-to-all with another's
compute (``overlap_moe_expert_parallel_comm``) is not modelled.

The expert grid is Megatron-Core's with expert tensor parallelism 1: the simulator prices
``ep > 1`` only at ``tp = 1`` and with every group in the plan's base layout (an expert group
is ``ep`` consecutive ranks of a stage's ``dp * cp`` ranks), and refuses other plans
(:func:`check_expert_parallel`).
"""

from __future__ import annotations

import dataclasses

from slimpack.cost.model import CostModel
from slimpack.plan import Group, Plan, PlanError
from slimpack.sim.costs import GroupCosts
from slimpack.specs.model import ModelSpec
from slimpack.specs.parallel import ParallelSpec

BF16 = 2


def check_expert_parallel(plan: Plan, model: ModelSpec) -> None:
    """Refuse (PlanError, naming the field) an ``ep > 1`` the simulator cannot price."""
    base = plan.parallel
    if base.ep == 1:
        return
    if not model.is_moe:
        raise PlanError(f"parallel.ep={base.ep} needs an MoE model; {model.name} is dense "
                        f"(num_experts=1); allowed: ep=1")
    if model.num_experts % base.ep:
        raise PlanError(f"parallel.ep={base.ep} must divide num_experts={model.num_experts}")
    if base.tp != 1:
        raise PlanError(f"parallel.ep={base.ep} with tp={base.tp} is not modelled (the expert "
                        f"grid with expert tensor parallelism); allowed: ep > 1 at tp=1")
    for group in plan.groups():
        if (group.tp, group.cp, group.pp, group.vpp) != (base.tp, base.cp, base.pp, base.vpp):
            raise PlanError(
                f"Group {group.group_id}: parallel.ep={base.ep} needs every group in the "
                f"plan's layout (tp={base.tp} cp={base.cp} pp={base.pp} vpp={base.vpp}); this "
                f"group has tp={group.tp} cp={group.cp} pp={group.pp} vpp={group.vpp} (an "
                f"expert group spans data-parallel replicas: not modelled for mixed layouts)")


def _stage_ranks(parallel: ParallelSpec, stage: int) -> range:
    """A pipeline stage's ``dp * cp`` ranks, consecutive at tp = 1 (the simulator's
    condition for ep > 1)."""
    first = parallel.rank(pp=stage)
    return range(first, first + parallel.dp * parallel.cp)


def expert_groups_intra_node(parallel: ParallelSpec) -> bool:
    """Whether every expert group (``ep`` consecutive ranks of a stage) sits inside one
    node."""
    for stage in range(parallel.pp):
        ranks = _stage_ranks(parallel, stage)
        for start in range(0, len(ranks), parallel.ep):
            if not parallel.same_node(list(ranks[start:start + parallel.ep])):
                return False
    return True


def expert_data_parallel_intra_node(parallel: ParallelSpec, stage: int) -> bool:
    """Whether stage ``stage``'s expert-data-parallel groups (every ``ep``-th rank of the
    stage: the ranks holding the same experts, which reduce their gradients) stay inside a
    node, judged on the first of them."""
    return parallel.same_node(list(_stage_ranks(parallel, stage)[::parallel.ep]))


def dispatch_seconds(rank_tokens: float, *, model: ModelSpec, cost: CostModel, ep: int,
                     intra_node: bool) -> float:
    """One all-to-all of one rank's routed rows (dispatch or combine, or either's gradient)."""
    return cost.comm.all_to_all(rank_tokens * model.moe_top_k * model.hidden * BF16, ep,
                                intra_node=intra_node)


def with_expert_dispatch(costs: GroupCosts, group: Group, *, model: ModelSpec,
                         cost: CostModel, parallel: ParallelSpec) -> GroupCosts:
    """``costs`` with each unit's all-to-alls added on every layer of every virtual stage:
    two forward, two backward, and with (block) full recompute the forward's two again in
    backward on the recomputed layers. The balanced (ideal) seconds carry them too: no
    layout avoids them."""
    if parallel.ep == 1:
        return costs
    intra = expert_groups_intra_node(parallel)
    price: dict[int, float] = {}

    def pair(tokens: int) -> float:
        if tokens not in price:
            rank_tokens = -(-tokens // group.cp)
            price[tokens] = 2 * dispatch_seconds(rank_tokens, model=model, cost=cost,
                                                 ep=parallel.ep, intra_node=intra)
        return price[tokens]

    fwd_a2a = [pair(t) for t in costs.fwd_unit_tokens]
    bwd_a2a = [pair(t) for t in costs.bwd_unit_tokens]

    def recomputed_share(layers: int) -> float:
        if group.recompute != "full":
            return 0.0
        if group.recompute_layers is None:
            return 1.0
        return min(group.recompute_layers, layers) / layers

    def add(rows: list[list[float]], extra: list[float], *, backward: bool) -> list[list[float]]:
        # A backward unit's recomputed forward dispatches its own tokens again.
        return [[t + n * a * (1.0 + (recomputed_share(n) if backward else 0.0))
                 for t, a in zip(row, extra, strict=True)]
                for row, n in zip(rows, costs.layers, strict=True)]

    return dataclasses.replace(
        costs, fwd_s=add(costs.fwd_s, fwd_a2a, backward=False),
        bwd_s=add(costs.bwd_s, bwd_a2a, backward=True),
        fwd_ideal_s=add(costs.fwd_ideal_s, fwd_a2a, backward=False),
        bwd_ideal_s=add(costs.bwd_ideal_s, bwd_a2a, backward=True))
