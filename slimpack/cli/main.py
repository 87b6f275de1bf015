"""Entry point of the ``slimpack`` console script.

Each subcommand lives in its own module under ``slimpack.cli`` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` (a function taking the
parsed namespace and returning an exit code). Adding a subcommand means adding a module and
one name to ``SUBCOMMAND_MODULES``; modules that are missing or fail to import are reported,
not silently skipped, so a broken subcommand never hides.

The subcommands that name methods (``METHOD_SUBCOMMAND_MODULES``) take the method registry as
``register(subparsers, registry=...)``: :func:`main` passes the one it is given, so a caller
with its own methods (``DEFAULT_METHODS.with_methods(spec)``) gets them in every choice,
listing and planner lookup without touching a global.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from slimpack.methods import DEFAULT_METHODS, MethodRegistry

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "slimpack.cli.memory",
    "slimpack.cli.data",
    "slimpack.cli.simulate",
    "slimpack.cli.plan",
    "slimpack.cli.run",
    "slimpack.cli.validate",
)
METHOD_SUBCOMMAND_MODULES: tuple[str, ...] = ("slimpack.cli.plan",)
"""Subcommand modules whose ``register`` takes ``registry`` (plan, compare, methods)."""


def build_parser(registry: MethodRegistry = DEFAULT_METHODS) -> argparse.ArgumentParser:
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
        if module_name in METHOD_SUBCOMMAND_MODULES:
            module.register(subparsers, registry=registry)
        else:
            module.register(subparsers)
    return parser


def main(argv: list[str] | None = None, registry: MethodRegistry = DEFAULT_METHODS) -> int:
    parser = build_parser(registry)
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
