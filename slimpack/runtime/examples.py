"""Hand-built plans of the three shapes the runtime must execute exactly.

They exercise the runtime without any planner (tests, ``slimpack run --example``, the GPU
check and the CPU sim-vs-real comparison). Token counts scale with ``scale``; ``tp`` splits
each pipeline stage over that many tensor-parallel ranks and ``cp`` over that many
context-parallel ones (``cp_sharding``, ``cp_kind`` as the plan IR has them); every group
gets different documents so data parallelism is not a copy of one replica.

* ``slimpipe``: one long sequence per replica cut into ``num_slices`` equal slices, one slice
  per unit (SlimPipe's slice-level pipeline);
* ``slimpack``: continuation slices of a long sequence packed with short documents, forward
  and backward MicroPacks different (SlimPack's asymmetric partition);
* ``packed``: short whole documents packed into slices (varlen, no KV prefix);
* ``flexsp`` (:func:`flexsp_plan`, 4 ranks): FlexSP's shape, one phase per micro-batch with
  Ulysses groups of mixed degrees (4; 2 and 2; then 1, 1, 1 with one rank idle and the
  groups running different numbers of slices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slimpack.plan import Group, Phase, Plan, Segment, Slice, Unit
from slimpack.specs.parallel import ParallelSpec

# Per replica: slices as lists of (seq, start, end) in units of `scale` tokens; then forward
# and backward units as slice ids. Sequence ids are made unique per replica below.
_Spec = tuple[list[list[tuple[int, int, int]]], list[list[int]], list[list[int]]]

_SLIMPACK: list[_Spec] = [
    ([[(0, 0, 20)], [(0, 20, 40), (1, 0, 10)], [(0, 40, 60), (2, 0, 7), (3, 0, 5)]],
     [[0], [1, 2]], [[2], [1, 0]]),
    ([[(0, 0, 18), (1, 0, 9)], [(0, 18, 30)], [(0, 30, 44), (2, 0, 3)]],
     [[0, 1], [2]], [[2, 1], [0]]),
]
_PACKED: list[_Spec] = [
    ([[(0, 0, 13), (1, 0, 9), (2, 0, 6)], [(3, 0, 20)], [(4, 0, 5), (5, 0, 11)]],
     [[0], [1], [2]], [[0], [1], [2]]),
    ([[(0, 0, 17), (1, 0, 2)], [(2, 0, 25), (3, 0, 4)]],
     [[0], [1]], [[0], [1]]),
]


def _plan(method: str, replicas: Sequence[_Spec], *, pp: int, dp: int, vpp: int, scale: int,
          schedule: str, tp: int = 1, cp: int = 1, cp_sharding: str = "per-sequence",
          cp_kind: str = "ring") -> Plan:
    parallel = ParallelSpec(tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp)
    groups, lengths = [], {}
    for d in range(dp):
        slices_spec, fwd, bwd = replicas[d % len(replicas)]
        base = 100 * d  # unique sequence ids per replica
        slices = []
        for i, segs in enumerate(slices_spec):
            segments = tuple(Segment(seq_id=base + s, start=a * scale, end=b * scale)
                             for s, a, b in segs)
            for seg in segments:
                lengths[seg.seq_id] = max(lengths.get(seg.seq_id, 0), seg.end)
            slices.append(Slice(slice_id=i, segments=segments))
        groups.append(Group(
            group_id=d, ranks=parallel.replica_ranks(d), tp=tp, cp=cp, pp=pp, vpp=vpp,
            slices=tuple(slices), cp_sharding=cp_sharding, cp_kind=cp_kind,
            forward_units=tuple(Unit(slice_ids=tuple(u)) for u in fwd),
            backward_units=tuple(Unit(slice_ids=tuple(u)) for u in bwd), schedule=schedule))
    return Plan(method=method, parallel=parallel, sequence_lengths=lengths,
                phases=(Phase(groups=tuple(groups)),), metadata={"example": method}).validate()


def slimpipe_plan(*, pp: int = 2, dp: int = 2, vpp: int = 1, scale: int = 1,
                  num_slices: int = 4, tp: int = 1, **cp_fields) -> Plan:
    """Even replicas train one sequence of ``16 * num_slices * scale`` tokens, odd ones
    ``12 * num_slices * scale``, cut in ``num_slices`` equal slices."""
    replicas: list[_Spec] = []
    for d in range(dp):
        per = (16 - 4 * (d % 2)) * scale
        replicas.append(([[(0, i * per, (i + 1) * per)] for i in range(num_slices)],
                         [[i] for i in range(num_slices)],
                         [[i] for i in reversed(range(num_slices))]))
    return _plan("example-slimpipe", replicas, pp=pp, dp=dp, vpp=vpp, scale=1,
                 schedule="slimpipe", tp=tp, **cp_fields)


def slimpack_plan(*, pp: int = 2, dp: int = 2, vpp: int = 1, scale: int = 1,
                  tp: int = 1, **cp_fields) -> Plan:
    """``cp_fields``: ``cp``, ``cp_sharding``, ``cp_kind`` of every group."""
    return _plan("example-slimpack", _SLIMPACK, pp=pp, dp=dp, vpp=vpp, scale=scale,
                 schedule="asymmetric", tp=tp, **cp_fields)


def packed_plan(*, pp: int = 2, dp: int = 2, vpp: int = 1, scale: int = 1,
                tp: int = 1, **cp_fields) -> Plan:
    return _plan("example-packed", _PACKED, pp=pp, dp=dp, vpp=vpp, scale=scale,
                 schedule="1f1b" if vpp == 1 else "interleaved", tp=tp, **cp_fields)


def flexsp_plan(*, scale: int = 1, zero_stage: int | None = None) -> Plan:
    """FlexSP's shape on 4 ranks (dp 4, pp 1): one phase per micro-batch, each a set of
    Ulysses groups of its own degree over disjoint ranks, every sequence whole in one slice
    (or packed with others). The last phase leaves rank 3 idle and gives rank 0 two units
    where ranks 1 and 2 run one: what per-use collectives over the data-parallel ranks (ZeRO-3)
    must not assume away."""
    lengths = {0: 64 * scale, 1: 24 * scale, 2: 16 * scale, 3: 30 * scale, 4: 11 * scale,
               5: 9 * scale, 6: 13 * scale, 7: 7 * scale}
    # phase -> groups as (ranks, slices as lists of seq ids, forward units as slice ids)
    layout = [
        [((0, 1, 2, 3), [[0]], [[0]])],
        [((0, 1), [[1, 2]], [[0]]), ((2, 3), [[3]], [[0]])],
        [((0,), [[4], [5]], [[0], [1]]), ((1,), [[6]], [[0]]), ((2,), [[7]], [[0]])],
    ]
    phases, gid = [], 0
    for groups_spec in layout:
        groups = []
        for ranks, slices_spec, units in groups_spec:
            slices = tuple(Slice(slice_id=i, segments=tuple(
                Segment(seq_id=s, start=0, end=lengths[s]) for s in seqs))
                for i, seqs in enumerate(slices_spec))
            fwd = tuple(Unit(slice_ids=tuple(u)) for u in units)
            groups.append(Group(group_id=gid, ranks=ranks, cp=len(ranks), cp_kind="ulysses",
                                slices=slices, forward_units=fwd, backward_units=fwd))
            gid += 1
        phases.append(Phase(groups=tuple(groups)))
    return Plan(method="example-flexsp", parallel=ParallelSpec(dp=4), sequence_lengths=lengths,
                phases=tuple(phases), metadata={"example": "flexsp"},
                zero_stage=zero_stage).validate()


EXAMPLES: dict[str, Callable[..., Plan]] = {
    "slimpipe": slimpipe_plan,
    "slimpack": slimpack_plan,
    "packed": packed_plan,
}
