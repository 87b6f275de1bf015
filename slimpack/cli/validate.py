"""``slimpack validate``: the cost model and simulator against published training runs."""

from __future__ import annotations

import argparse
import os

from slimpack.jsonio import strict_json

SETS = ("dev", "hopper", "all")
"""``dev``: the published Megatron-LM A100 runs (datasets/validation/); ``hopper``: the H100
development set (slimpack/validation/hopper_published.json); ``all``: both, one after the other."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate", help="simulate published training runs (A100, Hopper) and compare",
        description=("Express every measured record of a validation set, simulate it with the "
                     "kernel-grounded cost model and print predicted vs published in the "
                     "source's own convention, with medians per hardware, precision, context "
                     "parallelism and GPU-count band; records the suite cannot express are "
                     "listed with the reason."))
    p.add_argument("--set", dest="record_set", default="dev",
                   help=f"which records: {', '.join(SETS)} (default dev: the A100 runs)")
    p.add_argument("--records", default=None,
                   help="validation JSON replacing the chosen set's shipped file (not with all)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="worker processes simulating the records (default: up to 2)")
    p.add_argument("--json", action="store_true", help="rows, skipped records and summary as JSON")
    p.set_defaults(handler=run)


def _reports(record_set: str, records: str | None, jobs: int):
    from slimpack.validation import load_records, validate
    from slimpack.validation.hopper import express_hopper, load_hopper_records

    if record_set in ("dev", "all"):
        yield "dev", validate(load_records(records if record_set == "dev" else None), jobs=jobs)
    if record_set in ("hopper", "all"):
        yield "hopper", validate(load_hopper_records(records if record_set == "hopper" else None),
                                 express_fn=express_hopper, jobs=jobs)


def run(args: argparse.Namespace) -> int:
    from slimpack.validation.megatron import breakdown, format_report

    if args.record_set not in SETS:
        print(f"slimpack validate: --set must be one of {', '.join(SETS)}; got "
              f"{args.record_set!r}")
        return 2
    if args.records is not None and args.record_set == "all":
        print("slimpack validate: --records replaces one set's file; use it with --set dev or "
              "--set hopper, not all")
        return 2
    if args.jobs < 1:
        print(f"slimpack validate: --jobs must be >= 1; got {args.jobs}")
        return 2
    reports = dict(_reports(args.record_set, args.records, args.jobs))
    if args.json:
        payload = {name: {"rows": [r.as_dict() for r in rep.rows],
                          "skipped": [{"record": s.record_id, "reason": s.reason}
                                      for s in rep.skipped],
                          "summary": rep.summary(), "breakdown": breakdown(rep)}
                   for name, rep in reports.items()}
        # One set keeps the shape it always had (rows, skipped, summary at the top level).
        print(strict_json(payload if len(payload) > 1 else payload[args.record_set], indent=2))
        return 0
    for name, rep in reports.items():
        if len(reports) > 1:
            print(f"== set {name}")
        print(format_report(rep))
    return 0
