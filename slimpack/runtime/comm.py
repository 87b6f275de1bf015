"""Process groups for one plan: directed p2p channels, DP gradient groups, tied-weight group.

Each direction of each stage edge gets its own process group. On NCCL a send blocks its
communicator's stream until the peer posts the receive, so an activation send and a gradient
receive between the same two ranks on one communicator can deadlock (1F1B's steady state does
exactly that). With one communicator per direction each channel carries messages one way, in
the order the schedule produces them, which :func:`validate.check_schedule` has checked.
Every rank creates every group in the same order (``new_group`` is collective).

With tensor and/or context parallelism a stage of a group is ``cp*tp`` ranks, ordered (cp, tp)
with tp fastest. A rank talks to the rank in the same (cp, tp) lane of the neighbouring stage
(:func:`stage_peer`; the lane may change between phases, e.g. DP-Merge regrouping cp ranks).
Gradients are summed over the ranks of one stage with the same tp index (the same weight
shard): data-parallel replicas and context-parallel ranks alike, since cp ranks hold the whole
(tp-sharded) weights and each contributes its own rows' share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from slimpack.plan import Group
from slimpack.runtime.validate import RuntimePlan

Channel = tuple[int, int, str]
"""(source rank, destination rank, "F" for activations or "B" for gradients)."""


@dataclass(frozen=True, kw_only=True)
class PlanGroups:
    channels: dict[Channel, dist.ProcessGroup]
    dp_group: dist.ProcessGroup | None
    """Ranks holding the same pipeline stage and tp shard (dp replicas and cp ranks: their
    gradients are summed); None if alone."""
    tied_group: dist.ProcessGroup | None
    """Ranks holding a copy of the same tied-embedding shard (first and last stages, same
    tp index), when pp > 1."""

    @classmethod
    def build(cls, rplan: RuntimePlan, *, rank: int, tied_embeddings: bool) -> PlanGroups:
        channels: dict[Channel, dist.ProcessGroup] = {}
        pp, vpp = rplan.pp, rplan.vpp
        for group in rplan.plan.groups():
            for s in range(pp):
                if pp == 1 or (s == pp - 1 and vpp == 1):
                    continue  # no edge, or the wrap-around edge only interleaving uses
                # One edge per (cp, tp) lane: lane j of stage s talks to lane j of s+1.
                for a in group.stage_ranks(s):
                    b = stage_peer(group, a, (s + 1) % pp)
                    for key in ((a, b, "F"), (b, a, "B")):
                        if key not in channels:
                            channels[key] = dist.new_group(sorted({a, b}))
        mine = {k: g for k, g in channels.items() if rank in k[:2]}
        by_place: dict[tuple[int, int], list[int]] = {}
        for r, s in sorted(rplan.stage_of_rank.items()):
            by_place.setdefault((s, rplan.tp_index_of_rank[r]), []).append(r)
        dp_group = None
        for place in sorted(by_place):
            ranks = by_place[place]
            g = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                dp_group = g
        tied_group = None
        if tied_embeddings and pp > 1:
            for shard in sorted({shard for _, shard in by_place}):
                ranks = sorted(set(by_place.get((0, shard), []))
                               | set(by_place.get((pp - 1, shard), [])))
                g = dist.new_group(ranks)
                if rank in ranks:
                    tied_group = g
        return cls(channels=mine, dp_group=dp_group, tied_group=tied_group)


def stage_peer(group: Group, rank: int, stage: int) -> int:
    """The rank of ``group`` at pipeline ``stage`` in ``rank``'s (cp, tp) lane: ranks are
    ordered (pp, cp, tp), so a lane is an offset inside every stage's block."""
    width = group.tp * group.cp
    return group.ranks[stage * width + group.ranks.index(rank) % width]


def message_tag(unit: int, block: int, num_blocks: int) -> int:
    """Gloo matches by tag; NCCL ignores tags and relies on the FIFO order checked earlier."""
    return unit * num_blocks + block


def all_reduce_flat(tensors: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Sum ``tensors`` over ``group`` with one collective (one launch, one gloo round)."""
    if group is None or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset:offset + n].view_as(t))
        offset += n
