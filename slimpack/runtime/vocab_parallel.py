"""The LM head and loss spread over the pipeline ranks of a group (``Group.vocab_parallel_pp``,
SlimPipe's vocabulary parallelism; docs/architecture.md, runtime).

Layout, as the simulator charges it (``sim.memory.stage_state_bytes``, ``sim.costs.head_stages``):
with ``pp`` stages of ``tp`` ranks the untied head matrix ``[vocab, hidden]`` is cut in
``pp*tp`` row blocks; the rank at (stage s, tp index t) of every cp lane holds block
``s*tp + t`` on its last model chunk, and computes that block of the logits. The last block of
the model keeps the final norm.

Per slice of a forward unit, when the last stage runs it forward on the last block:

1. the last stage normalises the slice's hidden states (all-gathering its tp row shares) and
   broadcasts them over its pp lane (the group's ranks with the same cp and tp position);
2. each of the cp lane's ``pp*tp`` ranks computes its logits block, and the cross-entropy
   combines max, sum-exp and target logit over them (the tensor-parallel maths,
   :func:`~slimpack.runtime.tensor_parallel.vocab_parallel_ce_forward`, on a wider group);
3. every rank runs the head's backward at once (a token's loss gradient does not depend on any
   other unit): it adds its block's weight gradient and reduces its share of d(hidden) to the
   last stage, which keeps the sum in the slice's graph until the unit's backward.

The loss is token-weighted as everywhere: ``sum CE / global label count``.

Deadlock freedom. A stage other than the last joins the head of unit u at a fixed position of
its op list (all ranks of a stage run the same list), placed before launch by the runtime's dry
run of the schedule (:func:`slimpack.runtime.validate.check_schedule`). The dry run executes
every stage's ops with FIFO channels and blocking receives; the last stage's F(u) on the last
block completes only once every other stage has joined u, and a stage that joined waits there.
The placement tried first is the simulator's: right after the stage's own F(u) on its last
chunk, where ``sim.costs.head_stages`` charges its share of the head. If the dry run with those
positions does not complete, each stage instead joins a head where it stands once no stage can
move and the last stage waits only for that head. Then:

(a) every member joins the heads in one order, the last stage's order of last-block forwards,
    so the gloo collectives of one head group are called in the same order on all members;
(b) the fallback placement completes whenever the schedule without the head does: at any state
    where no stage can move, either the last stage waits for the head (the others join, it
    moves on) or the schedule alone would be stuck in that same state;
(c) the real run is a set of sequential processes with blocking receives over FIFO channels
    and barriers at fixed positions: its outcome does not depend on timing (a Kahn network), so
    the dry run's completing execution, with the positions it returns, proves that every
    execution completes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from slimpack.plan import Group
from slimpack.runtime.model import IGNORE_INDEX, RMSNorm, init_named
from slimpack.runtime.tensor_parallel import (
    TPGroup,
    gather_rows,
    vocab_parallel_ce_backward,
    vocab_parallel_ce_forward,
)
from slimpack.specs.model import ModelSpec

HEAD = "head.weight"


@dataclass(frozen=True, kw_only=True)
class HeadComm:
    """One rank's process groups for one plan group's vocabulary-parallel head."""

    lane: dist.ProcessGroup
    """The group's ranks with this rank's cp and tp position, one per stage."""
    last: int
    """Global rank of the lane's last stage (broadcasts hidden states, receives d hidden)."""
    shards: dist.ProcessGroup
    """The ``pp*tp`` ranks of this rank's cp position: every block of the vocabulary."""
    loss_scale: float
    """1 / (labelled tokens of the whole step)."""


def uses_vocab_over_pp(group: Group) -> bool:
    return group.vocab_parallel_pp and group.pp > 1


