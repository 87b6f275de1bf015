"""The plan IR: what every planner emits and what the simulator and the runtime consume.

Vocabulary (docs/architecture.md, plan IR):

* ``Segment``  a contiguous token range ``[start, end)`` of one sequence; ``start`` is also its
  KV prefix (the tokens of the same sequence before it, whose keys/values it attends to).
* ``Slice``    one or more segments packed into one token buffer; the atomic unit of compute
  with its own autograd graph.
* ``Unit``     a MicroPack: an ordered set of slices executed as one pipeline step.
* ``Group``    a set of devices running one pipeline over some slices, with its own degrees,
  its ordered forward units and its ordered backward units (two partitions of the same
  slices; identical for every classic method).
* ``Phase``    groups that run at the same time on disjoint devices.
* ``Plan``     phases run one after another, then data-parallel gradient synchronisation.

Order rules that ``Plan.validate`` enforces on every group (the pipeline runs the same order
on every stage): a sequence's segments are forwarded in increasing ``start`` order and
backwarded in decreasing ``start`` order, because a slice's backward needs dK/dV from every
later slice of its sequence.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain, compress, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Literal

from slimpack.jsonio import atomic_write_text, check_output_path, strict_json
from slimpack.specs.parallel import ParallelSpec
from slimpack.specs.recompute import RECOMPUTE_MODES, recompute_layers_problem
from slimpack.specs.training import ZERO_STAGES

SCHEDULES = ("gpipe", "1f1b", "interleaved", "slimpipe", "asymmetric")
ScheduleKind = Literal["gpipe", "1f1b", "interleaved", "slimpipe", "asymmetric"]
CP_SHARDINGS = ("per-sequence", "per-document")
CP_KINDS = ("ring", "ulysses")


class PlanError(ValueError):
    """A plan that breaks an IR rule; the message names the group, unit, slice or sequence."""


# Segment, Slice and Unit write their own __init__ (dataclass(init=False)): plans hold ~10^5
# of them, and the generated frozen __init__ plus a __post_init__ call cost twice as much
# as checking the arguments first and setting the slots once.
_set = object.__setattr__


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class Segment:
    seq_id: int
    start: int
    """First token (inclusive); equals the KV prefix length."""
    end: int
    """One past the last token."""

    def __init__(self, *, seq_id: int, start: int, end: int) -> None:
        if seq_id < 0 or start < 0 or end <= start:
            if seq_id < 0:
                raise PlanError(f"Segment.seq_id must be >= 0, got {seq_id}")
            raise PlanError(
                f"Segment of seq {seq_id} needs 0 <= start < end, got [{start}, {end})"
            )
        _set(self, "seq_id", seq_id)
        _set(self, "start", start)
        _set(self, "end", end)

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    @property
    def kv_prefix_tokens(self) -> int:
        return self.start


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class Slice:
    slice_id: int
    segments: tuple[Segment, ...]

    def __init__(self, *, slice_id: int, segments: tuple[Segment, ...]) -> None:
        if not segments:
            raise PlanError(f"Slice {slice_id} has no segments")
        if len(segments) > 1 and len({seg.seq_id for seg in segments}) < len(segments):
            seen = set()
            for seg in segments:
                if seg.seq_id in seen:
                    raise PlanError(
                        f"Slice {slice_id} holds two segments of seq {seg.seq_id}; "
                        f"merge them into one segment"
                    )
                seen.add(seg.seq_id)
        _set(self, "slice_id", slice_id)
        _set(self, "segments", segments)

    @property
    def num_tokens(self) -> int:
        tokens = 0
        for seg in self.segments:
            tokens += seg.end - seg.start
        return tokens

    @property
    def seq_ids(self) -> tuple[int, ...]:
        return tuple(s.seq_id for s in self.segments)


@dataclass(frozen=True, kw_only=True, slots=True, init=False)
class Unit:
    """A MicroPack: slices run together in one pipeline step, in this order."""

    slice_ids: tuple[int, ...]

    def __init__(self, *, slice_ids: tuple[int, ...]) -> None:
        if not slice_ids:
            raise PlanError("Unit has no slices")
        if len(slice_ids) > 1 and len(set(slice_ids)) != len(slice_ids):
            raise PlanError(f"Unit lists a slice twice: {slice_ids}")
        _set(self, "slice_ids", slice_ids)


TILE = 128
"""SlimPipe's redistribution ships KV in whole FlashAttention tiles of this many tokens."""


def shipped_tokens(prefix: int, fraction: float) -> int:
    """KV tokens of a ``prefix``-token KV prefix that ship when ``fraction`` of it moves: whole
    tiles, at most the prefix (the one rule the simulator's pricing and the runtime share)."""
    return min(prefix, round(fraction * prefix / TILE) * TILE)


