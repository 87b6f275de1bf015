"""``slimpack validate``: the cost model and simulator against published training runs."""

from __future__ import annotations

import argparse

from slimpack.jsonio import strict_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate", help="simulate the published Megatron-LM A100 runs and compare",
        description=("Express every measured record of datasets/validation/ (or --records), "
                     "simulate it with the kernel-grounded cost model and print predicted vs "
                     "published in the source's FLOP convention; skipped records with reasons."))
    p.add_argument("--records", default=None, help="validation JSON (default: the shipped file)")
    p.add_argument("--json", action="store_true", help="rows, skipped records and summary as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from slimpack.validation import load_records, validate
    from slimpack.validation.megatron import format_report

    report = validate(load_records(args.records))
    if args.json:
        print(strict_json({"rows": [r.as_dict() for r in report.rows],
                          "skipped": [{"record": s.record_id, "reason": s.reason}
                                      for s in report.skipped],
                          "summary": report.summary()}, indent=2))
    else:
        print(format_report(report))
    return 0
