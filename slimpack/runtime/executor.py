"""Run one rank's share of a plan over torch.distributed and measure it.

Phases of :func:`execute_rank`:

1. set-up: build this rank's model chunks, tokens, slice layouts and process groups;
2. per plan phase: walk the rank's op list; F receives the unit's activations (shape known
   from the plan, no handshake), runs each slice through its own graph, sends the result on;
   B receives gradients, runs each slice's backward with its dK/dV, sends d input back;
3. gradient synchronisation: tied-embedding copies, then the data-parallel sum;
4. measurements: per-op times, busy time, peak memory, loss.

Under ZeRO-3 (``Plan.zero_stage == 3``, :mod:`slimpack.runtime.zero`) a rank keeps only its
data-parallel shard of its chunks' parameters and gradients: each plan phase starts with an
all-gather of them and ends with a reduce-scatter of its gradients, on every rank of the
group whether it runs a group in that phase or not, and phase 3's all-reduce is then already
done. ZeRO-0/1 (or no stated stage) run the all-reduce: with no optimizer step the runtime
holds no optimizer states for ZeRO-1 to shard, and its reduce-scatter computes the same sums.

A stage of a group is ``cp*tp`` ranks. Context parallelism gives each cp rank its rows of every
slice (:mod:`slimpack.runtime.cp_layout`) for the whole layer stack; sequence parallelism then
splits those cp-local rows over the tp ranks (:mod:`slimpack.runtime.tensor_parallel`), so
the hidden states a rank sends down the pipeline are a tp share of its cp rows.

With ``vocab_parallel_pp`` at pp > 1 the LM head is spread over the group's pipeline ranks
(:mod:`slimpack.runtime.vocab_parallel`): the last stage runs a unit's head inside its
last-block forward, the other stages join it at the positions the dry run placed.

With ``Plan.attention_redistribution`` at pp > 1 (:mod:`slimpack.runtime.redistribution`) a
heavy rank's slices ship part of their attention to the paired pipeline rank, whose server
thread answers beside its own ops.

Sends are non-blocking (their tensors are held until done, then dropped); receives block.
Loss is ``sum CE / global label count`` on every last block, so gradients are already the
token-weighted mean over the whole step and the DP reduction is a plain sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from slimpack.plan import Group, Slice
from slimpack.records import OpTiming
from slimpack.runtime.activations import ActivationPolicy
from slimpack.runtime.attention import choose_backend
from slimpack.runtime.comm import PlanGroups, all_reduce_flat, message_tag, stage_peer
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.context_parallel import CpGroups, make_exchange
from slimpack.runtime.cp_layout import QueryPiece, local_inputs, whole_segments
from slimpack.runtime.data import make_tokens, num_label_tokens
from slimpack.runtime.layout import GroupLayout, slice_inputs
from slimpack.runtime.redistribution import RankRedistribution
from slimpack.runtime.slice_autograd import SliceRunner
from slimpack.runtime.stage import EMBED, ModelChunk, build_chunks
from slimpack.runtime.tensor_parallel import (
    TPGroup,
    build_tp_chunks,
    build_tp_group,
    local_rows,
    sync_tp_gradients,
    tp_rank_sets,
)
from slimpack.runtime.validate import RuntimePlan
from slimpack.runtime.vocab_parallel import (
    HEAD,
    HeadComm,
    PipelineLMHead,
    build_head_comms,
    whole_head_gradient,
)
from slimpack.runtime.zero import ZeroShards
from slimpack.specs.model import ModelSpec


@dataclass(kw_only=True)
class RankResult:
    rank: int
    stage: int | None
    loss: float
    """The whole step's loss (already summed over ranks)."""
    elapsed_s: float
    busy_s: float
    """Seconds in F/B compute (excludes waiting for receives)."""
    peak_memory_bytes: float
    memory_source: str
    activation_peak_bytes: float = 0.0
    """The tracked peak of activations alone (saved tensors, K/V caches, dK/dV accumulators),
    model state (parameters, gradients, ZeRO-3's gathered copies) excluded: the figure the
    simulator's activation walk predicts, on CPU and CUDA alike."""
    attention_backend: str
    ops: list[OpTiming] = field(default_factory=list)
    op_groups: list[int] = field(default_factory=list)
    """Plan group id of each op (-1 for the gradient synchronisation)."""
    grads: dict[str, torch.Tensor] | None = None
    redistribution_sent: int = 0
    """SlimPipe's redistribution: per-layer attention requests this rank sent as a heavy
    rank in this step (one per layer of a slice per direction)."""
    redistribution_served: int = 0
    """Those it answered as a light rank."""