@dataclass(frozen=True, kw_only=True, slots=True)
class Move:
    """One pair of concurrent ops of a group that exchange attention (SlimPipe's
    redistribution, arXiv 2504.14519), as plain data: the planner chooses it
    (``slimpack.sim.redistribution.priced_moves``), the simulator prices it, the runtime
    executes it (``slimpack.runtime.redistribution``)."""

    backward: bool
    """A pair of backward ops (else forward ops)."""
    tick: int
    """The two ops' start tick (``slimpack.sim.redistribution.schedule_ticks``)."""
    heavy_block: int
    """Virtual stage (``chunk * pp + stage``) of the op that ships work."""
    heavy_unit: int
    """Its unit (an index of the group's forward or backward units, as ``backward`` says)."""
    light_block: int
    light_unit: int
    fraction: float
    """Share of each segment's KV prefix shipped (:func:`shipped_tokens` per segment)."""

    def shipped(self, group: Group) -> tuple[tuple[int, int, int], ...]:
        """(slice id, segment index, KV tokens shipped: the first ones of its prefix) of every
        segment of the heavy unit that ships some (cp = 1: a segment is one piece)."""
        units = group.backward_units if self.backward else group.forward_units
        out = []
        for sid in units[self.heavy_unit].slice_ids:
            for j, seg in enumerate(group.slice(sid).segments):
                d = shipped_tokens(seg.start, self.fraction)
                if d > 0:
                    out.append((sid, j, d))
        return tuple(out)

    def to_list(self) -> list[Any]:
        """``[backward, tick, heavy_block, heavy_unit, light_block, light_unit, fraction]``:
        plans hold hundreds of moves, so they are written as compact lists."""
        return [self.backward, self.tick, self.heavy_block, self.heavy_unit, self.light_block,
                self.light_unit, self.fraction]


MOVE_FIELDS = ("backward", "tick", "heavy_block", "heavy_unit", "light_block", "light_unit",
               "fraction")
"""The order of a move's entries in the plan JSON (:meth:`Move.to_list`)."""


