"""``python -m repro {list,run,plot,report,compare,golden}``: the harness's command line.

Exit status: 0 success; 1 a point failed; 2 bad usage;
3 golden regression; 4 compare: drift beyond --rtol, or nothing to compare;
130 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from repro.drift import DEFAULT_RTOL
from repro.registry import expand_names, experiment_names, resolve_experiment
from repro.runner import (
    RESULTS_DIR,
    RunOptions,
    RunSummary,
    make_pool,
    run_experiments,
    stop_pool,
)
from repro.wandb_log import WANDB_MODES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m repro", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                       help=f"where records, figures and REPORT.md live (default {RESULTS_DIR})")
        p.add_argument("--registry", default="repro.registry", help=argparse.SUPPRESS)

    p = sub.add_parser("list", help="experiments, what they need, and their sweep sizes")
    common(p)

    p = sub.add_parser("run", help="run experiments' sweeps (resumable)")
    p.add_argument("names", nargs="+", help="experiment names, or 'all'")
    p.add_argument("--backend", choices=("sim", "runtime"), default="sim")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--quick", action="store_true", help="the small sweep (a subset of the full one)")
    p.add_argument("--wandb", choices=WANDB_MODES, default="offline")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--fresh", action="store_true",
                   help="discard the experiments' cached records first (points are cached by "
                        "config, not by code: use this after changing a planner or the cost model)")
    common(p)

    p = sub.add_parser("plot", help="figures from stored records")
    p.add_argument("names", nargs="+", help="experiment names, or 'all'")
    p.add_argument("--wandb", choices=WANDB_MODES, default="offline")
    common(p)

    p = sub.add_parser("report", help="write results/REPORT.md")
    common(p)

    p = sub.add_parser("compare", help="fresh records (--results-dir) against reference ones "
                                        "(--against): max relative difference per experiment")
    p.add_argument("names", nargs="*", default=["all"], help="experiment names (default all)")
    p.add_argument("--against", type=Path, default=RESULTS_DIR,
                   help=f"reference records (default {RESULTS_DIR}, the committed ones)")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL,
                   help=f"largest relative difference allowed (default {DEFAULT_RTOL:g}); "
                        "wall-clock columns (plan_seconds, *wall*) are not compared")
    p.add_argument("--backend", choices=("sim", "runtime"), default="sim")
    common(p)

    p = sub.add_parser("golden", help="regression headlines (results/golden/<hardware>.json)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true", help="rewrite the golden files")
    mode.add_argument("--check", action="store_true", help="compare with them (default)")
    p.add_argument("--jobs", type=int, default=1)
    common(p)
    return parser


def _interrupt_on_sigterm() -> None:
    # SLURM preemption and `timeout` send SIGTERM: treat it like Ctrl-C so stored points are
    # finalised and the rerun resumes.
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # A blocked signal mask is inherited across exec: a parent that blocks SIGTERM (some
    # launchers and test runners do) would leave it pending forever and the run would not
    # stop. Unblock both interrupts so they are delivered.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})


def cmd_list(args: argparse.Namespace) -> int:
    for name in experiment_names(args.registry):
        exp = resolve_experiment(name, args.registry)
        quick, full = len(exp.points(True)), len(exp.points(False))
        needs = ", ".join(exp.needs) or "-"
        print(f"{name:<24} quick {quick:>4}  full {full:>4}  backends {','.join(exp.backends):<12} "
              f"needs {needs}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from repro.analysis import load_records
    from repro.wandb_log import log_to_wandb

    names = expand_names(args.names, args.registry)
    if getattr(args, "fresh", False):
        for name in names:
            stale = args.results_dir / name / "records.csv"
            if stale.exists():
                stale.unlink()
                print(f"{name}: discarded cached records", file=sys.stderr)
    options = RunOptions(backend=args.backend, jobs=args.jobs, quick=args.quick,
                         results_dir=args.results_dir, progress=not args.no_progress,
                         registry=args.registry)
    _interrupt_on_sigterm()
    pool = make_pool(args.jobs)
    interrupted = False
    status = 0
    started = time.perf_counter()

    def report(summary: RunSummary) -> None:
        nonlocal status
        name = summary.experiment
        if summary.skipped_reason:
            print(f"{name}: skipped, {summary.skipped_reason}", file=sys.stderr)
            return
        print(f"{name}: {summary.ran} run, {summary.already_done} already done, "
              f"{summary.total} points, {summary.seconds:.1f} s", file=sys.stderr)
        for failure in summary.failures:
            print(f"{name}: point failed: {failure}", file=sys.stderr)
            status = 1
        if summary.ran:
            warning = log_to_wandb(
                mode=args.wandb, results_dir=args.results_dir, experiment=name, job_type="run",
                config={"backend": args.backend, "quick": args.quick, "jobs": args.jobs,
                        "points": list(summary.point_configs)},
                records=load_records(args.results_dir, name))
            if warning:
                print(warning, file=sys.stderr)

    try:
        # --jobs N: one pool over all the experiments' points (costliest first); --jobs 1:
        # one experiment after another. Either way a summary line as each one completes.
        run_experiments(names, options, pool, on_summary=report)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: finished points are stored; rerun the same command to resume",
              file=sys.stderr)
        return 130
    finally:
        stop_pool(pool, interrupted=interrupted)
    print(f"done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return status


def cmd_plot(args: argparse.Namespace) -> int:
    from repro.analysis import load_records
    from repro.report import claims_frame, collect_claims
    from repro.wandb_log import log_to_wandb

    status = 0
    for name in expand_names(args.names, args.registry):
        exp = resolve_experiment(name, args.registry)
        records = load_records(args.results_dir, name)
        out_dir = args.results_dir / name
        for old in out_dir.glob("*.png"):
            old.unlink()  # a figure the current code no longer makes must not linger
        try:
            figures = exp.plot(records, out_dir)
        except Exception as exc:  # noqa: BLE001 - report and continue with the others
            print(f"{name}: plotting failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: {len(figures)} figure(s) in {out_dir}", file=sys.stderr)
        collected = collect_claims(args.results_dir, args.registry, [name])
        warning = log_to_wandb(mode=args.wandb, results_dir=args.results_dir, experiment=name,
                               job_type="plot", config={"records": len(records)},
                               figures=figures, claims=claims_frame(collected))
        if warning:
            print(warning, file=sys.stderr)
    return status


def cmd_report(args: argparse.Namespace) -> int:
    from repro.report import write_report

    path = write_report(args.results_dir, args.registry)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from repro.drift import compare_experiment, format_drift

    if not args.rtol >= 0 or args.rtol == float("inf"):
        print(f"error: --rtol must be a finite number >= 0, got {args.rtol}", file=sys.stderr)
        return 2
    if args.results_dir.resolve() == args.against.resolve():
        print("error: --results-dir (the fresh records) and --against (the reference) are the "
              f"same directory {str(args.against)!r}", file=sys.stderr)
        return 2
    points = identical = 0
    drifted: list[str] = []
    for name in expand_names(args.names, args.registry):
        drift = compare_experiment(name, args.results_dir, args.against,
                                   registry=args.registry, backend=args.backend)
        if drift is None:
            continue
        print(format_drift(drift, args.rtol))
        points += drift.points
        identical += drift.identical
        if not drift.ok(args.rtol):
            drifted.append(name)
    if points == 0:
        print(f"compare: nothing to compare: no fresh records in {str(args.results_dir)!r} "
              f"match reference records in {str(args.against)!r}", file=sys.stderr)
        return 4
    print(f"{identical} of {points} points identical (wall-clock columns aside)")
    if drifted:
        print(f"compare: {len(drifted)} experiment(s) drifted beyond rtol {args.rtol:g}: "
              f"{', '.join(drifted)}", file=sys.stderr)
        return 4
    return 0


def cmd_golden(args: argparse.Namespace) -> int:
    from repro.golden import compute_headlines, read_golden, regressions, write_golden

    if not args.update and not any(read_golden(args.results_dir).values()):
        # Checking against nothing must not say "ok", and is known before the sweeps run.
        print(f"regression: no golden headlines to compare with in "
              f"{str(args.results_dir / 'golden')!r}: run `python -m repro golden --update` "
              "first", file=sys.stderr)
        print("golden: 1 regression(s)", file=sys.stderr)
        return 3
    current = compute_headlines(jobs=args.jobs, registry=args.registry)
    if args.update:
        for path in write_golden(current, args.results_dir):
            print(f"wrote {path}", file=sys.stderr)
        return 0
    problems = regressions(current, read_golden(args.results_dir))
    for problem in problems:
        print(f"regression: {problem}", file=sys.stderr)
    print("golden: ok" if not problems else f"golden: {len(problems)} regression(s)", file=sys.stderr)
    return 3 if problems else 0


def _unwritable(results_dir: Path) -> str:
    """Why ``results_dir`` cannot hold records ('' when it can), found before any work: a
    probe file is created and removed, which also catches read-only mounts (and works as root,
    where permission bits say nothing)."""
    import tempfile

    try:
        results_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=results_dir):
            pass
    except OSError as exc:
        return f"not a writable directory ({exc.strerror or exc})"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        print(f"--jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    handlers = {"list": cmd_list, "run": cmd_run, "plot": cmd_plot, "report": cmd_report,
                "golden": cmd_golden, "compare": cmd_compare}
    read_only = args.command in ("list", "compare") or (args.command == "golden"
                                                         and not args.update)
    if not read_only:
        problem = _unwritable(args.results_dir)
        if problem:
            print(f"error: --results-dir {str(args.results_dir)!r}: {problem}", file=sys.stderr)
            return 2
    try:
        if hasattr(args, "names"):
            expand_names(args.names, args.registry)  # unknown names: a usage error, up front
        if args.command != "list":
            experiment_names(args.registry)
    except (ValueError, ModuleNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