class _Pipe:
    """Point-to-point traffic of one rank in one group (local mailbox when pp == 1)."""

    def __init__(self, groups: PlanGroups, num_blocks: int, device: torch.device) -> None:
        self.groups = groups
        self.num_blocks = num_blocks
        self.device = device
        self.mailbox: dict[tuple[str, int, int], torch.Tensor] = {}
        self.in_flight: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, t: torch.Tensor, *, src: int, dst: int, kind: str, unit: int,
             block: int) -> None:
        if src == dst:
            self.mailbox[(kind, unit, block)] = t
            return
        if t.numel() == 0:  # a cp rank holding no row of the unit: the receiver knows
            return
        group = self.groups.channels[(src, dst, kind)]
        buf = t.contiguous()  # held until the send completes: the backend reads it async
        work = dist.isend(buf, dst=dst, group=group, tag=message_tag(unit, block, self.num_blocks))
        self.in_flight.append((work, buf))
        # Drop finished sends so their buffers are freed as early as possible.
        self.in_flight = [(w, x) for w, x in self.in_flight if not w.is_completed()]

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, *, src: int, dst: int,
             kind: str, unit: int, block: int) -> torch.Tensor:
        if src == dst:
            return self.mailbox.pop((kind, unit, block))
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        if buf.numel() == 0:
            return buf
        dist.irecv(buf, src=src, group=self.groups.channels[(src, dst, kind)],
                   tag=message_tag(unit, block, self.num_blocks)).wait()
        return buf

    def drain(self) -> None:
        for work, _ in self.in_flight:
            work.wait()
        self.in_flight.clear()


class _Clock:
    def __init__(self, device: torch.device, sync: bool) -> None:
        self.sync = sync and device.type == "cuda"
        self.t0 = self.now()

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def since_start(self) -> float:
        return self.now() - self.t0


def execute_rank(rplan: RuntimePlan, spec: ModelSpec, config: RuntimeConfig, *, rank: int,
                 device: torch.device, return_grads: bool = False) -> list[RankResult]:
    """Run ``rank``'s ops of every phase; collective over the default process group.

    ``config.warmup_steps`` identical steps run first (gradients reset between steps) so the
    measured ones exclude first-call costs (allocator growth, kernel selection, gloo pairs);
    one result per measured step, gradients attached to the last.
    """
    # -- phase 1: set-up --------------------------------------------------------------------
    stage = rplan.stage_of_rank.get(rank)
    groups = PlanGroups.build(rplan, rank=rank, tied_embeddings=spec.tied_embeddings)
    cp_groups = CpGroups.build(list(rplan.plan.groups()), rank=rank)
    tp = build_tp_group(tp_rank_sets(rplan.plan.groups()), rank) if rplan.tp > 1 else None
    loss_scale = 1.0 / float(num_label_tokens(rplan.plan.sequence_lengths))
    head_comms = (build_head_comms(rplan.plan.groups(), rank=rank, loss_scale=loss_scale)
                  if rplan.vocab_over_pp else {})
    kw = {"pp": rplan.pp, "vpp": rplan.vpp, "layers": rplan.block_layers,
          "stage": stage, "seed": config.seed,
          "device": device, "dtype": config.torch_dtype,
          "make_head": _head_maker(rplan, spec, stage, tp, device, config.torch_dtype)}
    chunks = ([] if stage is None else
              build_tp_chunks(spec, tp, **kw) if tp is not None else build_chunks(spec, **kw))
    tokens = make_tokens(rplan.plan.sequence_lengths, vocab_size=spec.vocab_size,
                         seed=config.seed)
    zero = (ZeroShards([p for c in chunks for p in c.parameters()], groups.dp_group)
            if rplan.plan.zero_stage == 3 and chunks else None)
    redistribution = RankRedistribution.build(
        rplan.moves, {g.group_id: g for g in rplan.plan.groups()}, rank=rank)
    setup = _Setup(rplan=rplan, spec=spec, config=config, rank=rank, stage=stage, device=device,
                   chunks=chunks, groups=groups, cp_groups=cp_groups, tokens=tokens, tp=tp,
                   backend=choose_backend(device, config.torch_dtype, config.attention),
                   zero=zero, head_comms=head_comms, redistribution=redistribution)
    results = []
    for step in range(config.warmup_steps + config.measured_steps):
        for c in chunks:
            c.zero_grad(set_to_none=True)
        if zero is not None:
            zero.zero_grad()
        result = _step(setup)
        if step >= config.warmup_steps:
            results.append(result)
    if return_grads:
        if zero is not None:  # whole gradients from the shards (collective over dp)
            zero.gather_gradients()
        results[-1].grads = {}
        for c in chunks:
            if tp is not None:  # shards gathered whole, to compare with the unsliced model
                results[-1].grads.update(c.full_gradients())
                continue
            for name, p in c.global_named_parameters():
                results[-1].grads[name] = p.grad.detach().float().cpu().clone()
        if rplan.vocab_over_pp:  # every rank holds one block: the whole from all of them
            results[-1].grads[HEAD] = whole_head_gradient(setup.pipeline_head)
    return results