@dataclass(frozen=True, kw_only=True)
class Group:
    """One pipeline over ``ranks`` (tp*cp*pp devices) and the slices it trains."""

    group_id: int
    ranks: tuple[int, ...]
    """Global ranks, ordered (pp, cp, tp) with tp fastest: stage s owns ranks[s*cp*tp:(s+1)*cp*tp]."""
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int = 1
    slices: tuple[Slice, ...]
    forward_units: tuple[Unit, ...]
    backward_units: tuple[Unit, ...]
    schedule: ScheduleKind = "1f1b"
    cp_sharding: Literal["per-sequence", "per-document"] = "per-sequence"
    cp_kind: Literal["ring", "ulysses"] = "ring"
    recompute: Literal["none", "selective", "full"] = "none"
    recompute_layers: int | None = None
    """With ``recompute="full"``: recompute only the first this many layers of each virtual
    stage and keep the others' activations (Megatron-Core's ``recompute_method="block"``,
    ``recompute_num_layers``); None: every layer. A virtual stage with fewer layers
    recomputes all of them."""
    virtual_stage_layers: tuple[int, ...] | None = None
    """Decoder layers of each virtual stage (``chunk*pp + stage``), set where the plan's
    ``ParallelSpec.pipeline_split`` is not even; None: the layers split evenly."""
    offload: float = 0.0
    """Share of each slice's activations (its K,V cache excluded: later slices read it) copied
    to host memory after its forward and back before its backward, over the host link."""
    vocab_parallel_pp: bool = False
    """LM head and loss spread over pipeline ranks (SlimPipe) instead of on the last stage."""
    attention_moves: tuple[Move, ...] | None = None
    """SlimPipe's attention redistribution: the pairs of concurrent ops that exchange attention
    and the share of KV prefix each ships, chosen at plan time under the planner's cost model
    (only with ``Plan.attention_redistribution``, at pp > 1). ``()``: chosen, none pays off;
    None: not chosen (a format-3 plan): the simulator chooses them under the cost model it is
    given, the runtime refuses the plan."""
    _slice_index: dict[int, Slice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "vpp"):
            if getattr(self, name) < 1:
                raise PlanError(f"Group {self.group_id}: {name} must be >= 1")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"Group {self.group_id}: schedule {self.schedule!r} not in {SCHEDULES}")
        if self.cp_sharding not in CP_SHARDINGS:
            raise PlanError(
                f"Group {self.group_id}: cp_sharding {self.cp_sharding!r} not in {CP_SHARDINGS}"
            )
        if self.cp_kind not in CP_KINDS:
            raise PlanError(f"Group {self.group_id}: cp_kind {self.cp_kind!r} not in {CP_KINDS}")
        if self.recompute not in RECOMPUTE_MODES:
            raise PlanError(
                f"Group {self.group_id}: recompute {self.recompute!r} not in {RECOMPUTE_MODES}"
            )
        if self.virtual_stage_layers is not None:
            counts = self.virtual_stage_layers
            if not isinstance(counts, tuple) or len(counts) != self.pp * self.vpp or any(
                    isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
                raise PlanError(f"Group {self.group_id}: virtual_stage_layers must be pp*vpp = "
                                f"{self.pp * self.vpp} integers >= 1 or null, got {counts!r}")
        problem = recompute_layers_problem(self.recompute_layers, self.recompute)
        if problem:
            raise PlanError(f"Group {self.group_id}: {problem}")
        if self.recompute_layers is not None and self.offload:
            raise PlanError(f"Group {self.group_id}: recompute_layers with offload > 0 is "
                            f"not modelled (offload must be 0, got {self.offload!r})")
        if isinstance(self.offload, bool) or not isinstance(self.offload, int | float) \
                or not 0.0 <= self.offload <= 1.0:
            raise PlanError(f"Group {self.group_id}: offload must be a number in [0, 1], "
                            f"got {self.offload!r}")
        index: dict[int, Slice] = {}
        for sl in self.slices:
            if sl.slice_id in index:
                raise PlanError(f"Group {self.group_id}: slice id {sl.slice_id} used twice")
            index[sl.slice_id] = sl
        object.__setattr__(self, "_slice_index", index)

    @property
    def num_devices(self) -> int:
        return self.tp * self.cp * self.pp

    def slice(self, slice_id: int) -> Slice:
        try:
            return self._slice_index[slice_id]
        except KeyError:
            raise PlanError(f"Group {self.group_id}: no slice with id {slice_id}") from None

    def unit_slices(self, unit: Unit) -> list[Slice]:
        return [self.slice(i) for i in unit.slice_ids]

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        width = self.tp * self.cp
        return self.ranks[stage * width:(stage + 1) * width]

    @property
    def is_asymmetric(self) -> bool:
        """True when forward and backward units are different partitions of the slices
        (order aside: classic schedules run the same units backward, often in reverse)."""
        def partition(units: tuple[Unit, ...]) -> set[frozenset[int]]:
            return {frozenset(u.slice_ids) for u in units}
        return partition(self.forward_units) != partition(self.backward_units)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.slices)

    def validate(self) -> None:
        """Check units against slices and the causal order rules; raise PlanError."""
        gid = self.group_id
        if len(self.ranks) != self.num_devices:
            raise PlanError(
                f"Group {gid}: tp*cp*pp = {self.tp}*{self.cp}*{self.pp} = {self.num_devices} "
                f"but it lists {len(self.ranks)} ranks"
            )
        if len(set(self.ranks)) != len(self.ranks):
            raise PlanError(f"Group {gid}: a rank is listed twice")
        if not self.forward_units:
            raise PlanError(f"Group {gid}: no forward units")
        all_ids = set(self._slice_index)
        orders = {}  # kind -> its units' slice ids in run order (checked below, then reused)
        for kind, units in (("forward", self.forward_units), ("backward", self.backward_units)):
            covered: list[int] = list(chain.from_iterable(map(_SLICE_IDS, units)))
            orders[kind] = covered
            covered_set = set(covered)
            unknown = covered_set - all_ids
            if unknown:
                raise PlanError(f"Group {gid}: {kind} units refer to missing slices {sorted(unknown)}")
            if len(covered) != len(covered_set):
                dup = sorted({i for i in covered if covered.count(i) > 1})
                raise PlanError(f"Group {gid}: {kind} units run slices {dup} more than once")
            if covered_set != all_ids:
                raise PlanError(
                    f"Group {gid}: forward and backward units must each partition the group's "
                    f"slices; {kind} units miss slices {sorted(all_ids - set(covered))}"
                )
        self._check_order(orders["forward"], increasing=True, kind="forward")
        self._check_order(orders["backward"], increasing=False, kind="backward")
        if self.attention_moves is not None:
            self._check_moves(self.attention_moves)

    def _check_moves(self, moves: tuple[Move, ...]) -> None:
        """Every move names two distinct ops of this group, ships a share in (0, 1], and no op
        takes part in two moves (an op runs at one tick, so a unit at most once per tick)."""
        where = f"Group {self.group_id}: attention_moves"
        if self.pp < 2:
            raise PlanError(f"{where} needs pp > 1 (ops of one stage never run side by side); "
                            f"group has pp={self.pp}")
        blocks = self.pp * self.vpp
        used: set[tuple[bool, int, int]] = set()
        for i, m in enumerate(moves):
            if not isinstance(m, Move):
                raise PlanError(f"{where}[{i}] must be a Move, got {type(m).__name__}")
            units = len(self.backward_units if m.backward else self.forward_units)
            for name, value, bound in (("heavy_block", m.heavy_block, blocks),
                                       ("light_block", m.light_block, blocks),
                                       ("heavy_unit", m.heavy_unit, units),
                                       ("light_unit", m.light_unit, units)):
                if not 0 <= value < bound:
                    raise PlanError(f"{where}[{i}].{name} = {value} is outside [0, {bound})")
            if m.tick < 0:
                raise PlanError(f"{where}[{i}].tick must be >= 0, got {m.tick}")
            if not 0.0 < m.fraction <= 1.0:
                raise PlanError(f"{where}[{i}].fraction must be in (0, 1], got {m.fraction!r}")
            if m.heavy_block % self.pp == m.light_block % self.pp:
                raise PlanError(f"{where}[{i}] pairs two ops of pipeline stage "
                                f"{m.heavy_block % self.pp}; a move pairs two stages")
            for block, unit in ((m.heavy_block, m.heavy_unit), (m.light_block, m.light_unit)):
                op = (m.backward, block, unit)
                if op in used:
                    kind = "backward" if m.backward else "forward"
                    raise PlanError(f"{where}[{i}]: the {kind} op of unit {unit} on block "
                                    f"{block} is already in another move")
                used.add(op)

    def _check_order(self, order: list[int], *, increasing: bool, kind: str) -> None:
        index = self._slice_index  # every id was checked by validate() before this runs
        segments = _segments_of(map(index.__getitem__, order))
        if not _starts_monotone(_segments_of_cut_sequences(segments), increasing):
            self._raise_order_error(order, increasing=increasing, kind=kind)

    def _raise_order_error(self, order: list[int], *, increasing: bool, kind: str) -> None:
        """Raise on the first segment (slice by slice along ``order``) out of order: the
        walk that names the slice, run once the fast check has found a break."""
        last_start: dict[int, int] = {}
        index = self._slice_index
        for sid in order:
            for seg in index[sid].segments:
                prev = last_start.get(seg.seq_id)
                if prev is not None and (seg.start < prev if increasing else seg.start > prev):
                    rule = "in order (increasing start)" if increasing else "in reverse order"
                    raise PlanError(
                        f"Group {self.group_id}: seq {seg.seq_id} is {kind}ed out of order at "
                        f"slice {sid} (segment start {seg.start} after {prev}); its segments "
                        f"must be {kind}ed {rule}"
                    )
                last_start[seg.seq_id] = seg.start
        raise AssertionError("the fast order check and the walk disagree")


