"""What each op allocates and frees on its stage, in the units of slimpack.cost.memory.

The engine walks each stage's ops in order and keeps a running total, so the peak is exact
for the schedule that ran. Per rank of a stage (one of its tp*cp devices):

* activations: a slice's ``tokens/(tp*cp) * layers * a`` bytes (``a`` from
  :func:`activation_bytes_per_token_per_layer`, which already holds the slice's K and V, i.e.
  the KV cache later slices attend to) alive from the start of its F to the end of its B;
* dK/dV accumulators: for a sequence whose slices are backwarded in several units, its
  ``tokens/cp * layers * kv_bytes`` from the start of its first B to the end of its last B on
  that chunk (they collect the gradients later slices send to earlier ones);
* constant: model states (embedding on the first stage, LM head on the last or spread over
  all stages) and the fp32 logits of one slice where the head runs.

That is the default accounting (``GPU_BF16``). ``ActivationAccounting(saved="runtime")``
counts what this suite's PyTorch runtime keeps instead (:func:`_runtime_group_memory`), to
compare the simulator with the runtime's tracked activation peak.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from slimpack.cost.memory import (
    BF16,
    GPU_BF16,
    ActivationAccounting,
    SliceShape,
    activation_bytes_per_token_per_layer,
    kv_bytes_per_token_per_layer,
    logits_bytes,
    model_state_bytes,
    optimizer_bytes_per_param,
    runtime_chunk_bytes,
    runtime_first_block_bytes,
    runtime_head_bytes,
    runtime_head_logits_bytes,
    runtime_ring_share_bytes,
    runtime_slice_bytes_per_layer,
    runtime_spread_head_bytes,
)
from slimpack.plan import Group, Plan, PlanError, Unit
from slimpack.schedules import Op, build_schedule, stage_forward_counts
from slimpack.schedules.ops import describe_op_ranges, op_arrays, ops_in_range
from slimpack.sim.costs import group_layers, head_stages
from slimpack.sim.memory_walk import run_sums, stage_peaks
from slimpack.specs.hardware import HardwareSpec
from slimpack.specs.model import ModelSpec
from slimpack.specs.training import TrainingSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupMemory:
    """Bytes per layer (multiply by a virtual stage's layers) and constant bytes per stage."""

    fwd_alloc: list[float]
    """Per forward unit: activations allocated at F start, per layer."""
    bwd_free: list[float]
    """Per backward unit: activations freed at B end, per layer."""
    kvgrad_alloc: list[float]
    """Per backward unit: dK/dV accumulators allocated at B start, per layer."""
    kvgrad_free: list[float]
    """Per backward unit: dK/dV accumulators freed at B end, per layer."""
    static_bytes: list[float]
    """Per stage: model states plus logits."""
    model_state_bytes: list[float]
    logits_bytes: list[float]
    kv_share: float
    """Fraction of activation bytes that are the forward K,V (the KV cache)."""
    fwd_offload: list[float]
    """Per forward unit: activations copied to host after F ends, per layer (0 without
    offload)."""
    bwd_fetch: list[float]
    """Per backward unit: offloaded activations brought back at B start, per layer."""
    block_extras: BlockExtras | None = None
    """Bytes per unit that do not scale with a virtual stage's layers (the runtime
    accounting's RoPE tables, token ids, per-slice LM head and a spread head's transient
    logits); None under the default accounting, which has none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockExtras:
    """Per unit, bytes a forward allocates (and its backward frees) on a virtual stage
    whatever its layer count: ``every`` on each, ``first`` on virtual stage 0 (the
    embedding's), ``head`` on the LM head's (``head_blocks``: the model's last block).

    With the head spread over the pipeline ranks, ``head_logits`` is per forward unit the
    logits block a stage holds only while it runs its part of the unit's head (the
    runtime's ``vocab_parallel_pp``: the last stage inside its forward of the last block,
    the others where they join it), on the stages whose last virtual stage is in
    ``logits_blocks``; the walk checks it on top of the bytes held there, allocating
    nothing (:func:`peak_bytes_by_stage`)."""

    fwd_every: list[float]
    bwd_every: list[float]
    fwd_first: list[float]
    bwd_first: list[float]
    fwd_head: list[float]
    bwd_head: list[float]
    head_blocks: frozenset[int]
    head_logits: list[float] = field(default_factory=list)
    logits_blocks: frozenset[int] = frozenset()

    def fwd(self, unit: int, block: int) -> float:
        return (self.fwd_every[unit] + (self.fwd_first[unit] if block == 0 else 0.0)
                + (self.fwd_head[unit] if block in self.head_blocks else 0.0))

    def bwd(self, unit: int, block: int) -> float:
        return (self.bwd_every[unit] + (self.bwd_first[unit] if block == 0 else 0.0)
                + (self.bwd_head[unit] if block in self.head_blocks else 0.0))

    def logits(self, unit: int, block: int) -> float:
        """The transient logits of forward unit ``unit``'s spread head on ``block``."""
        return self.head_logits[unit] if block in self.logits_blocks else 0.0


def stage_state_bytes(model: ModelSpec, *, tp: int, cp: int, pp: int, dp: int,
                      vocab_parallel_pp: bool, ep: int = 1,
                      training: TrainingSpec | None = None,
                      stage_layers: Sequence[int] | None = None) -> list[float]:
    """Model-state bytes on one device of each pipeline stage: the layers' share, the input
    embedding on the first stage, an untied LM head on the last (or spread over every stage
    with ``vocab_parallel_pp``), under ``training``'s ZeRO stage and precision.
    ``stage_layers``: the decoder layers each stage holds, where they are not
    ``num_layers / pp`` (an uneven ``pipeline_split``; the layers' states scale with them)."""
    zero = {} if training is None else {
        "zero_stage": training.zero_stage, "fp8": training.dtype == "fp8",
        "grad_bytes": 2 if training.grad_dtype == "bf16" else 4,
        "fp8_params": training.fp8_params,
        "optimizer_bytes": optimizer_bytes_per_param(optimizer=training.optimizer,
                                                     optimizer_dtype=training.optimizer_dtype,
                                                     fp8_params=training.fp8_params)}
    states_no_embedding = model_state_bytes(model, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
                                            include_embedding=False, **zero)
    embedding = (model_state_bytes(model, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, **zero)
                 - states_no_embedding)
    states = [states_no_embedding] * pp
    if stage_layers is not None:
        states = [states_no_embedding * n * pp / model.num_layers for n in stage_layers]
    states[0] += embedding
    if not model.tied_embeddings:
        if vocab_parallel_pp:
            states = [s + embedding / pp for s in states]
        else:
            states[pp - 1] += embedding
    return states


def stage_constant_bytes(model: ModelSpec, *, tp: int, cp: int, pp: int, vpp: int, dp: int,
                         vocab_parallel_pp: bool, training: TrainingSpec | None,
                         longest_slice: int, stage_layers: Sequence[int] | None = None,
                         ep: int = 1) -> tuple[list[float], list[float]]:
    """Per stage, the bytes held for the whole step: model states (:func:`stage_state_bytes`)
    and the fp32 logits of the longest slice where (a share of) the LM head runs."""
    states = stage_state_bytes(model, tp=tp, cp=cp, pp=pp, dp=dp,
                               vocab_parallel_pp=vocab_parallel_pp, training=training,
                               stage_layers=stage_layers, ep=ep)
    logits = [0.0] * pp
    shards = pp if vocab_parallel_pp else 1
    for vs in head_stages(pp, vpp, vocab_parallel_pp=vocab_parallel_pp):
        logits[vs % pp] = logits_bytes(model, longest_slice, tp=tp, cp=cp, spread_over_pp=shards)
    return states, logits


def group_memory(group: Group, *, model: ModelSpec, dp: int,
                 training: TrainingSpec | None = None,
                 accounting: ActivationAccounting = GPU_BF16,
                 cp_index: int | None = None, ep: int = 1) -> GroupMemory:
    """What each of ``group``'s ops allocates and frees; ``accounting`` says whose saved
    activations are counted (the default: the suite's bf16 GPU accounting). The runtime
    accounting at cp > 1 is per cp rank (``cp_index``: its rows differ). ``ep``: the plan's
    expert parallelism (MoE expert states, :func:`~slimpack.cost.memory.model_state_bytes`)."""
    if accounting.saved == "runtime":
        return _runtime_group_memory(group, model=model, dp=dp, training=training,
                                     accounting=accounting, cp_index=cp_index, ep=ep)
    if group.recompute_layers is not None:
        return _block_recompute_memory(group, model=model, dp=dp, training=training, ep=ep)
    return _uniform_group_memory(group, model=model, dp=dp, training=training, ep=ep)


def _block_recompute_memory(group: Group, *, model: ModelSpec, dp: int,
                            training: TrainingSpec | None, ep: int = 1) -> GroupMemory:
    """``recompute_layers``: the first ``k`` layers of every virtual stage keep what full
    recompute keeps, the others what no recompute keeps, so a unit's bytes per layer are
    ``k/n`` of the first plus ``(n - k)/n`` of the second. The walk multiplies bytes per layer
    by a virtual stage's layers, so that share must be the same on every virtual stage."""
    layers = group_layers(group, model.num_layers)
    shares = {min(group.recompute_layers, n) / n for n in layers}
    if len(shares) > 1:
        raise PlanError(
            f"Group {group.group_id}: recompute_layers={group.recompute_layers} recomputes "
            f"different shares of virtual stages of {min(layers)} and {max(layers)} layers "
            f"({model.num_layers} layers over pp*vpp = {group.pp * group.vpp}); not modelled: "
            f"use a recompute_layers of at least {max(layers)} or a layer count that divides")
    f = shares.pop()
    kept, recomputed = (_uniform_group_memory(
        dataclasses.replace(group, recompute=mode, recompute_layers=None), model=model, dp=dp,
        training=training, ep=ep) for mode in ("none", "full"))

    def blend(a: list[float], b: list[float]) -> list[float]:
        return [x * (1.0 - f) + y * f for x, y in zip(a, b, strict=True)]

    fwd_alloc = blend(kept.fwd_alloc, recomputed.fwd_alloc)
    kv = (kept.kv_share * sum(kept.fwd_alloc) * (1.0 - f)
          + recomputed.kv_share * sum(recomputed.fwd_alloc) * f)
    return dataclasses.replace(
        kept, fwd_alloc=fwd_alloc, bwd_free=blend(kept.bwd_free, recomputed.bwd_free),
        kv_share=kv / max(sum(fwd_alloc), 1e-30))


def _uniform_group_memory(group: Group, *, model: ModelSpec, dp: int,
                          training: TrainingSpec | None, ep: int = 1) -> GroupMemory:
    """:func:`group_memory` under the default accounting, every layer in ``group.recompute``."""
    tp, cp, pp = group.tp, group.cp, group.pp
    a = activation_bytes_per_token_per_layer(
        model, group.recompute, fp8=training is not None and training.dtype == "fp8")
    per_token = a / (tp * cp)
    # Over arrays of the group's segments (a planner runs this once per candidate group, on
    # ~10^5 slices): integer sums are exact in any order, and every float sum runs in the
    # order of the rule written per slice (``tests/test_memory_walk.py``'s oracle).
    table = _segment_table(group)
    slice_tokens = np.add.reduceat(table.length, table.first)
    slice_act = slice_tokens * per_token
    # dK/dV buffers: only for sequences spread over several backward units. Each sequence's
    # tokens and the first and last backward unit holding a slice of it.
    kv_per_token = kv_bytes_per_token_per_layer(model, tp) / cp
    b_bounds, b_members = table.units(group.backward_units)
    unit_of_member = np.repeat(np.arange(len(b_bounds) - 1, dtype=np.int64), np.diff(b_bounds))
    rows, row_member = table.rows_of(b_members)
    seqs, first_row, seq_of_row = np.unique(table.seq[rows], return_index=True,
                                            return_inverse=True)
    seq_tokens = np.bincount(seq_of_row, weights=table.length[rows],
                             minlength=len(seqs)).astype(np.int64)
    row_unit = unit_of_member[row_member]
    first_unit = row_unit[first_row]  # backward units come in order: the first is the least
    last_unit = np.zeros(len(seqs), dtype=np.int64)
    np.maximum.at(last_unit, seq_of_row, row_unit)
    spread = last_unit != first_unit
    kept_kv = 0.0
    if group.recompute == "full":
        # Full recompute keeps a layer's input only, but a sequence cut over several units
        # also keeps each slice's K,V: later slices attend to them in forward, and recomputing
        # a slice's layer in backward needs the K,V of the slices before it (SlimPipe's KV
        # cache; recomputing them instead would re-run every earlier slice's projections).
        cached_rows = table.length * spread[np.searchsorted(seqs, table.seq)]
        cached = np.add.reduceat(cached_rows, table.first)
        kept = cached * kv_per_token
        slice_act = np.where(cached > 0, slice_act + kept, slice_act)
        kept_kv = sum(kept[cached > 0].tolist())  # slice by slice, from 0
    fwd_bounds, fwd_members = table.units(group.forward_units)
    fwd_alloc = run_sums(slice_act[fwd_members], fwd_bounds).tolist()
    bwd_free = run_sums(slice_act[b_members], b_bounds).tolist()
    nb = len(group.backward_units)
    kvgrad_alloc = [0.0] * nb
    kvgrad_free = [0.0] * nb
    # Sequences in the order they first appear in the backward units.
    order = np.argsort(first_row)
    for seq in order[spread[order]].tolist():
        tokens = int(seq_tokens[seq])
        kvgrad_alloc[int(first_unit[seq])] += tokens * kv_per_token
        kvgrad_free[int(last_unit[seq])] += tokens * kv_per_token

    counts = group.virtual_stage_layers
    states, logits = stage_constant_bytes(
        model, tp=tp, cp=cp, pp=pp, vpp=group.vpp, dp=dp,
        vocab_parallel_pp=group.vocab_parallel_pp, training=training,
        longest_slice=int(slice_tokens.max()),  # every slice of the group
        stage_layers=None if counts is None else [sum(counts[s::pp]) for s in range(pp)],
        ep=ep)
    if group.recompute == "full":
        kv_share = kept_kv / max(sum(slice_act.tolist()), 1e-30)
    else:
        kv_share = kv_per_token * cp * tp / a
    # Offload moves the non-KV part (later slices of the sequence read the KV cache).
    moved = group.offload * (1.0 - kv_share)
    fwd_offload = [x * moved for x in fwd_alloc]
    bwd_fetch = [x * moved for x in bwd_free]
    return GroupMemory(fwd_alloc=fwd_alloc, bwd_free=bwd_free, kvgrad_alloc=kvgrad_alloc,
                       kvgrad_free=kvgrad_free, fwd_offload=fwd_offload, bwd_fetch=bwd_fetch,
                       static_bytes=[s + lg for s, lg in zip(states, logits, strict=True)],
                       model_state_bytes=states, logits_bytes=logits, kv_share=kv_share)


_SEQ_START_END = operator.attrgetter("seq_id", "start", "end")


@dataclass(frozen=True, slots=True)
class _SegmentTable:
    """A group's segments as arrays, slice after slice in ``group.slices`` order (every slice
    holds at least one segment)."""

    position: dict[int, int]
    """Slice id -> its index in ``group.slices``."""
    first: np.ndarray
    """Per slice, the row of its first segment."""
    count: np.ndarray
    seq: np.ndarray
    length: np.ndarray

    def units(self, units: tuple[Unit, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(where each unit's slices start in the second array and one past the last, the
        slice index of every member of every unit, in unit order)."""
        position = self.position
        members = np.fromiter((position[sid] for unit in units for sid in unit.slice_ids),
                              dtype=np.int64)
        bounds = np.zeros(len(units) + 1, dtype=np.int64)
        bounds[1:] = np.cumsum(np.fromiter((len(u.slice_ids) for u in units), dtype=np.int64,
                                           count=len(units)))
        return bounds, members

    def rows_of(self, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the segment rows of each member slice, one member after another; for each row,
        its member's index)."""
        counts = self.count[members]
        before = np.cumsum(counts) - counts
        rows = np.repeat(self.first[members] - before, counts) + np.arange(int(counts.sum()))
        return rows, np.repeat(np.arange(len(members), dtype=np.int64), counts)


def _segment_table(group: Group) -> _SegmentTable:
    slices = group.slices
    count = np.fromiter((len(sl.segments) for sl in slices), dtype=np.int64, count=len(slices))
    fields = np.fromiter(itertools.chain.from_iterable(map(_SEQ_START_END, itertools.chain.
                                                           from_iterable(sl.segments
                                                                         for sl in slices))),
                         dtype=np.int64, count=3 * int(count.sum())).reshape(-1, 3)
    return _SegmentTable(position={sl.slice_id: i for i, sl in enumerate(slices)},
                         first=np.cumsum(count) - count, count=count, seq=fields[:, 0],
                         length=fields[:, 2] - fields[:, 1])


def _runtime_group_memory(group: Group, *, model: ModelSpec, dp: int,
                          training: TrainingSpec | None,
                          accounting: ActivationAccounting,
                          cp_index: int | None, ep: int = 1) -> GroupMemory:
    """:func:`group_memory` under the runtime's accounting (:class:`ActivationAccounting`):
    per slice, what ``slimpack/runtime`` keeps on one rank for its backward
    (:func:`~slimpack.cost.memory.runtime_slice_bytes_per_layer`; at ring cp > 1, tp = 1,
    cp rank ``cp_index``'s rows: :func:`~slimpack.cost.memory.runtime_ring_share_bytes`),
    the RoPE tables and token ids per chunk and the LM head's rows and fp32 log-softmax on
    the head's chunk, alive from its F to its B (the runtime frees a slice's logits with its
    graph, so no logits are held for the step); dK/dV accumulators as the runtime keeps
    them (:func:`_runtime_kv_accumulators`); model states as the default.

    With the head spread over the pipeline ranks (``vocab_parallel_pp`` at pp > 1) the last
    block keeps per slice only the final norm's rows and the reduced d(hidden)
    (:func:`~slimpack.cost.memory.runtime_spread_head_bytes`), and every stage holds the
    unit's largest logits block (:func:`~slimpack.cost.memory.runtime_head_logits_bytes`)
    only while it runs its part of the unit's head: ``BlockExtras.head_logits``."""
    tp, cp, pp = group.tp, group.cp, group.pp
    e = accounting.bytes_per_element
    if group.recompute != "none" or group.offload:
        raise ValueError(f"runtime activation accounting models recompute='none' without "
                         f"offload, got recompute={group.recompute!r}, "
                         f"offload={group.offload!r}")
    if cp > 1:
        if group.cp_kind != "ring" or tp > 1:
            raise ValueError(f"runtime activation accounting at cp > 1 models cp_kind='ring' "
                             f"with tp = 1, got cp_kind={group.cp_kind!r}, tp={tp}")
        if cp_index is None or not 0 <= cp_index < cp:
            raise ValueError(f"runtime activation accounting at cp={cp} needs the rank's "
                             f"cp_index in [0, {cp}), got {cp_index!r}")
    spread = group.vocab_parallel_pp and pp > 1  # the runtime's PipelineLMHead
    last_start: dict[int, int] = {}
    for sl in group.slices:
        for seg in sl.segments:
            last_start[seg.seq_id] = max(last_start.get(seg.seq_id, 0), seg.start)
    per_layer: dict[int, float] = {}
    every: dict[int, float] = {}
    head: dict[int, float] = {}
    first: dict[int, float] = {}
    rows: dict[int, int] = {}
    for sl in group.slices:
        segs = sl.segments
        tokens = sum(seg.end - seg.start for seg in segs)
        caches_kv = any(last_start[seg.seq_id] > seg.start for seg in segs)
        sid = sl.slice_id
        if cp > 1:
            offsets = np.cumsum([0] + [seg.end - seg.start for seg in segs])[:-1].tolist()
            ring = runtime_ring_share_bytes(
                model, [(seg.end - seg.start, seg.start, off) for seg, off in zip(
                    segs, offsets, strict=True)], cp=cp, cp_index=cp_index,
                sharding=group.cp_sharding, caches_kv=caches_kv, bytes_per_element=e)
            per_layer[sid], every[sid], head[sid], first[sid] = (
                ring.per_layer, ring.chunk, ring.head, ring.first)
            rows[sid] = ring.rows
            if spread:
                head[sid] = runtime_spread_head_bytes(model, ring.rows, bytes_per_element=e)
            continue
        shape = SliceShape(tokens=tokens, key_tokens=sum(seg.end for seg in segs),
                           pieces=len(segs), caches_kv=caches_kv,
                           masked_scores=sum((seg.end - seg.start) * seg.end for seg in segs
                                             if seg.start > 0))
        per_layer[sid] = runtime_slice_bytes_per_layer(
            model, shape, bytes_per_element=e, tp=tp, recompute=group.recompute,
            offload=group.offload)
        every[sid] = runtime_chunk_bytes(model, tokens, bytes_per_element=e, tp=tp)
        head[sid] = (runtime_spread_head_bytes(model, tokens, bytes_per_element=e, tp=tp)
                     if spread else runtime_head_bytes(model, tokens, bytes_per_element=e, tp=tp))
        first[sid] = runtime_first_block_bytes(tokens, bytes_per_element=e, tp=tp)
        rows[sid] = tokens

    def per_unit(values: dict[int, float], units) -> list[float]:  # noqa: ANN001
        return [sum(values[s] for s in u.slice_ids) for u in units]

    fwd, bwd = group.forward_units, group.backward_units
    # The saved head bytes stay on the model's last block either way; a spread head's
    # logits pass through every stage's last chunk (head_stages), one slice at a time.
    head_logits = ([max(runtime_head_logits_bytes(model, rows[s], pp=pp, tp=tp)
                        for s in u.slice_ids) for u in fwd] if spread else [])
    extras = BlockExtras(
        fwd_every=per_unit(every, fwd), bwd_every=per_unit(every, bwd),
        fwd_first=per_unit(first, fwd), bwd_first=per_unit(first, bwd),
        fwd_head=per_unit(head, fwd), bwd_head=per_unit(head, bwd),
        head_blocks=frozenset({pp * group.vpp - 1}), head_logits=head_logits,
        logits_blocks=frozenset(head_stages(pp, group.vpp, vocab_parallel_pp=True)
                                if spread else ()))
    kv_alloc, kv_free = _runtime_kv_accumulators(
        group, rows, kv_bytes_per_token_per_layer(model, tp) * e / BF16)
    default = group_memory(group, model=model, dp=dp, training=training, ep=ep)
    return GroupMemory(
        fwd_alloc=per_unit(per_layer, fwd), bwd_free=per_unit(per_layer, bwd),
        kvgrad_alloc=kv_alloc, kvgrad_free=kv_free,
        fwd_offload=[0.0] * len(fwd), bwd_fetch=[0.0] * len(bwd),
        static_bytes=list(default.model_state_bytes),
        model_state_bytes=list(default.model_state_bytes),
        logits_bytes=[0.0] * pp, kv_share=0.0, block_extras=extras)


def _runtime_kv_accumulators(group: Group, tokens: dict[int, int], kv_per_token: float
                             ) -> tuple[list[float], list[float]]:
    """Per backward unit, the dK/dV accumulator bytes per layer it allocates at its start
    and releases at its end (:class:`GroupMemory`'s ``kvgrad_alloc``, ``kvgrad_free``), as
    the runtime keeps them: one per earlier *slice* (its whole K/V cache: its ``tokens``
    rows on this rank, ``kv_per_token`` each) that a backwarded slice's KV prefix reads,
    made by the first such backward and freed by that slice's own (the default walk keeps
    one per sequence, from its first backward unit to its last)."""
    holders: dict[int, list[tuple[int, int]]] = {}  # sequence -> (segment start, slice id)
    for sl in group.slices:
        for seg in sl.segments:
            holders.setdefault(seg.seq_id, []).append((seg.start, sl.slice_id))
    index = group._slice_index
    own_unit: dict[int, int] = {}
    nb = len(group.backward_units)
    alloc, free = [0.0] * nb, [0.0] * nb
    made: set[int] = set()
    for i, unit in enumerate(group.backward_units):
        for sid in unit.slice_ids:
            own_unit[sid] = i
            for seg in index[sid].segments:
                for start, earlier in holders[seg.seq_id]:
                    if start < seg.start and earlier not in made:
                        made.add(earlier)
                        alloc[i] += tokens[earlier] * kv_per_token
    for earlier in made:
        free[own_unit[earlier]] += tokens[earlier] * kv_per_token
    # The runtime makes a slice's accumulators after autograd has freed the graph of the
    # slice whose backward reads them, so they join the unit's net release at its end (the
    # walk checks the peak again after it) instead of its start.
    return [0.0] * nb, [f - a for f, a in zip(free, alloc, strict=True)]


def peak_bytes_by_stage(ops: list[list], memory: GroupMemory, layers: list[int], *,
                        head_joins: list[list[tuple[int, int]]] | None = None) -> list[float]:
    """Peak bytes per stage from the op order alone (no timing needed).

    Memory on a stage changes only at its own ops, in op-list order, so this walk gives the
    same peaks as the timed engine at a fraction of the cost; planners use it to check that
    a candidate fits before simulating it.

    A spread head's transient logits (``BlockExtras.head_logits``, runtime accounting only)
    are checked on the last stage right after its forward of the unit on the last block, and
    on every other stage where it joins the unit's head: ``head_joins`` per stage, (op index,
    forward unit), before that op (the runtime's ``RuntimePlan.head_joins``); None: right
    after the stage's forward of the unit on its last chunk (``sim.costs.head_stages``'s
    placement, the one the runtime tries first).
    """
    if memory.block_extras is None:  # the suite's GPU accounting: the walk over arrays
        return op_list_peaks(ops, memory, layers, start=memory.static_bytes,
                             with_activations=False)[0]
    pp = len(ops)
    peaks = []
    fwd_alloc, fwd_offload = memory.fwd_alloc, memory.fwd_offload
    bwd_fetch, bwd_free = memory.bwd_fetch, memory.bwd_free
    kv_alloc, kv_free = memory.kvgrad_alloc, memory.kvgrad_free
    extras = memory.block_extras
    spread = extras is not None and bool(extras.logits_blocks)
    for s, stage_ops in enumerate(ops):
        mem = memory.static_bytes[s]
        peak = mem
        joins: dict[int, list[int]] = {}
        placed = spread and head_joins is not None and s < pp - 1
        if placed:
            for index, unit in head_joins[s]:
                joins.setdefault(index, []).append(unit)
        for i, op in enumerate(stage_ops):
            for u in joins.get(i, ()):
                peak = max(peak, mem + extras.head_logits[u])
            block = op.chunk * pp + s
            n = layers[block]
            u = op.unit
            if op.kind == "F":
                mem += fwd_alloc[u] * n
                if extras is not None:
                    mem += extras.fwd(u, block)
                if mem > peak:
                    peak = mem
                if spread and not placed:
                    peak = max(peak, mem + extras.logits(u, block))
                mem -= fwd_offload[u] * n
            else:
                mem += (bwd_fetch[u] + kv_alloc[u]) * n
                if mem > peak:
                    peak = mem
                mem -= (kv_free[u] + bwd_free[u]) * n
                if extras is not None:
                    mem -= extras.bwd(u, block)
            if mem > peak:
                peak = mem
        for u in joins.get(len(stage_ops), ()):  # joins after the stage's last op
            peak = max(peak, mem + extras.head_logits[u])
        peaks.append(peak)
    return peaks


def op_list_peaks(ops: list[list], memory: GroupMemory, layers: list[int], *,
                  start: list[float] | None = None,
                  arrays: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
                  with_activations: bool = True) -> tuple[list[float], list[float]]:
    """Per stage, (peak of activations plus dK/dV buffers, peak of activations alone) of the
    walk over its op list from ``start`` bytes (None: 0, the timed engine's dynamic bytes);
    block extras are not counted (the suite's GPU accounting).

    The walk: each op adds two terms to its stage's running total (F: its activations, then
    minus what it offloads; B: what it fetches plus its dK/dV buffers, then minus what it
    frees; activations alone: B fetches, then frees), each computed as the op-by-op walk
    computes it, added to the running total in op order (compiled:
    :mod:`slimpack.sim.memory_walk`); the peak is the largest running total, checked after
    every term. Order-only: the timed engine's peaks are these. ``arrays``: each stage's
    :func:`op_arrays` when the caller has them; ``with_activations`` False: the second list
    is empty (planners read the first only). Raises ValueError for an op outside the group
    (:func:`~slimpack.schedules.ops.ops_in_range`)."""
    pp = len(ops)
    fetch = np.asarray(memory.bwd_fetch, dtype=np.float64)
    bwd_free = np.asarray(memory.bwd_free, dtype=np.float64)
    if arrays is None:
        arrays = [op_arrays(stage_ops) for stage_ops in ops]
    stage_first = np.zeros(pp + 1, dtype=np.int64)
    stage_first[1:] = np.cumsum([len(a[0]) for a in arrays])
    if not stage_first[-1]:
        base = [0.0 if start is None else float(start[s]) for s in range(pp)]
        return base, (list(base) if with_activations else [])
    is_fwd, unit, chunk = (np.concatenate([a[k] for a in arrays]) for k in range(3))
    counts = {"num_forward": len(memory.fwd_alloc), "num_backward": len(memory.bwd_free),
              "vpp": len(layers) // pp}
    if not ops_in_range(is_fwd, unit, chunk, **counts):
        raise ValueError("op_list_peaks: " + describe_op_ranges(unit, chunk, **counts))
    stage = np.repeat(np.arange(pp, dtype=np.int64), np.diff(stage_first))
    dynamic, activations = stage_peaks(
        stage_first, is_fwd, unit, np.asarray(layers, dtype=np.int64)[chunk * pp + stage],
        np.zeros(pp) if start is None else np.asarray(start, dtype=np.float64),
        np.asarray(memory.fwd_alloc, dtype=np.float64),
        np.asarray(memory.fwd_offload, dtype=np.float64),
        fetch + np.asarray(memory.kvgrad_alloc, dtype=np.float64),
        np.asarray(memory.kvgrad_free, dtype=np.float64) + bwd_free, fetch, bwd_free,
        with_activations)
    return dynamic.tolist(), (activations.tolist() if with_activations else [])


def peak_bytes_from_counts(counts: list[np.ndarray], memory: GroupMemory,
                           layers: list[int]) -> list[float]:
    """:func:`peak_bytes_by_stage` of a group without virtual stages, from its schedule as
    forward counts (:func:`slimpack.schedules.pipeline.stage_forward_counts`), without op
    lists: the same additions in the same order, so the same floats.

    Each op adds two terms to its stage's running total (F: its activations, then minus what
    it offloads; B: what it fetches plus its dK/dV buffers, then minus what it frees); the
    terms are laid out in op order after the static bytes and summed left to right
    (``cumsum`` accumulates sequentially), and the peak is the largest partial sum: the walk's
    running total at every point it checks, and after each forward that running total plus a
    spread head's transient logits (the walk's default placement).
    """
    fwd_alloc = np.asarray(memory.fwd_alloc, dtype=np.float64)
    fwd_offload = np.asarray(memory.fwd_offload, dtype=np.float64)
    bwd_alloc = (np.asarray(memory.bwd_fetch, dtype=np.float64)
                 + np.asarray(memory.kvgrad_alloc, dtype=np.float64))
    bwd_release = (np.asarray(memory.kvgrad_free, dtype=np.float64)
                   + np.asarray(memory.bwd_free, dtype=np.float64))
    nf, nb = len(fwd_alloc), len(bwd_alloc)
    forwards = np.arange(nf)
    backwards = np.arange(nb)
    peaks = []
    extras = memory.block_extras
    for s, stage_counts in enumerate(counts):
        n = layers[s]  # chunk 0 of stage s
        fwd_extra = bwd_extra = 0.0
        if extras is not None:  # virtual stage s is stage s (no virtual stages here)
            fwd_extra = np.asarray([extras.fwd(u, s) for u in range(nf)], dtype=np.float64)
            bwd_extra = np.asarray([extras.bwd(u, s) for u in range(nb)], dtype=np.float64)
        c = np.asarray(stage_counts, dtype=np.int64)
        # Op positions: forward i follows the backwards j with count(j) <= i; backward j
        # follows count(j) forwards and j backwards.
        f_pos = forwards + np.searchsorted(c, forwards, side="right")
        b_pos = c + backwards
        terms = np.empty(1 + 2 * (nf + nb))
        terms[0] = memory.static_bytes[s]
        terms[1 + 2 * f_pos] = fwd_alloc * n if extras is None else fwd_alloc * n + fwd_extra
        terms[2 + 2 * f_pos] = -(fwd_offload * n)
        terms[1 + 2 * b_pos] = bwd_alloc * n
        terms[2 + 2 * b_pos] = (-(bwd_release * n) if extras is None
                                else -(bwd_release * n + bwd_extra))
        sums = np.cumsum(terms)
        peak = float(sums.max())
        if extras is not None and s in extras.logits_blocks and nf:  # a spread head's logits
            held = sums[1 + 2 * f_pos] + np.asarray(extras.head_logits, dtype=np.float64)
            peak = max(peak, float(held.max()))
        peaks.append(peak)
    return peaks


def schedule_peak_bytes(group: Group, model: ModelSpec, dp: int,
                        training: TrainingSpec | None = None,
                        ops: list[list[Op]] | None = None, *,
                        accounting: ActivationAccounting = GPU_BF16,
                        ep: int = 1) -> list[float]:
    """Per-stage peak bytes of ``group`` under its own schedule (order-only walk, no timing):
    the same numbers the timed simulator reports for that group (under ``training``'s ZeRO
    stage, as the simulator takes it from a cost model that carries one). ``ops``: the
    group's :func:`build_schedule` op lists when the caller already built them;
    ``accounting``: whose saved activations (:func:`group_memory`)."""
    return peaks_and_schedule(group, model, dp, training, ops, accounting=accounting,
                              ep=ep)[0]


def peaks_and_schedule(group: Group, model: ModelSpec, dp: int,
                       training: TrainingSpec | None = None,
                       ops: list[list[Op]] | None = None, *,
                       accounting: ActivationAccounting = GPU_BF16, ep: int = 1
                       ) -> tuple[list[float], list[list[Op]] | None]:
    """:func:`schedule_peak_bytes` and the op lists it used: ``ops`` when given, those it
    had to build (virtual stages), or None: without virtual stages the peaks come from the
    schedule's forward counts (:func:`peak_bytes_from_counts`) and no op list is built."""
    memory = group_memory(group, model=model, dp=dp, training=training, accounting=accounting,
                          ep=ep)
    layers = group_layers(group, model.num_layers)
    if ops is None and group.vpp == 1:
        return peak_bytes_from_counts(stage_forward_counts(group), memory, layers), None
    if ops is None:
        ops = build_schedule(group)
    return peak_bytes_by_stage(ops, memory, layers), ops


def check_zero_stage(plan: Plan, training: TrainingSpec | None) -> None:
    """Refuse to price ``plan`` under a recipe of another ZeRO stage than the one it states
    (``Plan.zero_stage``; None states none). ``training`` None is the default recipe.

    Refused rather than one of them chosen: the planner sized the plan's memory and degrees
    for its stage, so pricing it under another would report a step nobody planned. Every
    planner states the stage of the cost model it was given, and the harness simulates a
    plan under that same cost model, so no existing record takes this path."""
    stage = (training or TrainingSpec()).zero_stage
    if plan.zero_stage is not None and plan.zero_stage != stage:
        raise PlanError(f"Plan.zero_stage={plan.zero_stage} but the cost model's "
                        f"TrainingSpec.zero_stage={stage}: simulate the plan under the recipe "
                        f"it was planned for")


def plan_peak_bytes(plan: Plan, model: ModelSpec, training: TrainingSpec | None = None,
                    schedules: Mapping[int, list[list[Op]]] | None = None) -> float:
    """The largest per-device peak over every group of every phase of ``plan``;
    ``schedules``: :func:`build_schedule`'s op lists of some groups (by group id), already
    built by the caller (the others are built here). Raises PlanError when ``training``'s
    ZeRO stage is not the plan's (:func:`check_zero_stage`)."""
    check_zero_stage(plan, training)
    schedules = schedules or {}
    return max(max(schedule_peak_bytes(g, model, plan.parallel.dp, training,
                                       schedules.get(g.group_id), ep=plan.parallel.ep))
               for g in plan.groups())


def plan_fits_memory(plan: Plan, model: ModelSpec, hardware: HardwareSpec,
                     training: TrainingSpec | None = None,
                     schedules: Mapping[int, list[list[Op]]] | None = None) -> bool:
    """The one memory check: True exactly when :func:`slimpack.sim.simulate` reports no OOM.

    Planners call this on their finished plan, so a plan's ``memory_fits`` and the
    simulator's verdict are the same function of the same op order (``schedules`` as in
    :func:`plan_peak_bytes`).
    """
    return plan_peak_bytes(plan, model, training, schedules) <= hardware.usable_memory_bytes