def _head_maker(rplan: RuntimePlan, spec: ModelSpec, stage: int | None, tp: TPGroup | None,
                device: torch.device, dtype: torch.dtype):  # noqa: ANN202 - a factory
    """``make_head(is_last_block)`` for this rank's block of a head spread over pp, or None."""
    if not rplan.vocab_over_pp or stage is None:
        return None
    width = 1 if tp is None else tp.size
    shard = stage * width + (0 if tp is None else tp.index)
    return lambda last: PipelineLMHead(spec, shard=shard, num_shards=rplan.pp * width, last=last,
                                       tp=tp, device=device, dtype=dtype)


@dataclass(frozen=True, kw_only=True)
class _Setup:
    rplan: RuntimePlan
    spec: ModelSpec
    config: RuntimeConfig
    rank: int
    stage: int | None
    device: torch.device
    chunks: list[ModelChunk]
    groups: PlanGroups
    cp_groups: CpGroups
    tokens: dict[int, torch.Tensor]
    backend: str
    tp: TPGroup | None
    zero: ZeroShards | None
    """This rank's ZeRO-3 shards (None: parameters replicated, gradients all-reduced)."""
    head_comms: dict[int, HeadComm]
    """Group id -> this rank's process groups of the group's head spread over pp."""
    redistribution: RankRedistribution
    """This rank's side of SlimPipe's attention redistribution moves (none: no moves)."""

    @property
    def pipeline_head(self) -> PipelineLMHead | None:
        """This rank's block of a head spread over the pipeline ranks (on its last chunk)."""
        head = self.chunks[-1].head if self.chunks else None
        return head if isinstance(head, PipelineLMHead) else None

    def rows(self, num_tokens: int) -> int:
        """Rows of a slice's hidden states this rank holds when its cp share of the slice is
        ``num_tokens`` rows (all of them at cp = 1): its sequence-parallel share."""
        return num_tokens if self.tp is None else local_rows(num_tokens, self.tp.size)

    @property
    def counts_loss(self) -> bool:
        """Every tp rank computes the whole loss; only the first adds it to the report."""
        return self.tp is None or self.tp.index == 0