@dataclass(frozen=True, kw_only=True)
class Phase:
    groups: tuple[Group, ...]


@dataclass(frozen=True, kw_only=True)
class DocumentMap:
    """Which documents of the batch a plan's sequences hold, for planners whose sequences are
    not the batch's documents: the MFU numerator's input (:meth:`Plan.document_lengths`), so
    every method of a batch is credited the same useful work."""

    pieces: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Sequence id -> (document id, offset): a piece of a document cut at a fixed length
    (Megatron-LM's GPTDataset, naive packing, SlimPipe)."""
    samples: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """Sequence id -> ((document id, tokens), ...): documents run as one causal sequence
    without document masks (``megatron-causal``)."""

    def __post_init__(self) -> None:
        both = set(self.pieces) & set(self.samples)
        if both:
            raise PlanError(f"DocumentMap: sequence {min(both)} is both a piece and a sample")

    def to_dict(self) -> dict[str, Any]:
        return {"pieces": {str(k): list(v) for k, v in sorted(self.pieces.items())},
                "samples": {str(k): [list(d) for d in v] for k, v in sorted(self.samples.items())}}

    @classmethod
    def from_dict(cls, data: Any, where: str = "documents") -> DocumentMap:
        obj = _expect(data, dict, where)
        unknown = sorted(set(obj) - {"pieces", "samples"})
        if unknown:
            raise PlanError(f"Plan JSON: {where} has unknown keys {unknown}; allowed: pieces, "
                            f"samples")

        def pairs(value: Any, at: str) -> tuple[int, int]:
            pair = _expect(value, list, at)
            if len(pair) != 2:
                raise PlanError(f"Plan JSON: {at} must be a pair of integers, got {pair!r}")
            return (_expect(pair[0], int, f"{at}[0]"), _expect(pair[1], int, f"{at}[1]"))

        def seq_id(key: str, at: str) -> int:
            try:
                return int(key)
            except ValueError:
                raise PlanError(f"Plan JSON: {at} keys must be integer seq ids, "
                                f"got {key!r}") from None

        pieces = {seq_id(k, f"{where}.pieces"): pairs(v, f"{where}.pieces[{k!r}]")
                  for k, v in _get(obj, "pieces", dict, where, default={}).items()}
        samples = {seq_id(k, f"{where}.samples"): tuple(
                       pairs(d, f"{where}.samples[{k!r}][{i}]")
                       for i, d in enumerate(_expect(v, list, f"{where}.samples[{k!r}]")))
                   for k, v in _get(obj, "samples", dict, where, default={}).items()}
        return cls(pieces=pieces, samples=samples)


PLAN_FORMATS = ("slimpack-plan/1", "slimpack-plan/2", "slimpack-plan/3", "slimpack-plan/4")
"""Formats :meth:`Plan.from_dict` reads; plans are written in the last. Format 1 plans (no
typed ``documents``, ``memory_fits``, ``attention_redistribution``) and format 2 plans (no
typed ``zero_stage``) read with those fields lifted from ``metadata``, or their defaults.
Plans before format 4 carry no ``Group.attention_moves`` (read as None: not chosen)."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A whole training step: phases in order, then DP gradient synchronisation."""

    method: str
    parallel: ParallelSpec
    """The cluster's base layout; its world size is the plan's world size."""
    sequence_lengths: dict[int, int]
    """Every sequence this step trains: seq_id -> length in tokens."""
    phases: tuple[Phase, ...]
    model: str = ""
    """Model preset name (informational; the runtime and simulator are given a ModelSpec)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Planner extras for people (plan time, chosen options, search log...). JSON-serialisable.
    Nothing here changes a simulated or executed result: what does is a typed field."""
    documents: DocumentMap = field(default_factory=DocumentMap)
    """The batch's documents behind the sequences (see :class:`DocumentMap`)."""
    memory_fits: bool | None = None
    """The planner's memory verdict: the simulator's memory walk of this plan under the
    training recipe it was planned for (``slimpack plan --strict`` exits 1 on False); None
    when the planner did not check."""
    attention_redistribution: bool = False
    """SlimPipe's attention redistribution (arXiv 2504.14519): attention work of a pipeline's
    slices moves between its ranks to even out the causal imbalance; which ops pair and how
    much KV ships is each group's ``attention_moves``."""
    zero_stage: int | None = None
    """The ZeRO stage of the training recipe the plan was made for (``TrainingSpec.zero_stage``:
    0, 1 or 3): the simulator refuses a cost model of another stage, the runtime executes it
    (3: parameters sharded over the data-parallel ranks). None: a hand-built plan that states
    none (the simulator then charges its cost model's stage; the runtime runs it as 0)."""

    def __post_init__(self) -> None:
        if not isinstance(self.documents, DocumentMap):
            raise PlanError(f"Plan.documents must be a DocumentMap, got "
                            f"{type(self.documents).__name__}")
        if self.memory_fits is not None and not isinstance(self.memory_fits, bool):
            raise PlanError(f"Plan.memory_fits must be true, false or null, got "
                            f"{self.memory_fits!r}")
        if not isinstance(self.attention_redistribution, bool):
            raise PlanError(f"Plan.attention_redistribution must be true or false, got "
                            f"{self.attention_redistribution!r}")
        if self.zero_stage is not None and (isinstance(self.zero_stage, bool)
                                            or self.zero_stage not in ZERO_STAGES):
            raise PlanError(f"Plan.zero_stage must be null or one of {list(ZERO_STAGES)}, got "
                            f"{self.zero_stage!r}")
        if "zero_stage" in self.metadata:
            # Before format 3 FlexSP wrote its stage here; a stage in metadata is read by
            # nothing, so it is refused rather than left to disagree with the field.
            raise PlanError(f"Plan.metadata['zero_stage'] is not read "
                            f"(got {self.metadata['zero_stage']!r}); state it in "
                            f"Plan.zero_stage")

    @property
    def world_size(self) -> int:
        return self.parallel.world

    def _check_layer_split(self, group: Group) -> None:
        """A group at the plan's pp and vpp splits its layers as ``parallel.pipeline_split``
        says (the simulator and the data-parallel sync read the group's split and the plan's
        the same); a group at another layout only evenly (an uneven split is not modelled
        there)."""
        par = self.parallel
        same = (group.pp, group.vpp) == (par.pp, par.vpp)
        if par.pipeline_split == "even" or not same:
            if group.virtual_stage_layers is not None:
                raise PlanError(f"Group {group.group_id}: virtual_stage_layers given but the "
                                f"plan's pipeline_split is {par.pipeline_split!r}"
                                + ("" if same else " at its own pp and vpp"))
            return
        counts = group.virtual_stage_layers
        try:
            want = None if counts is None else par.virtual_stage_layers(sum(counts))
        except ValueError:  # no split of that many layers follows the rule
            want = None
        if counts is None or counts != want:
            raise PlanError(f"Group {group.group_id}: virtual_stage_layers {counts!r} do not "
                            f"follow the plan's pipeline_split {par.pipeline_split!r}"
                            + ("" if want is None else f" ({list(want)})"))

    def with_attention_redistribution(self, on: bool) -> Plan:
        """This plan with redistribution switched ``on`` or off, every group's
        ``attention_moves`` cleared (None): moves are chosen for one setting, so a plan that
        turns it on has them chosen again (``slimpack.sim.redistribution``), one that turns it
        off holds none."""
        phases = tuple(Phase(groups=tuple(replace(g, attention_moves=None) for g in ph.groups))
                       for ph in self.phases)
        return replace(self, attention_redistribution=on, phases=phases)

    def groups(self) -> Iterator[Group]:
        for phase in self.phases:
            yield from phase.groups

    @property
    def num_tokens(self) -> int:
        return sum(self.sequence_lengths.values())

    def document_lengths(self) -> dict[int, int]:
        """The batch's documents (id -> tokens) this step trains, whatever the planner made of
        them: the MFU numerator's input, so every method of a batch has the same one.

        Planners that cut documents give each piece a fresh id (``documents.pieces``);
        planners that run several documents as one causal sequence (``megatron-causal``)
        list them (``documents.samples``). Both are folded back here; any other sequence is
        its own document.
        """
        pieces, samples = self.documents.pieces, self.documents.samples
        out: dict[int, int] = {}
        for seq_id, length in self.sequence_lengths.items():
            held = samples.get(seq_id)
            if held is not None:
                for doc, tokens in held:
                    out[doc] = out.get(doc, 0) + tokens
                continue
            piece = pieces.get(seq_id)
            doc = piece[0] if piece is not None else seq_id
            out[doc] = out.get(doc, 0) + length
        return out

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> Plan:
        """Raise PlanError on any broken rule; return self so calls can chain."""
        world = self.parallel.world
        if self.parallel.world_size is not None and self.parallel.world_size != world:
            raise PlanError(f"Plan: degrees multiply to {world}, world_size says "
                            f"{self.parallel.world_size}")
        if not self.phases:
            raise PlanError("Plan has no phases")
        owner: dict[int, int] = {}  # seq_id -> group_id: a sequence lives in one group only
        # Every segment of the plan (and its sequence), group by group: the per-segment work
        # runs in C (~10^5 segments at paper scale); a rule broken sends validation down the
        # segment-by-segment walk that names the first offender.
        all_segments: list[Segment] = []
        all_seq_ids: list[int] = []
        group_ids: set[int] = set()
        for p_idx, phase in enumerate(self.phases):
            if not phase.groups:
                raise PlanError(f"Plan: phase {p_idx} has no groups")
            used: set[int] = set()
            for group in phase.groups:
                if group.group_id in group_ids:
                    raise PlanError(f"Plan: group id {group.group_id} used twice")
                group_ids.add(group.group_id)
                group.validate()
                if group.attention_moves and not self.attention_redistribution:
                    raise PlanError(f"Group {group.group_id}: attention_moves given but "
                                    f"Plan.attention_redistribution is false")
                self._check_layer_split(group)
                for name in ("recompute_layers", "virtual_stage_layers"):
                    if getattr(group, name) is not None and self.attention_redistribution \
                            and group.pp > 1:
                        # The moves are priced (and executed) for equal layers per block
                        # under one recompute mode.
                        raise PlanError(f"Group {group.group_id}: {name} with "
                                        f"Plan.attention_redistribution at pp > 1 is not "
                                        f"modelled")
                bad = [r for r in group.ranks if not 0 <= r < world]
                if bad:
                    raise PlanError(
                        f"Group {group.group_id}: ranks {bad} outside the world of {world} "
                        f"devices ({self.parallel.describe()})"
                    )
                clash = used.intersection(group.ranks)
                if clash:
                    raise PlanError(
                        f"Plan: phase {p_idx} runs ranks {sorted(clash)[:8]} in two groups at once"
                    )
                used.update(group.ranks)
                segments = _segments_of(group.slices)
                seq_ids = list(map(_SEQ_ID, segments))
                if not _owns_new_known_sequences(seq_ids, self.sequence_lengths, owner):
                    self._raise_ownership_error(group, owner)
                owner.update(zip(seq_ids, repeat(group.group_id)))
                all_segments.extend(segments)
                all_seq_ids.extend(seq_ids)
        self._check_coverage(all_segments, all_seq_ids)
        return self

    def _raise_ownership_error(self, group: Group, owner: dict[int, int]) -> None:
        """Raise on the first segment of ``group`` (slice by slice) whose sequence is unknown
        or lives in an earlier group (``owner``: seq_id -> group id, groups before this)."""
        gid = group.group_id
        lengths = self.sequence_lengths
        seen = dict(owner)
        for sl in group.slices:
            for seg in sl.segments:
                seq = seg.seq_id
                if seq not in lengths:
                    raise PlanError(f"Group {gid}: slice {sl.slice_id} holds unknown seq {seq}")
                prev = seen.setdefault(seq, gid)
                if prev != gid:
                    raise PlanError(
                        f"Plan: seq {seq} is split across groups {prev} and "
                        f"{gid}; its KV history must stay in one group"
                    )
        raise AssertionError("the fast ownership check and the walk disagree")

    def _check_coverage(self, segments: list[Segment], seq_ids: list[int]) -> None:
        """Each sequence's segments cover its tokens exactly once."""
        counts = Counter(seq_ids)
        # seq_id -> its last segment: its only one where it has one
        only_segment = dict(zip(seq_ids, segments, strict=True))
        repeated = {seq for seq, n in counts.items() if n > 1}
        ranges_of: dict[int, list[tuple[int, int]]] = {}
        for seg in compress(segments, map(repeated.__contains__, seq_ids)):
            ranges_of.setdefault(seg.seq_id, []).append((seg.start, seg.end))
        for seq_id, length in self.sequence_lengths.items():
            seg = only_segment.get(seq_id)
            if seg is None:
                raise PlanError(f"Plan: seq {seq_id} ({length} tokens) is never covered")
            if seq_id not in repeated:
                if seg.start == 0 and seg.end == length:
                    continue  # one segment, the whole sequence (most documents)
                ranges = [(seg.start, seg.end)]
            else:
                ranges = sorted(ranges_of[seq_id])
            _check_ranges(seq_id, length, ranges)

    # -- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMATS[-1],
            "method": self.method,
            "model": self.model,
            "parallel": self.parallel.to_dict(),
            "sequence_lengths": {str(k): v for k, v in sorted(self.sequence_lengths.items())},
            "phases": [{"groups": [_group_to_dict(g) for g in ph.groups]} for ph in self.phases],
            "documents": self.documents.to_dict(),
            "memory_fits": self.memory_fits,
            "attention_redistribution": self.attention_redistribution,
            "zero_stage": self.zero_stage,
            "metadata": self.metadata,
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """Strict JSON: a non-finite float in ``metadata`` (e.g. ``estimated_seconds`` of a
        planner that fell back) is written as ``null``, never as a bare ``NaN``."""
        return strict_json(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file in the same directory, then ``os.replace``), so an
        interrupted or failed save never leaves half a plan, or a temp file, behind."""
        check_output_path("plan file", path)
        atomic_write_text(path, self.to_json(indent=1))

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Parse a plan with a type check on every field: a wrong type is a PlanError naming
        the field (``phases[0].groups[1].pp``), never a TypeError from deep inside."""
        obj = _expect(data, dict, "top level")
        fmt = obj.get("format")
        if fmt not in PLAN_FORMATS:
            raise PlanError(f"Plan JSON: format must be one of {list(PLAN_FORMATS)}, got {fmt!r}")
        parallel = _get(obj, "parallel", dict, "")
        for key, value in parallel.items():
            _expect(value, str if key == "pipeline_split" else int, f"parallel.{key}")
        try:
            spec = ParallelSpec.from_dict(parallel)
        except ValueError as exc:
            raise PlanError(f"Plan JSON: parallel: {exc}") from None
        lengths: dict[int, int] = {}
        for key, value in _get(obj, "sequence_lengths", dict, "").items():
            try:
                seq_id = int(key)
            except ValueError:
                raise PlanError(f"Plan JSON: sequence_lengths keys must be integer seq ids, "
                                f"got {key!r}") from None
            lengths[seq_id] = _expect(value, int, f"sequence_lengths[{key!r}]")
        phases = []
        for p_idx, ph in enumerate(_get(obj, "phases", list, "")):
            where = f"phases[{p_idx}]"
            groups = _get(_expect(ph, dict, where), "groups", list, where)
            phases.append(Phase(groups=tuple(
                _group_from_dict(_expect(g, dict, f"{where}.groups[{g_idx}]"),
                                 f"{where}.groups[{g_idx}]")
                for g_idx, g in enumerate(groups))))
        metadata = _get(obj, "metadata", dict, "", default={})
        if fmt == "slimpack-plan/1":
            obj = _lift_format_1(obj, metadata)
        if fmt in ("slimpack-plan/1", "slimpack-plan/2"):
            obj = _lift_format_2(obj, metadata)
        return cls(
            method=_get(obj, "method", str, ""),
            model=_get(obj, "model", str, "", default=""),
            parallel=spec,
            sequence_lengths=lengths,
            phases=tuple(phases),
            metadata=metadata,
            documents=DocumentMap.from_dict(obj.get("documents", {})),
            memory_fits=_optional_bool(obj, "memory_fits"),
            attention_redistribution=_get(obj, "attention_redistribution", bool, "",
                                          default=False),
            zero_stage=_optional_zero_stage(obj),
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        path = Path(path)
        if not path.is_file():
            raise PlanError(f"plan file {str(path)!r} does not exist")
        try:
            return cls.from_json(path.read_text())
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan file {str(path)!r} is not valid JSON: {exc}") from None


# Validation runs on every plan (~10^5 segments at paper scale): these keep its per-segment
# work in C (map, chain, Counter, compress).
_SEGMENTS = attrgetter("segments")
_SEQ_ID = attrgetter("seq_id")
_SLICE_IDS = attrgetter("slice_ids")


def _segments_of(slices: Iterable[Slice]) -> list[Segment]:
    """Every segment of ``slices``, in order."""
    return list(chain.from_iterable(map(_SEGMENTS, slices)))


def _segments_of_cut_sequences(segments: list[Segment]) -> Iterable[Segment]:
    """The segments (in order) of sequences with more than one segment among ``segments``:
    a sequence with one segment cannot be out of order."""
    seq_ids = list(map(_SEQ_ID, segments))
    counts = Counter(seq_ids)
    if len(counts) == len(seq_ids):
        return ()
    cut = {seq for seq, n in counts.items() if n > 1}
    return compress(segments, map(cut.__contains__, seq_ids))


def _starts_monotone(segments: Iterable[Segment], increasing: bool) -> bool:
    """True when along ``segments`` each sequence's segment starts never decrease
    (``increasing``) or never increase: the rule :meth:`Group._raise_order_error` names the
    breaker of."""
    last_start: dict[int, int] = {}
    for seg in segments:
        prev = last_start.get(seg.seq_id)
        if prev is not None and (seg.start < prev if increasing else seg.start > prev):
            return False
        last_start[seg.seq_id] = seg.start
    return True


def _owns_new_known_sequences(seq_ids: list[int], lengths: dict[int, int],
                              owner: dict[int, int]) -> bool:
    """True when every sequence in ``seq_ids`` is in ``lengths`` and in no earlier group
    (``owner``): the rules :meth:`Plan._raise_ownership_error` names the breaker of."""
    return lengths.keys() >= set(seq_ids) and owner.keys().isdisjoint(seq_ids)


def _check_ranges(seq_id: int, length: int, ranges: list[tuple[int, int]]) -> None:
    """``ranges`` (sorted) cover ``[0, length)`` of ``seq_id`` once, with no gap."""
    pos = 0
    for start, end in ranges:
        if start < pos:
            raise PlanError(f"Plan: seq {seq_id} tokens [{start}, {min(end, pos)}) are "
                            f"covered twice")
        if start > pos:
            raise PlanError(f"Plan: seq {seq_id} tokens [{pos}, {start}) are never covered")
        pos = end
    if pos != length:
        if pos < length:
            raise PlanError(f"Plan: seq {seq_id} tokens [{pos}, {length}) are never covered")
        raise PlanError(f"Plan: seq {seq_id} has {length} tokens but segments reach {pos}")


def _group_to_dict(g: Group) -> dict[str, Any]:
    return {
        "group_id": g.group_id,
        "ranks": list(g.ranks),
        "tp": g.tp, "cp": g.cp, "pp": g.pp, "vpp": g.vpp,
        "schedule": g.schedule,
        "cp_sharding": g.cp_sharding,
        "cp_kind": g.cp_kind,
        "recompute": g.recompute,
        # Only when set: plans without it keep their bytes (and digests).
        **({} if g.recompute_layers is None else {"recompute_layers": g.recompute_layers}),
        **({} if g.virtual_stage_layers is None
           else {"virtual_stage_layers": list(g.virtual_stage_layers)}),
        "offload": g.offload,
        "vocab_parallel_pp": g.vocab_parallel_pp,
        # Segments as compact [seq_id, start, end] triples: plans hold thousands of them.
        "slices": [{"id": s.slice_id, "segments": [[x.seq_id, x.start, x.end] for x in s.segments]}
                   for s in g.slices],
        "forward_units": [list(u.slice_ids) for u in g.forward_units],
        "backward_units": [list(u.slice_ids) for u in g.backward_units],
        "attention_moves": (None if g.attention_moves is None
                            else [m.to_list() for m in g.attention_moves]),
    }


_REQUIRED = object()
_TYPE_NAMES = {int: "an integer", str: "a string", bool: "true or false", dict: "an object",
               list: "a list", (int, float): "a number"}


def _expect(value: Any, kind: type, where: str) -> Any:
    """``value`` if it is of JSON type ``kind`` (bools are not integers), else PlanError."""
    ok = isinstance(value, kind) and not (kind in (int, (int, float))
                                          and isinstance(value, bool))
    if not ok:
        raise PlanError(f"Plan JSON: {where} must be {_TYPE_NAMES[kind]}, got {value!r}")
    return value


def _get(obj: dict[str, Any], key: str, kind: type, where: str, *, default: Any = _REQUIRED
         ) -> Any:
    path = f"{where}.{key}" if where else key
    if key not in obj:
        if default is _REQUIRED:
            raise PlanError(f"Plan JSON: missing field {path!r}")
        return default
    return _expect(obj[key], kind, path)


def _lift_format_1(obj: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """A format-1 plan kept its result-changing fields in ``metadata``: move them to the
    typed fields (``metadata`` keeps only the extras)."""
    obj = dict(obj)
    documents = {key: metadata.pop(old) for key, old in (("pieces", "document_pieces"),
                                                         ("samples", "sample_documents"))
                 if old in metadata}
    obj["documents"] = documents
    for key in ("memory_fits", "attention_redistribution"):
        if key in metadata:
            obj[key] = metadata.pop(key)
    return obj


def _lift_format_2(obj: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """A format-2 plan (FlexSP and the Ulysses baselines) stated its ZeRO stage in
    ``metadata['zero_stage']``: move it to the typed field."""
    if "zero_stage" not in metadata:
        return obj
    return {**obj, "zero_stage": metadata.pop("zero_stage")}


def _optional_zero_stage(obj: dict[str, Any]) -> int | None:
    value = obj.get("zero_stage")
    if value is not None and (isinstance(value, bool) or value not in ZERO_STAGES):
        raise PlanError(f"Plan JSON: zero_stage must be null or one of {list(ZERO_STAGES)}, "
                        f"got {value!r}")
    return value


def _optional_bool(obj: dict[str, Any], key: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise PlanError(f"Plan JSON: {key} must be true, false or null, got {value!r}")
    return value


def _int_list(value: Any, where: str) -> tuple[int, ...]:
    return tuple(_expect(x, int, f"{where}[{i}]")
                 for i, x in enumerate(_expect(value, list, where)))


def _slice_from_dict(d: Any, where: str) -> Slice:
    obj = _expect(d, dict, where)
    segments = []
    for i, seg in enumerate(_get(obj, "segments", list, where)):
        triple = _int_list(seg, f"{where}.segments[{i}]")
        if len(triple) != 3:
            raise PlanError(f"Plan JSON: {where}.segments[{i}] must be [seq_id, start, end], "
                            f"got {list(triple)}")
        segments.append(Segment(seq_id=triple[0], start=triple[1], end=triple[2]))
    return Slice(slice_id=_get(obj, "id", int, where), segments=tuple(segments))


_GROUP_KEYS = frozenset({
    "group_id", "ranks", "tp", "cp", "pp", "vpp", "schedule", "cp_sharding", "cp_kind",
    "recompute", "recompute_layers", "virtual_stage_layers", "offload", "vocab_parallel_pp",
    "slices", "forward_units", "backward_units", "attention_moves"})


def _group_from_dict(d: dict[str, Any], where: str = "group") -> Group:
    # A key this reader does not know (a misspelling, a newer field) would be dropped and
    # the plan run differently: refused instead.
    unknown = sorted(set(_expect(d, dict, where)) - _GROUP_KEYS)
    if unknown:
        raise PlanError(f"Plan JSON: {where} has unknown keys {unknown}; allowed: "
                        f"{', '.join(sorted(_GROUP_KEYS))}")

    def units(key: str) -> tuple[Unit, ...]:
        return tuple(Unit(slice_ids=_int_list(u, f"{where}.{key}[{i}]"))
                     for i, u in enumerate(_get(d, key, list, where)))

    return Group(
        group_id=_get(d, "group_id", int, where),
        ranks=_int_list(_get(d, "ranks", list, where), f"{where}.ranks"),
        tp=_get(d, "tp", int, where, default=1), cp=_get(d, "cp", int, where, default=1),
        pp=_get(d, "pp", int, where, default=1), vpp=_get(d, "vpp", int, where, default=1),
        schedule=_get(d, "schedule", str, where, default="1f1b"),
        cp_sharding=_get(d, "cp_sharding", str, where, default="per-sequence"),
        cp_kind=_get(d, "cp_kind", str, where, default="ring"),
        recompute=_get(d, "recompute", str, where, default="none"),
        recompute_layers=(None if d.get("recompute_layers") is None
                          else _get(d, "recompute_layers", int, where)),
        virtual_stage_layers=(None if d.get("virtual_stage_layers") is None else tuple(
            _int_list(_get(d, "virtual_stage_layers", list, where),
                      f"{where}.virtual_stage_layers"))),
        offload=float(_get(d, "offload", (int, float), where, default=0.0)),
        vocab_parallel_pp=_get(d, "vocab_parallel_pp", bool, where, default=False),
        slices=tuple(_slice_from_dict(s, f"{where}.slices[{i}]")
                     for i, s in enumerate(_get(d, "slices", list, where))),
        forward_units=units("forward_units"),
        backward_units=units("backward_units"),
        attention_moves=_moves_from_list(d.get("attention_moves"), f"{where}.attention_moves"),
    )


def _moves_from_list(value: Any, where: str) -> tuple[Move, ...] | None:
    """``[[backward, tick, heavy_block, heavy_unit, light_block, light_unit, fraction], ...]``
    (:data:`MOVE_FIELDS`) or null; ranges are checked by :meth:`Group.validate`."""
    if value is None:
        return None
    moves = []
    for i, item in enumerate(_expect(value, list, where)):
        at = f"{where}[{i}]"
        entries = _expect(item, list, at)
        if len(entries) != len(MOVE_FIELDS):
            raise PlanError(f"Plan JSON: {at} must be [{', '.join(MOVE_FIELDS)}], got {entries!r}")
        kinds = (bool, int, int, int, int, int, (int, float))
        fields = {name: _expect(x, kind, f"{at}.{name}")
                  for name, x, kind in zip(MOVE_FIELDS, entries, kinds, strict=True)}
        fields["fraction"] = float(fields["fraction"])
        moves.append(Move(**fields))
    return tuple(moves)
