"""Run an experiment's sweep: hash points, skip done ones, fan out over cores, store records.

A point's key is the hash of the experiment name, the harness version and the point's full
config (backend included), so a point runs once per meaning: rerunning a finished sweep does
nothing, and a killed one continues where it stopped. Workers only compute; the parent process
alone writes the CSV (see :mod:`repro.store`), and the final CSV is sorted into sweep order, so
``--jobs``, completion order and interruptions leave no trace in the bytes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from repro.experiment import Experiment, Point, Row
from repro.registry import experiment_names, resolve_experiment
from repro.store import RecordStore, locked_dir

REPRO_VERSION = "1"
"""Bump when a record's meaning changes (schema, units): old rows are then recomputed."""

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


CODE_ROOTS = ("slimpack", "baselines", "repro/experiments")
"""Source whose change changes results: a point computed by other code is recomputed."""


@functools.cache
def code_digest() -> str:
    """sha256 over the library's Python sources and the shipped length profiles.

    Part of every point's key, so cached records are reused only for the code that made
    them: a resumed run of the same code skips finished points, a changed planner or cost
    model recomputes them (and the stale rows are dropped when the sweep finishes).
    """
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    files = [f for r in CODE_ROOTS for f in (root / r).rglob("*.py")]
    files += list((root / "datasets" / "profiles").glob("*.json"))
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def point_key(experiment: str, config: Point) -> str:
    """16 hex digits of sha256 over (experiment, harness version, code digest, full config)."""
    blob = canonical_json({"experiment": experiment, "version": REPRO_VERSION,
                           "code": code_digest(), "config": config})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def records_path(results_dir: Path, experiment: str) -> Path:
    return results_dir / experiment / "records.csv"


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    backend: str = "sim"
    jobs: int = 1
    quick: bool = False
    results_dir: Path = RESULTS_DIR
    progress: bool = True
    registry: str = "repro.registry"
    """Module whose EXPERIMENTS mapping names the experiments (tests swap in their own)."""

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"RunOptions.jobs must be >= 1, got {self.jobs}")


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    experiment: str
    total: int
    already_done: int
    ran: int
    failures: tuple[str, ...] = ()
    skipped_reason: str = ""
    seconds: float = 0.0
    point_configs: tuple[Point, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return not self.failures


def sweep(experiment: Experiment, options: RunOptions) -> list[tuple[str, Point]]:
    """(key, config) of every point, in sweep order; the backend is part of each config."""
    keyed: list[tuple[str, Point]] = []
    seen: set[str] = set()
    for point in experiment.points(options.quick):
        config = {**point, "backend": options.backend}
        key = point_key(experiment.name, config)
        if key in seen:
            raise ValueError(f"experiment {experiment.name!r} lists the point {config} twice")
        seen.add(key)
        keyed.append((key, config))
    return keyed


def flatten_config(config: Point) -> dict[str, Any]:
    return {k: v if isinstance(v, str | int | float | bool) or v is None else canonical_json(v)
            for k, v in config.items()}


def compute_point(registry: str, name: str, key: str, config: Point) -> tuple[str, list[Row]]:
    """Run one point and return its complete, labelled rows (runs in a worker process)."""
    experiment = resolve_experiment(name, registry)
    rows = experiment.run_point(dict(config))
    if not rows:
        raise ValueError(f"experiment {name!r}: point {config} produced no records")
    lead = {"experiment": name, "point_key": key, "point_rows": len(rows),
            "repro_version": REPRO_VERSION, "backend": config["backend"]}
    # A failed method's row has no model, hardware, GPUs... of its own (None): it keeps the
    # point's, so every row names the setting it belongs to.
    point = flatten_config(config)
    return key, [{**point, **{k: v for k, v in row.items() if v is not None or k not in point},
                  **lead} for row in rows]


def _worker_signals(parent_pid: int | None = None) -> None:
    # Only the parent decides what an interrupt means; workers would print tracebacks. The
    # parent's SIGTERM-as-interrupt handler is inherited through fork: restore the default so
    # terminating a worker ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid if parent_pid is not None else os.getppid())


PR_SET_PDEATHSIG = 1
"""prctl option (linux/prctl.h): the signal this process gets when its parent dies."""
PARENT_POLL_S = 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent(parent_pid: int) -> None:
    """End this worker when ``parent_pid`` dies, even by SIGKILL (which runs no cleanup).

    Without this, `kill -9` of `repro run --jobs N` leaves N workers computing (and holding
    hundreds of MB) until killed by hand. Linux: prctl(PR_SET_PDEATHSIG, SIGKILL). Elsewhere,
    or when prctl is unavailable, a daemon thread polls getppid() (re-parenting changes it).
    """
    armed = False
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != parent_pid:
        if not _alive(parent_pid):
            os._exit(1)  # it died before prctl took effect: nobody would signal us
        # Alive but not our parent: a forkserver/spawn start method put a process in between;
        # that one exits when the harness does, so watching it is enough.
        parent_pid = os.getppid()
    if armed:
        return

    import threading

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def distributed_rank() -> int:
    """This process's torchrun rank (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def _todo_path(path: Path) -> Path:
    return path.with_name(f".todo-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}.json")


def _follow(experiment: Experiment, points: list[tuple[str, Point]], path: Path,
            wait_s: float = 600.0) -> RunSummary:
    """Non-zero torchrun ranks: run rank 0's to-do list (collectives need every rank) and
    store nothing; rank 0 publishes the list in a file, so all ranks agree on it."""
    todo_file = _todo_path(path)
    deadline = time.monotonic() + wait_s
    while not todo_file.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {distributed_rank()}: rank 0 never wrote {todo_file}")
        time.sleep(0.5)
    keys = json.loads(todo_file.read_text())
    configs = dict(points)
    for key in keys:
        experiment.run_point(dict(configs[key]))
    return RunSummary(experiment=experiment.name, total=len(points),
                      already_done=len(points) - len(keys), ran=len(keys))


def run_experiment(name: str, options: RunOptions,
                   pool: ProcessPoolExecutor | None = None) -> RunSummary:
    """Run the points of ``name`` not yet in its CSV; return what happened.

    KeyboardInterrupt propagates after the points already finished are safely stored.
    """
    started = time.perf_counter()
    experiment = resolve_experiment(name, options.registry)
    if options.backend not in experiment.backends:
        return RunSummary(experiment=name, total=0, already_done=0, ran=0,
                          skipped_reason=f"backend {options.backend!r} not supported "
                                         f"(supports {', '.join(experiment.backends)})")
    points = sweep(experiment, options)
    full_keys = {k for k, _ in sweep(experiment, replace(options, quick=False))}
    path = records_path(options.results_dir, name)
    if distributed_rank() != 0:
        return _follow(experiment, points, path)
    store = RecordStore(path)
    failures: list[str] = []
    ran = 0
    with locked_dir(path.parent):
        store.repair()
        done = store.done_keys()
        todo = [(k, c) for k, c in points if k not in done]
        if "RANK" in os.environ:  # under torchrun: tell the other ranks what to run
            tmp = _todo_path(path).with_suffix(".tmp")
            tmp.write_text(json.dumps([k for k, _ in todo]))
            os.replace(tmp, _todo_path(path))
        bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=name, unit="pt",
                   disable=not options.progress, dynamic_ncols=True, leave=True)
        try:
            def on_result(key: str, rows: list[Row]) -> None:
                nonlocal ran
                store.append_block(rows)
                ran += 1
                bar.update(1)

            def on_error(config: Point, exc: BaseException) -> bool:
                failures.append(f"{type(exc).__name__}: {exc} (point {canonical_json(config)})")
                return True

            if pool is None or len(todo) <= 1:
                for key, config in todo:
                    try:
                        on_result(*compute_point(options.registry, name, key, config))
                    except Exception as exc:  # noqa: BLE001 - reported in the summary
                        on_error(config, exc)
            else:
                _run_parallel(pool, options.registry, [(name, k, c) for k, c in todo],
                              lambda _name, key, rows: on_result(key, rows),
                              lambda _name, config, exc: on_error(config, exc))
        finally:
            bar.close()
            # Also on interrupt: the stored blocks are complete, so sorting them is safe.
            store.finalize([k for k, _ in points], REPRO_VERSION, valid_keys=full_keys,
                           backend=options.backend)
    return RunSummary(experiment=name, total=len(points), already_done=len(points) - len(todo),
                      ran=ran, failures=tuple(failures),
                      seconds=time.perf_counter() - started,
                      point_configs=tuple(c for _, c in points))


def point_costs(experiment: Experiment, configs: list[Point]) -> list[float]:
    """``experiment.point_cost`` of each config (1.0 without a hint), checked."""
    if experiment.point_cost is None:
        return [1.0] * len(configs)
    costs = []
    for config in configs:
        cost = experiment.point_cost(config)
        if isinstance(cost, bool) or not isinstance(cost, int | float) \
                or not math.isfinite(cost) or cost < 0:
            raise ValueError(f"experiment {experiment.name!r}: point_cost must return a finite "
                             f"number >= 0, got {cost!r} for point {canonical_json(config)}")
        costs.append(float(cost))
    return costs


def pool_order(experiments: list[tuple[str, list[tuple[str, Point]], list[float], set[str]]],
               registry_order: list[str]) -> list[tuple[str, str, Point]]:
    """The pooled run's queue: ``(name, key, config)`` of every to-do point, costliest first;
    ties in registry order, then sweep order (Python's sort is stable).

    ``experiments``: ``(name, sweep points, their costs, to-do keys)`` each. Longest first is
    the classic LPT rule: the last point to finish is then a short one, so the cores idle
    little at the end (with one long point, the others run beside it instead of after it).
    """
    rank = {n: i for i, n in enumerate(registry_order)}
    entries = []
    for name, points, costs, todo in experiments:
        for index, ((key, config), cost) in enumerate(zip(points, costs, strict=True)):
            if key in todo:
                entries.append((-cost, rank.get(name, len(rank)), index, name, key, config))
    entries.sort(key=lambda e: e[:3])
    return [(name, key, config) for *_, name, key, config in entries]


@dataclass(kw_only=True)
class _Sweep:
    """One experiment's share of a pooled run (mutable: filled in as its points finish)."""

    name: str
    experiment: Experiment
    points: list[tuple[str, Point]]
    full_keys: set[str]
    store: RecordStore
    todo: list[tuple[str, Point]] = field(default_factory=list)
    ran: int = 0
    failures: list[str] = field(default_factory=list)
    finalized: bool = False

    @property
    def open_points(self) -> int:
        return len(self.todo) - self.ran - len(self.failures)

    def finalize(self, options: RunOptions) -> None:
        self.store.finalize([k for k, _ in self.points], REPRO_VERSION,
                            valid_keys=self.full_keys, backend=options.backend)
        self.finalized = True

    def summary(self, seconds: float) -> RunSummary:
        return RunSummary(experiment=self.name, total=len(self.points),
                          already_done=len(self.points) - len(self.todo), ran=self.ran,
                          failures=tuple(self.failures), seconds=seconds,
                          point_configs=tuple(c for _, c in self.points))


def run_experiments(names: list[str], options: RunOptions,
                    pool: ProcessPoolExecutor | None = None,
                    on_summary: Callable[[RunSummary], None] | None = None) -> list[RunSummary]:
    """Run several experiments' to-do points on one pool; return their summaries in
    ``names`` order, and hand each to ``on_summary`` as soon as its experiment is complete.

    The points of all experiments form one queue, costliest first (``Experiment.point_cost``;
    ties: registry order, then sweep order), so a long point starts early and short ones fill
    the other workers meanwhile. Each result goes to its own experiment's store as it arrives;
    an experiment's CSV is finalized when its last point is in (or on interrupt), so records
    are byte-identical to a sequential run. ``RunSummary.seconds`` counts from the start of
    this call to the experiment's last point. Without a pool (``--jobs 1``), or under torchrun
    (whose ranks must agree on one experiment at a time), experiments run one after another.
    KeyboardInterrupt propagates after the points already finished are safely stored.
    """
    report = on_summary or (lambda summary: None)
    summaries: dict[str, RunSummary] = {}
    if pool is None or "RANK" in os.environ:
        for name in names:
            summaries[name] = run_experiment(name, options, pool)
            report(summaries[name])
        return [summaries[n] for n in names]
    started = time.perf_counter()
    sweeps: list[_Sweep] = []
    for name in names:
        experiment = resolve_experiment(name, options.registry)
        if options.backend not in experiment.backends:
            summaries[name] = RunSummary(
                experiment=name, total=0, already_done=0, ran=0,
                skipped_reason=f"backend {options.backend!r} not supported "
                               f"(supports {', '.join(experiment.backends)})")
            report(summaries[name])
            continue
        points = sweep(experiment, options)
        full_keys = {k for k, _ in sweep(experiment, replace(options, quick=False))}
        sweeps.append(_Sweep(name=name, experiment=experiment, points=points,
                             full_keys=full_keys,
                             store=RecordStore(records_path(options.results_dir, name))))
    # Costs first: a bad hint is a ValueError before any lock is taken or point is run.
    costs = {s.name: point_costs(s.experiment, [c for _, c in s.points]) for s in sweeps}
    by_name = {s.name: s for s in sweeps}

    def finish(s: _Sweep) -> None:
        s.finalize(options)
        summaries[s.name] = s.summary(time.perf_counter() - started)
        report(summaries[s.name])

    with contextlib.ExitStack() as locks:
        # Sorted, so two runs over overlapping experiments cannot each hold what the other needs.
        for s in sorted(sweeps, key=lambda s: str(s.store.path.parent)):
            locks.enter_context(locked_dir(s.store.path.parent))
        for s in sweeps:
            s.store.repair()
            done = s.store.done_keys()
            s.todo = [(k, c) for k, c in s.points if k not in done]
        queue = pool_order([(s.name, s.points, costs[s.name], {k for k, _ in s.todo})
                            for s in sweeps], experiment_names(options.registry))
        total = sum(len(s.points) for s in sweeps)
        bar = tqdm(total=total, initial=total - len(queue), desc="run", unit="pt",
                   disable=not options.progress, dynamic_ncols=True, leave=True)
        try:
            for s in sweeps:
                if not s.todo:
                    finish(s)

            def on_result(name: str, key: str, rows: list[Row]) -> None:
                s = by_name[name]
                s.store.append_block(rows)
                s.ran += 1
                bar.update(1)
                bar.set_postfix_str(name)
                if s.open_points == 0:
                    finish(s)

            def on_error(name: str, config: Point, exc: BaseException) -> bool:
                s = by_name[name]
                s.failures.append(f"{type(exc).__name__}: {exc} (point {canonical_json(config)})")
                bar.update(1)
                if s.open_points == 0:
                    finish(s)
                return True

            _run_parallel(pool, options.registry, queue, on_result, on_error)
        finally:
            bar.close()
            # Also on interrupt: the stored blocks are complete, so sorting them is safe.
            for s in sweeps:
                if not s.finalized:
                    s.finalize(options)
    return [summaries[n] for n in names]


def _run_parallel(pool: ProcessPoolExecutor, registry: str,
                  tasks: list[tuple[str, str, Point]],
                  on_result: Callable[[str, str, list[Row]], None],
                  on_error: Callable[[str, Point, BaseException], bool]) -> None:
    """Run ``(experiment, key, config)`` tasks on ``pool`` in list order (the pool starts
    them in submission order); ``on_result(name, key, rows)`` and ``on_error(name, config,
    exc)`` run in this process as each finishes (``on_error`` returning False stops)."""
    # Keep only a few points in flight beyond the workers, so an early stop (missing API,
    # interrupt) does not leave a long queue behind.
    queue = list(reversed(tasks))
    in_flight: dict[Future, tuple[str, Point]] = {}
    limit = 2 * max(1, pool._max_workers)  # noqa: SLF001 - the pool's own size
    keep_going = True
    while keep_going and (queue or in_flight):
        while queue and len(in_flight) < limit:
            name, key, config = queue.pop()
            in_flight[pool.submit(compute_point, registry, name, key, config)] = (name, config)
        finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
        for future in finished:
            name, config = in_flight.pop(future)
            exc = future.exception()
            if exc is None:
                on_result(name, *future.result())
            elif not on_error(name, config, exc):
                keep_going = False
    for future in in_flight:
        future.cancel()
    if not keep_going:
        wait(in_flight)


def make_pool(jobs: int) -> ProcessPoolExecutor | None:
    if jobs <= 1:
        return None
    # The parent's pid is passed explicitly: a worker compares getppid() with it.
    return ProcessPoolExecutor(max_workers=jobs, initializer=_worker_signals,
                               initargs=(os.getpid(),))


def stop_pool(pool: ProcessPoolExecutor | None, *, interrupted: bool) -> None:
    if pool is None:
        return
    if interrupted:
        # A point can run for seconds; on an interrupt do not wait for the ones in flight
        # (their results would be dropped anyway, and rerunning recomputes them).
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)