def _step(su: _Setup) -> RankResult:
    """One training step (forward, backward, gradient sync) of this rank, measured."""
    rplan, spec, config, device, stage = su.rplan, su.spec, su.config, su.device, su.stage
    model_state_bytes = (2 * sum(p.numel() * p.element_size() for c in su.chunks
                                 for p in c.parameters())  # parameters and their gradients
                         if su.zero is None else su.zero.state_bytes)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    ops_out: list[OpTiming] = []
    op_groups: list[int] = []
    peak_tracked = float(model_state_bytes)
    peak_activations = 0.0
    busy = 0.0
    loss_here = loss_sum if su.counts_loss else torch.zeros_like(loss_sum)
    sent, served = su.redistribution.sent[0], su.redistribution.served[0]
    dist.barrier()
    clock = _Clock(device, config.record_ops)

    # -- phase 2: every plan phase, this rank's group ---------------------------------------
    for phase in rplan.plan.phases:
        group = next((g for g in phase.groups if su.rank in g.ranks), None)
        held = model_state_bytes
        if su.zero is not None:  # every rank of the dp group, in a group this phase or not
            su.zero.unshard()
            held += su.zero.gathered_bytes
            peak_tracked = max(peak_tracked, held)
        if group is not None:
            group_busy, group_peak = _run_group(su, group, clock, loss_here, ops_out,
                                                op_groups, held_bytes=held)
            busy += group_busy
            peak_tracked = max(peak_tracked, group_peak)
            peak_activations = max(peak_activations, group_peak - held)
        if su.zero is not None:  # tp sums of replicated weights first (sums commute)
            su.zero.reshard(before_reduce=None if su.tp is None else
                            lambda: sync_tp_gradients(su.chunks, su.tp))

    # -- phase 3: gradient synchronisation ------------------------------------------------
    start = clock.since_start()
    if su.zero is None:  # ZeRO-3 reduce-scattered every phase's gradients already
        _sync_gradients(su.chunks, su.groups, tied=spec.tied_embeddings)
        if su.tp is not None:  # norm weights: each tp rank saw only its rows (sums commute)
            sync_tp_gradients(su.chunks, su.tp)
    dist.all_reduce(loss_sum)  # only last blocks contribute; report the step's loss
    end = clock.since_start()
    if config.record_ops and stage is not None:
        ops_out.append(OpTiming(stage=stage, kind="allreduce", unit=-1, chunk=-1, start_s=start,
                                end_s=end, lane="comm"))
        op_groups.append(-1)

    # -- phase 4: measurements --------------------------------------------------------------
    if device.type == "cuda":
        peak, source = float(torch.cuda.max_memory_allocated(device)), "cuda-allocator"
    else:
        peak, source = peak_tracked, "tracked-tensors"
    return RankResult(rank=su.rank, stage=stage, loss=float(loss_sum), elapsed_s=end,
                      busy_s=busy, peak_memory_bytes=peak, memory_source=source,
                      activation_peak_bytes=peak_activations,
                      attention_backend=su.backend, ops=ops_out, op_groups=op_groups,
                      redistribution_sent=su.redistribution.sent[0] - sent,
                      redistribution_served=su.redistribution.served[0] - served)


