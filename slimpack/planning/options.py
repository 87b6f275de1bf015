"""Planner options: building a frozen options dataclass from keyword values or from
command-line text (``--option key=value``), with errors that name the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def build_options(cls: type[T], method: str, options: dict[str, Any]) -> T:
    """``cls(**options)``, but an unknown name raises ValueError listing the allowed ones."""
    allowed = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{method}: unknown option(s) {unknown}; allowed: {sorted(allowed)}")
    return cls(**options)


def check_time_limit(method: str, time_limit_s: float | None) -> None:
    """A planner's ``time_limit_s``: None (no wall-clock safety net: the harness plans so, see
    :mod:`slimpack.planning.deadline`) or a finite number of seconds > 0."""
    if time_limit_s is None:
        return
    if isinstance(time_limit_s, bool) or not (isinstance(time_limit_s, int | float)
                                              and math.isfinite(time_limit_s)
                                              and time_limit_s > 0):
        raise ValueError(f"{method}: time_limit_s must be None (no wall-clock limit) or a "
                         f"finite number of seconds > 0, got {time_limit_s!r}")


def describe_options(cls: type) -> list[tuple[str, str, str]]:
    """(name, type, default) for every field of an options dataclass."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = (f.default if f.default is not dataclasses.MISSING else
                   f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
        rows.append((f.name, _type_name(hints.get(f.name, Any)), repr(default)))
    return rows


def parse_options(cls: type, method: str, pairs: list[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> typed keyword values checked against ``cls``'s annotations.

    Dashes in keys read as underscores. Ints, floats, bools (true/false), strings, literals,
    optional values (``none``) and tuples (comma-separated) are understood; an option whose
    type has no text form is refused with a ValueError naming it.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{method}: --option wants key=value, got {pair!r}")
        if key not in names:
            raise ValueError(f"{method}: unknown option {key!r}; allowed: {', '.join(names)}")
        out[key] = _parse(hints[key], text.strip(), f"{method} option {key}")
    return out


_NO_TEXT_FORM = "cannot be set from the command line"
_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


def _parse(tp: Any, text: str, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in ("none", "null", ""):
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _parse(arg, text, where)
            except ValueError as exc:
                errors.append(str(exc))
        if all(_NO_TEXT_FORM in e for e in errors):
            raise ValueError(f"{where}: type {_type_name(tp)} {_NO_TEXT_FORM} (use the Python API)")
        raise ValueError(errors[0] if len(errors) == 1 else
                         f"{where}: {text!r} is not a {_type_name(tp)}")
    if origin is typing.Literal:
        if text in args:
            return text
        raise ValueError(f"{where}: must be one of {', '.join(map(str, args))}; got {text!r}")
    if origin is tuple:
        item = args[0] if args else str
        return tuple(_parse(item, part.strip(), where) for part in text.split(",") if part.strip())
    if tp is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"{where}: must be true or false; got {text!r}")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{where}: must be an integer; got {text!r}") from None
    if tp is float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{where}: must be a number; got {text!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"{where}: must be a finite number; got {text!r}")
        return value
    if tp is str:
        return text
    raise ValueError(f"{where}: type {_type_name(tp)} {_NO_TEXT_FORM} (use the Python API)")


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")