def build_head_comms(groups: Iterable[Group], *, rank: int, loss_scale: float
                     ) -> dict[int, HeadComm]:
    """Create every group's head process groups (collective: all ranks call this alike, in
    the plan's group order); this rank's, by group id."""
    made: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def new(ranks: tuple[int, ...]) -> dist.ProcessGroup:
        key = tuple(sorted(ranks))
        if key not in made:
            made[key] = dist.new_group(list(key))
        return made[key]

    out: dict[int, HeadComm] = {}
    for g in groups:
        if not uses_vocab_over_pp(g):
            continue
        width = g.tp * g.cp  # ranks are ordered (pp, cp, tp), tp fastest
        lanes = [tuple(g.ranks[s * width + j] for s in range(g.pp)) for j in range(width)]
        shard_sets = [tuple(g.ranks[s * width + c * g.tp + t] for s in range(g.pp)
                            for t in range(g.tp)) for c in range(g.cp)]
        lane_groups = [new(lane) for lane in lanes]
        shard_groups = [new(ranks) for ranks in shard_sets]
        if rank in g.ranks:
            j = g.ranks.index(rank) % width
            out[g.group_id] = HeadComm(lane=lane_groups[j], last=lanes[j][-1],
                                       shards=shard_groups[j // g.tp], loss_scale=loss_scale)
    return out


class PipelineLMHead(nn.Module):
    """This rank's row block of the head matrix (and the final norm on the last block)."""

    def __init__(self, spec: ModelSpec, *, shard: int, num_shards: int, last: bool,
                 tp: TPGroup | None, device=None, dtype=None) -> None:
        super().__init__()
        if spec.vocab_size % num_shards:
            raise ValueError(f"vocab_size {spec.vocab_size} does not split into {num_shards} "
                             f"blocks (capabilities refuses this plan)")
        self.vocab_size = spec.vocab_size
        self.per_shard = spec.vocab_size // num_shards
        self.vocab_start = shard * self.per_shard
        self.tp = tp
        self.final_norm = RMSNorm(spec.hidden, device=device, dtype=dtype) if last else None
        self.weight = nn.Parameter(torch.empty(self.per_shard, spec.hidden, device=device,
                                               dtype=dtype))

    def init_parameters(self, seed: int) -> None:
        """The block of the whole matrix the unsliced model draws (after the chunk's init)."""
        whole = torch.empty((self.vocab_size, self.weight.shape[1]), dtype=self.weight.dtype,
                            device=self.weight.device)
        init_named(whole, HEAD, seed)
        with torch.no_grad():
            self.weight.copy_(whole.narrow(0, self.vocab_start, self.per_shard))

    def logits_bytes(self, rows: int) -> int:
        """The fp32 logits block of ``rows`` hidden rows (what the simulator charges)."""
        return rows * self.per_shard * 4

    def loss_sum(self, x: torch.Tensor, labels: torch.Tensor, comm: HeadComm) -> torch.Tensor:
        """Last block, last stage: the slice's summed cross-entropy over every block of the
        vocabulary; its backward returns the d(hidden) the head step reduced here."""
        h = self.final_norm(x)
        if self.tp is not None:
            h = gather_rows(h, self.tp)
        return _LastStageHead.apply(h, pad_labels(labels, h.shape[0]), self, comm)

    def join(self, comm: HeadComm, *, rows: int, labels: torch.Tensor) -> None:
        """Another stage's part of one slice's head (rows: the last stage's gathered rows)."""
        if rows == 0:  # a cp position holding no row of the slice: all its lane skip alike
            return
        h = torch.empty((rows, self.weight.shape[1]), dtype=self.weight.dtype,
                        device=self.weight.device)
        dist.broadcast(h, src=comm.last, group=comm.lane)
        _, dh = self.step(h, pad_labels(labels, rows), comm)
        dist.reduce(dh, dst=comm.last, group=comm.lane)

    @torch.no_grad()
    def step(self, h: torch.Tensor, labels: torch.Tensor, comm: HeadComm
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of this block: (the summed loss, this block's share of
        d(loss_scale * loss)/d h); adds this block's weight gradient."""
        logits = F.linear(h, self.weight)
        loss, saved = vocab_parallel_ce_forward(logits, labels, self.vocab_start, comm.shards)
        d = vocab_parallel_ce_backward(saved, comm.loss_scale).to(h.dtype)
        del saved, logits
        dw = d.t() @ h
        if self.weight.grad is None:
            self.weight.grad = dw
        else:
            self.weight.grad += dw
        return loss, d @ self.weight


def pad_labels(labels: torch.Tensor, rows: int) -> torch.Tensor:
    """Labels of a slice's real rows, then ignored ones for tp padding rows."""
    if labels.shape[0] == rows:
        return labels
    out = torch.full((rows,), IGNORE_INDEX, dtype=labels.dtype, device=labels.device)
    out[:labels.shape[0]] = labels
    return out


class _LastStageHead(torch.autograd.Function):
    """Hidden states -> summed loss; the whole head step runs in forward, so backward only
    scales the d(hidden) summed over the pipeline ranks."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, labels: torch.Tensor, head: PipelineLMHead,  # noqa: ANN205
                comm: HeadComm):
        ctx.scale = comm.loss_scale
        if h.shape[0] == 0:
            ctx.save_for_backward(torch.zeros_like(h))
            return torch.zeros((), dtype=torch.float32, device=h.device)
        h = h.contiguous()
        dist.broadcast(h, src=comm.last, group=comm.lane)
        loss, dh = head.step(h, labels, comm)
        dist.reduce(dh, dst=comm.last, group=comm.lane)
        ctx.save_for_backward(dh)
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN205 - autograd API
        # dh is d(loss_scale * loss)/dh; the caller's graph brings grad = loss_scale.
        (dh,) = ctx.saved_tensors
        return dh * (grad / ctx.scale), None, None, None


def whole_head_gradient(head: PipelineLMHead | None) -> torch.Tensor:
    """The whole head matrix's gradient from every rank's block (collective over all ranks;
    for comparison with the unsliced model)."""
    mine = None if head is None else (head.vocab_start, head.weight.grad.detach().float().cpu())
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    blocks = dict(p for p in parts if p is not None)
    return torch.cat([blocks[start] for start in sorted(blocks)]).clone()