def _run_group(su: _Setup, group: Group, clock: _Clock, loss_here: torch.Tensor,
               ops_out: list[OpTiming], op_groups: list[int], *, held_bytes: float
               ) -> tuple[float, float]:
    """This rank's ops of ``group`` in one plan phase: (busy seconds, tracked peak bytes,
    ``held_bytes`` of model state plus the live activations and caches)."""
    rplan, spec, config, device, stage = su.rplan, su.spec, su.config, su.device, su.stage
    pp, dtype = rplan.pp, config.torch_dtype
    denom = float(num_label_tokens(rplan.plan.sequence_lengths))
    busy, peak = 0.0, float(held_bytes)
    layout = GroupLayout(group)
    exchange = make_exchange(group, layout, cp=su.cp_groups.of(group.group_id))

    def pieces_of(slice_id: int) -> tuple[QueryPiece, ...]:
        # This rank's query pieces of the slice, in its attention's varlen order.
        shard = exchange.shard(slice_id)
        return whole_segments(layout[slice_id]) if shard is None else shard.pieces
    policy = ActivationPolicy(recompute=group.recompute, recompute_layers=group.recompute_layers,
                              offload=group.offload)
    head_comm = su.head_comms.get(group.group_id)
    runners = [SliceRunner(c, layout, attention_backend=su.backend, head_dim=spec.head_dim,
                           loss_scale=1.0 / denom, policy=policy, exchange=exchange,
                           head_comm=head_comm,
                           splits=su.redistribution.splits(
                               group, c.block, pieces_of,
                               keep_remote=policy.recompute != "none"))
               for c in su.chunks]
    server = su.redistribution.server(group, spec, pieces_of, dtype=dtype, device=device)
    if server is not None:  # answers paired heavy ranks beside this rank's own ops
        server.start()
    pipe = _Pipe(su.groups, rplan.num_blocks, device)
    inputs = {sl.slice_id: slice_inputs(sl, su.tokens, device) for sl in group.slices}
    cp_rows = {sl.slice_id: sl.num_tokens for sl in group.slices}
    if group.cp > 1:  # this rank's rows of every slice (cp_layout), all layers and loss
        inputs = {i: local_inputs(x, exchange.shard(i)) for i, x in inputs.items()}
        cp_rows = {i: exchange.shard(i).num_local for i in cp_rows}
    lane = _Lane(group=group, rank=su.rank,
                 rows={i: su.rows(n) for i, n in cp_rows.items()})
    head_rows = {i: n * (1 if su.tp is None else su.tp.size) for i, n in lane.rows.items()}
    joins: dict[int, list[int]] = {}  # op index -> units whose head this stage joins there
    for index, unit in rplan.head_joins.get(group.group_id, [[]] * pp)[stage]:
        joins.setdefault(index, []).append(unit)
    ops = rplan.schedules[group.group_id][stage]
    for i, op in enumerate([*ops, None]):
        for unit in joins.get(i, []):  # a stage before the last: its part of a unit's head
            start = clock.since_start()
            slices = group.unit_slices(group.forward_units[unit])
            for sl in slices:
                su.pipeline_head.join(head_comm, rows=head_rows[sl.slice_id],
                                      labels=inputs[sl.slice_id][1])
            if config.record_ops:
                ops_out.append(OpTiming(stage=stage, kind="head", unit=unit, chunk=rplan.vpp - 1,
                                        start_s=start, end_s=clock.since_start(), lane="comm"))
                op_groups.append(group.group_id)
            peak = max(peak, held_bytes + sum(r.live_bytes() for r in runners)
                       + _head_bytes(su, slices, head_rows))
        if op is None:  # joins placed after the stage's last op ran above
            break
        start = clock.since_start()
        if op.kind == "F":
            waited = _forward(lane, op.unit, op.chunk, stage, pp, runners[op.chunk], pipe,
                              inputs, spec, dtype, clock, loss_here)
        else:
            waited = _backward(lane, op.unit, op.chunk, stage, pp, runners[op.chunk], pipe,
                               spec, dtype, clock)
        end = clock.since_start()
        busy += end - start - waited
        if config.record_ops:
            if waited > 0:
                ops_out.append(OpTiming(stage=stage, kind="recv", unit=op.unit,
                                        chunk=op.chunk, start_s=start, end_s=start + waited,
                                        lane="comm"))
                op_groups.append(group.group_id)
            ops_out.append(OpTiming(stage=stage, kind=op.kind, unit=op.unit, chunk=op.chunk,
                                    start_s=start + waited, end_s=end))
            op_groups.append(group.group_id)
        live = sum(r.live_bytes() for r in runners)
        if op.kind == "F" and op.chunk * pp + stage == pp * group.vpp - 1 and head_comm is not None:
            # The head's logits block lived during the op (its d hidden is in ``live``).
            live += _head_bytes(su, group.unit_slices(group.forward_units[op.unit]), head_rows)
        peak = max(peak, held_bytes + live)
    if server is not None:
        server.finish()
    pipe.drain()
    leftover = [(c, r.pending()) for c, r in enumerate(runners) if r.pending()]
    if leftover:
        raise RuntimeError(f"rank {su.rank}: slices forwarded but never backwarded: "
                           f"{leftover}")
    return busy, peak


def _head_bytes(su: _Setup, slices: list[Slice], head_rows: dict[int, int]) -> int:
    """The largest fp32 logits block of ``slices`` on this rank's head block."""
    return max(su.pipeline_head.logits_bytes(head_rows[sl.slice_id]) for sl in slices)


@dataclass(frozen=True, kw_only=True)
class _Lane:
    """This rank's (cp, tp) lane of one group: its pipeline peers and its rows per slice."""

    group: Group
    rank: int
    rows: dict[int, int]
    """Slice id -> rows of the slice's hidden states this rank holds (cp share, then tp
    share): the shape of every activation and gradient message it exchanges."""

    def peer(self, stage: int) -> int:
        return stage_peer(self.group, self.rank, stage % self.group.pp)

    def sizes(self, slices: list[Slice]) -> list[int]:
        return [self.rows[sl.slice_id] for sl in slices]


