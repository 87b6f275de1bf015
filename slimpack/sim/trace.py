"""Traces of a simulated step: Chrome/Perfetto JSON and a Gantt chart PNG.

Both need ``simulate(..., trace=True)``. Open the JSON in https://ui.perfetto.dev or
chrome://tracing: one process per pipeline stage of each group, with a compute thread and
one thread per communication lane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimpack.plan import Group, Plan
from slimpack.sim.simulate import SimResult

LANES = ("compute", "send-next", "send-prev", "dp-sync", "optimizer")
DP_SYNC_PID = 1_000_000


def _require_ops(result: SimResult) -> None:
    if not result.ops:
        raise ValueError("the result holds no op timings; simulate with trace=True")


def _dominant_sequence(group: Group, slice_ids: tuple[int, ...]) -> int:
    """The sequence with most tokens in a unit (its colour in the Gantt chart)."""
    tokens: dict[int, int] = {}
    for sid in slice_ids:
        for seg in group.slice(sid).segments:
            tokens[seg.seq_id] = tokens.get(seg.seq_id, 0) + seg.num_tokens
    return max(tokens, key=lambda k: (tokens[k], -k))


def _unit_sequences(plan: Plan) -> dict[tuple[int, str, int], int]:
    out = {}
    for g in plan.groups():
        for u, unit in enumerate(g.forward_units):
            out[(g.group_id, "F", u)] = _dominant_sequence(g, unit.slice_ids)
        for u, unit in enumerate(g.backward_units):
            out[(g.group_id, "B", u)] = _dominant_sequence(g, unit.slice_ids)
    return out


def to_chrome_trace(result: SimResult) -> dict[str, Any]:
    """Chrome trace-event JSON (``{"traceEvents": [...]}``), times in microseconds."""
    _require_ops(result)
    seq_of = _unit_sequences(result.plan)
    events: list[dict[str, Any]] = []
    named: set[int] = set()
    for op in result.ops:
        pid = DP_SYNC_PID if op.group < 0 else op.group * 1000 + op.stage
        if pid not in named:
            named.add(pid)
            name = "dp-sync and optimizer" if op.group < 0 else f"group {op.group} stage {op.stage}"
            events.append({"ph": "M", "name": "process_name", "pid": pid,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                           "args": {"sort_index": pid}})
            for tid, lane in enumerate(LANES):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": lane}})
        base_kind = op.kind[-1] if op.kind.startswith("send") else op.kind
        args: dict[str, Any] = {"unit": op.unit, "chunk": op.chunk}
        seq = seq_of.get((op.group, base_kind, op.unit))
        if seq is not None:
            args["seq"] = seq
        label = op.kind if op.unit < 0 else f"{op.kind}{op.unit}.c{op.chunk}"
        events.append({"ph": "X", "name": label, "cat": op.lane, "pid": pid,
                       "tid": LANES.index(op.lane) if op.lane in LANES else len(LANES),
                       "ts": op.start_s * 1e6, "dur": (op.end_s - op.start_s) * 1e6,
                       "args": args})
    record = result.record
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"method": record.method, "model": record.model,
                          "step_time_s": record.step_time_s,
                          "bubble_fraction": record.bubble_fraction}}


def plot_gantt(result: SimResult, path: str | Path) -> Path:
    """Compute lanes of every stage over time; forward light, backward dark, hue = sequence."""
    _require_ops(result)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    seq_of = _unit_sequences(result.plan)
    compute = [op for op in result.ops if op.lane == "compute"]
    rows = sorted({(op.group, op.stage) for op in compute})
    row_index = {r: i for i, r in enumerate(rows)}
    sequences = sorted(set(seq_of.values()))
    palette = sns.color_palette("husl", max(len(sequences), 1))
    colour = {s: palette[i % len(palette)] for i, s in enumerate(sequences)}
    bars: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
    for op in compute:
        key = (row_index[(op.group, op.stage)], seq_of[(op.group, op.kind, op.unit)], op.kind)
        bars.setdefault(key, []).append((op.start_s * 1e3, (op.end_s - op.start_s) * 1e3))
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.5))
    for (row, seq, kind), spans in bars.items():
        r, g, b = colour[seq]
        face = (r, g, b, 0.45) if kind == "F" else (r * 0.7, g * 0.7, b * 0.7, 1.0)
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=face, edgecolor="none")
    ax.set_yticks(range(len(rows)), [f"g{g} s{s}" for g, s in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    rec = result.record
    ax.set_title(f"{rec.method}: step {rec.step_time_s * 1e3:.2f} ms, bubble "
                 f"{rec.bubble_fraction:.1%} (light = forward, dark = backward, hue = sequence)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
