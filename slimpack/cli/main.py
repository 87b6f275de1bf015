"""Entry point of the ``slimpack`` console script.

Each subcommand lives in its own module under ``slimpack.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` (a function taking the
parsed namespace and returning an exit code). Adding a subcommand means adding a module and
one name to ``SUBCOMMAND_MODULES``; modules that are missing or fail to import are reported,
not silently skipped, so a broken subcommand never hides.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "slimpack.cli.memory",
    "slimpack.cli.data",
    "slimpack.cli.simulate",
    "slimpack.cli.plan",
    "slimpack.cli.run",
    "slimpack.cli.validate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slimpack",
        description=(
            "Plan, simulate and run variable-length LLM training steps "
            "(SlimPack, SlimPipe and baselines on one plan IR)."
        ),
    )
    from slimpack import __version__

    parser.add_argument("--version", action="version", version=f"slimpack {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # subcommand not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args.handler(args) or 0)
    except ValueError as exc:
        # User errors (bad presets, bad degrees, bad files) get one clear line, not a traceback.
        print(f"slimpack {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