def _forward(lane: _Lane, unit: int, chunk: int, stage: int, pp: int, runner: SliceRunner,
             pipe: _Pipe, inputs: dict, spec: ModelSpec, dtype: torch.dtype, clock: _Clock,
             loss_sum: torch.Tensor) -> float:
    """F of one unit on one chunk; returns seconds spent waiting for the receive."""
    group = lane.group
    slices = group.unit_slices(group.forward_units[unit])
    block, last = chunk * pp + stage, pp * group.vpp - 1
    waited = 0.0
    if block == 0:
        xs = [inputs[sl.slice_id][0] for sl in slices]
    else:
        t = clock.now()
        sizes = lane.sizes(slices)
        buf = pipe.recv((sum(sizes), spec.hidden), dtype, src=lane.peer(stage - 1),
                        dst=lane.peer(stage), kind="F", unit=unit, block=block)
        waited = clock.now() - t
        # One storage per slice: each slice's graph keeps its input, and views of the shared
        # buffer would keep all of it alive until the unit's last slice is backwarded.
        xs = list(buf.split(sizes)) if len(sizes) == 1 else [x.clone() for x in buf.split(sizes)]
        del buf
    outs = []
    for sl, x in zip(slices, xs, strict=True):
        _, labels, positions = inputs[sl.slice_id]
        outs.append(runner.forward(sl, x, positions=positions,
                                   labels=labels if block == last else None))
    if block == last:
        for out in outs:
            loss_sum += out
    else:
        pipe.send(torch.cat(outs) if len(outs) > 1 else outs[0], src=lane.peer(stage),
                  dst=lane.peer(stage + 1), kind="F", unit=unit, block=block + 1)
    return waited


def _backward(lane: _Lane, unit: int, chunk: int, stage: int, pp: int, runner: SliceRunner,
              pipe: _Pipe, spec: ModelSpec, dtype: torch.dtype, clock: _Clock) -> float:
    """B of one backward unit on one chunk; returns seconds spent waiting for the receive."""
    group = lane.group
    slices = group.unit_slices(group.backward_units[unit])
    block, last = chunk * pp + stage, pp * group.vpp - 1
    waited = 0.0
    if block == last:
        d_outs: list[torch.Tensor | None] = [None] * len(slices)
    else:
        t = clock.now()
        sizes = lane.sizes(slices)
        buf = pipe.recv((sum(sizes), spec.hidden), dtype, src=lane.peer(stage + 1),
                        dst=lane.peer(stage), kind="B", unit=unit, block=block)
        waited = clock.now() - t
        d_outs = list(buf.split(sizes))
        del buf
    d_ins = [runner.backward(sl, d) for sl, d in zip(slices, d_outs, strict=True)]
    del d_outs
    if block > 0:
        pipe.send(torch.cat(d_ins) if len(d_ins) > 1 else d_ins[0], src=lane.peer(stage),
                  dst=lane.peer(stage - 1), kind="B", unit=unit, block=block - 1)
    return waited


def _sync_gradients(chunks: list[ModelChunk], groups: PlanGroups, *, tied: bool) -> None:
    """Tied embedding copies summed over every rank holding one, the rest over DP."""
    for c in chunks:
        for p in c.parameters():
            if p.grad is None:  # a rank whose groups ran no slice still joins the collectives
                p.grad = torch.zeros_like(p)
    copies: dict[int, torch.nn.Parameter] = {}
    if tied:
        copies = {id(p): p for c in chunks for name, p in c.global_named_parameters()
                  if name == EMBED}
    if copies:
        # Embedding and LM head copies (first and last block) share one logical weight.
        local = torch.stack([p.grad for p in copies.values()]).sum(0)
        group = groups.tied_group if groups.tied_group is not None else groups.dp_group
        if group is not None:
            dist.all_reduce(local, group=group)
        for p in copies.values():
            p.grad.copy_(local)
    rest = [p.grad for c in chunks for p in c.parameters() if id(p) not in copies]
    all_reduce_flat(rest, groups.dp_group)
