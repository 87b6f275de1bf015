"""``slimpack data``: statistics, profiles and plots of length distributions."""

from __future__ import annotations

import argparse
from pathlib import Path

from slimpack.data.empirical import build_empirical_profile
from slimpack.data.lengths import LengthData
from slimpack.data.profile import Profile, save_profile
from slimpack.data.readers import read_lengths
from slimpack.data.sampler import SamplerConfig, sample_lengths
from slimpack.data.sources import resolve_source, source_label
from slimpack.data.stats import compute_stats, format_stats
from slimpack.jsonio import check_output_path, strict_json

PROFILE_SAMPLE_SIZE = 1_000_000
"""Documents drawn (stratified, seed 0) to describe a profile SOURCE."""


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="length distributions: stats, profiles, plots")
    commands = data.add_subparsers(dest="data_command", metavar="DATA_COMMAND", required=True)

    stats = commands.add_parser("stats", help="statistics of a profile or a length file")
    stats.add_argument("source", metavar="SOURCE", help="profile name or path")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_reader_options(stats)
    stats.set_defaults(handler=run_stats)

    profile = commands.add_parser("profile", help="build a profile JSON from your data")
    profile.add_argument("path", metavar="PATH", help="length file or folder (CSV, JSONL, ...)")
    profile.add_argument("-o", "--output", required=True, metavar="FILE",
                         help="profile JSON to write")
    profile.add_argument("--name", default=None, help="profile name (default: file stem)")
    profile.add_argument("--description", default="", help="one line stored in the profile")
    profile.add_argument("--provenance", default="", help="where the data came from")
    profile.add_argument("--licence", default="unknown (set --licence)",
                         help="the data's licence, stored in the profile")
    profile.add_argument("--truncation", default="split", choices=("split", "truncate", "drop"),
                         help="default handling of documents longer than the context "
                              "(default split)")
    _add_reader_options(profile)
    profile.set_defaults(handler=run_profile)

    plot = commands.add_parser("plot", help="plot distributions side by side (PNG)")
    plot.add_argument("sources", metavar="SOURCE", nargs="+", help="profile names or paths")
    plot.add_argument("-o", "--output", required=True, metavar="FILE.png", help="PNG to write")
    _add_reader_options(plot)
    plot.set_defaults(handler=run_plot)


def _add_reader_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--column", default=None, help="length column of a table")
    parser.add_argument("--text-column", default=None, help="count tokens of this text column")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="Hugging Face tokenizer for --text-column (needs transformers); "
        "default: bytes/4 estimate",
    )


def _lengths_of(source: str, args: argparse.Namespace) -> LengthData:
    resolved = resolve_source(
        source, column=args.column, text_column=args.text_column, tokenizer=args.tokenizer
    )
    if isinstance(resolved, Profile):
        config = SamplerConfig(num_sequences=PROFILE_SAMPLE_SIZE, seed=0, sampling="stratified")
        return LengthData(
            lengths=sample_lengths(resolved, config),
            source=source_label(resolved),
            method=f"{PROFILE_SAMPLE_SIZE:,} documents sampled from the {resolved.kind} "
            "profile (stratified, seed 0)",
        )
    return resolved


def run_stats(args: argparse.Namespace) -> int:
    data = _lengths_of(args.source, args)
    stats = compute_stats(data.lengths)
    if args.json:
        print(strict_json({"source": data.source, "method": data.method, **stats.to_dict()},
                         indent=1))
    else:
        print(format_stats(stats, source=data.source, method=data.method))
    return 0


def run_profile(args: argparse.Namespace) -> int:
    check_output_path("-o/--output", args.output, create_parent=True)
    data = read_lengths(
        args.path, column=args.column, text_column=args.text_column, tokenizer=args.tokenizer
    )
    name = args.name or Path(args.path).stem
    profile = build_empirical_profile(
        data.lengths,
        name=name,
        description=args.description or f"Lengths of {data.source} ({data.method})",
        provenance=args.provenance or f"built by 'slimpack data profile' from {data.source}",
        licence=args.licence,
        default_truncation=args.truncation,
    )
    path = save_profile(profile, args.output)
    print(f"wrote profile {name!r} ({len(data):,} documents) to {path}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    check_output_path("-o/--output", args.output, create_parent=True)
    from slimpack.data.plot import plot_distributions

    named = {}
    for source in args.sources:
        data = _lengths_of(source, args)
        named[source_label_short(data.source)] = data.lengths
    path = plot_distributions(named, args.output)
    print(f"wrote {path}")
    return 0


def source_label_short(label: str) -> str:
    return Path(label).name if "/" in label else label
