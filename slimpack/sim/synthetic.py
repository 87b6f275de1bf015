"""Hand-checkable plans: m micro-batches of one sequence each, cut into n equal slices.

These are the workloads whose bubble fractions and memory peaks have closed forms
(docs/cost-model.md), used by the ``simulate --uniform`` CLI and by the tests.
"""

from __future__ import annotations

from slimpack.plan import SCHEDULES, Group, Phase, Plan, Segment, Slice, Unit
from slimpack.specs.parallel import ParallelSpec


def uniform_plan(*, schedule: str, pp: int, microbatches: int, vpp: int = 1, slices: int = 1,
                 seq_len: int | None = None, tp: int = 1, cp: int = 1, dp: int = 1,
                 model: str = "", vocab_parallel_pp: bool | None = None,
                 recompute: str = "none") -> Plan:
    """A plan of ``dp`` identical groups, each training ``microbatches`` sequences.

    Every sequence (``seq_len`` tokens, default ``1024 * slices``) is cut into ``slices``
    equal slices and every slice is one unit; sequences are backwarded last slice first.
    ``vocab_parallel_pp`` defaults to True for ``slimpipe`` (SlimPipe spreads the LM head).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    for name, value in (("pp", pp), ("microbatches", microbatches), ("vpp", vpp),
                        ("slices", slices), ("tp", tp), ("cp", cp), ("dp", dp)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    seq_len = 1024 * slices if seq_len is None else seq_len
    if seq_len % slices:
        raise ValueError(f"slices ({slices}) must divide seq_len ({seq_len})")
    if vocab_parallel_pp is None:
        vocab_parallel_pp = schedule == "slimpipe"
    parallel = ParallelSpec(tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp)
    step = seq_len // slices
    groups = []
    lengths: dict[int, int] = {}
    for replica in range(dp):
        slice_list: list[Slice] = []
        forward: list[Unit] = []
        backward: list[Unit] = []
        for mb in range(microbatches):
            seq_id = replica * microbatches + mb
            lengths[seq_id] = seq_len
            ids = []
            for i in range(slices):
                sid = len(slice_list)
                slice_list.append(Slice(slice_id=sid, segments=(
                    Segment(seq_id=seq_id, start=i * step, end=(i + 1) * step),)))
                ids.append(sid)
            forward.extend(Unit(slice_ids=(sid,)) for sid in ids)
            backward.extend(Unit(slice_ids=(sid,)) for sid in reversed(ids))
        groups.append(Group(
            group_id=replica, ranks=parallel.replica_ranks(replica), tp=tp, cp=cp, pp=pp,
            vpp=vpp, slices=tuple(slice_list), forward_units=tuple(forward),
            backward_units=tuple(backward), schedule=schedule,  # type: ignore[arg-type]
            vocab_parallel_pp=vocab_parallel_pp, recompute=recompute,  # type: ignore[arg-type]
        ))
    return Plan(method=f"uniform-{schedule}", parallel=parallel, sequence_lengths=lengths,
                phases=(Phase(groups=tuple(groups)),), model=model)


def backward_units_by_run(slices: list[Slice], forward: list[Unit]) -> list[Unit]:
    """Backward units for slice-level units: each sequence-connected run reversed.

    Runs (consecutive forward units sharing sequences) are backwarded in forward order, each
    from its last unit to its first, which is the reverse-slice rule with 1F1B's
    first-in-first-out memory behaviour.
    """
    by_id = {s.slice_id: s for s in slices}
    last_unit: dict[int, int] = {}
    for i, unit in enumerate(forward):
        for sid in unit.slice_ids:
            for seg in by_id[sid].segments:
                last_unit[seg.seq_id] = i
    out: list[Unit] = []
    run: list[Unit] = []
    reach = -1
    for i, unit in enumerate(forward):
        run.append(unit)
        for sid in unit.slice_ids:
            for seg in by_id[sid].segments:
                reach = max(reach, last_unit[seg.seq_id])
        if reach <= i:
            out.extend(Unit(slice_ids=tuple(reversed(u.slice_ids))) for u in reversed(run))
            run = []
    return out


def sliced_plan(lengths: list[int], *, slice_tokens: int, parallel: ParallelSpec,
                schedule: str = "slimpipe", model: str = "", method: str = "sliced",
                vocab_parallel_pp: bool = True) -> Plan:
    """A SlimPipe-style plan of variable-length sequences, without any balancing.

    Sequences go to data-parallel replicas round-robin; in each replica, sequences longer than
    ``slice_tokens`` are cut into slices of ``slice_tokens`` (the last one shorter) and
    shorter ones are packed whole, in order, into slices of at most ``slice_tokens``; every
    slice is one unit.
    """
    if slice_tokens < 1:
        raise ValueError(f"slice_tokens must be >= 1, got {slice_tokens}")
    groups = []
    for replica in range(parallel.dp):
        slices = _cut_and_pack(lengths, range(replica, len(lengths), parallel.dp), slice_tokens)
        if not slices:
            continue
        forward = [Unit(slice_ids=(s.slice_id,)) for s in slices]
        groups.append(Group(
            group_id=replica, ranks=parallel.replica_ranks(replica), tp=parallel.tp,
            cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp, slices=tuple(slices),
            forward_units=tuple(forward),
            backward_units=tuple(backward_units_by_run(slices, forward)),
            schedule=schedule, vocab_parallel_pp=vocab_parallel_pp,  # type: ignore[arg-type]
        ))
    return Plan(method=method, parallel=parallel, model=model,
                sequence_lengths=dict(enumerate(lengths)), phases=(Phase(groups=tuple(groups)),))


def _cut_and_pack(lengths: list[int], seq_ids: range, slice_tokens: int) -> list[Slice]:
    """Long sequences cut into consecutive slices; short ones packed whole, in order."""
    slices: list[Slice] = []
    pending: list[Segment] = []
    pending_tokens = 0
    for seq_id in seq_ids:
        n = lengths[seq_id]
        if n > slice_tokens or pending_tokens + n > slice_tokens:
            if pending:
                slices.append(Slice(slice_id=len(slices), segments=tuple(pending)))
            pending, pending_tokens = [], 0
        if n > slice_tokens:
            for start in range(0, n, slice_tokens):
                seg = Segment(seq_id=seq_id, start=start, end=min(n, start + slice_tokens))
                slices.append(Slice(slice_id=len(slices), segments=(seg,)))
            continue
        pending.append(Segment(seq_id=seq_id, start=0, end=n))
        pending_tokens += n
    if pending:
        slices.append(Slice(slice_id=len(slices), segments=tuple(pending)))
    return slices
