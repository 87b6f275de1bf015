"""Equal terms for capped layout searches: every method is also tried on the layouts with
which a faster method won.

A search capped by count (``top_k``) simulates the layouts the fixed-length estimate ranks
best, which can miss the layout another method wins with. A best-layout comparison then
says "method B is faster" when B was never compared with A on B's layout. This pass closes
that hole, deterministically and bounded by counts: while some capped method is slower than
another method that fits memory, the capped one is planned and simulated on the faster
one's layout (if that layout is in its own search space), and the round repeats until no
method has an untried faster layout. Exhaustive searches are left alone: a layout they did
not simulate was pruned by a lower bound no better than their best, so it cannot win.

Works on any search answer with ``exhaustive``, ``parallel``, ``record.step_time_s``,
``record.oom`` and ``tried`` (each entry's ``parallel`` a layout dict), i.e.
:class:`slimpack.compare.SearchResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from slimpack.specs import ParallelSpec


class _Record(Protocol):
    step_time_s: float
    oom: bool


class SearchAnswer(Protocol):
    exhaustive: bool
    parallel: ParallelSpec
    record: _Record
    tried: tuple[dict[str, Any], ...]


Extend = Callable[[str, SearchAnswer, list[ParallelSpec]], SearchAnswer]
"""``extend(method, answer, layouts)``: the method's search ``answer`` after also planning and
simulating ``layouts`` (those outside its search space are skipped)."""


def _key(answer: SearchAnswer) -> tuple[bool, float]:
    return (bool(answer.record.oom), answer.record.step_time_s)


def layout_key(parallel: ParallelSpec | Mapping[str, Any]) -> tuple:
    """A layout's identity for "was it tried": its degrees, whatever form it comes in."""
    d = parallel.to_dict() if isinstance(parallel, ParallelSpec) else parallel
    return tuple(sorted(d.items()))


def try_winner_layouts(answers: Mapping[str, SearchAnswer | None],
                       extend: Extend) -> dict[str, SearchAnswer | None]:
    """The answers after the pass (module docstring). A method whose search failed (None) is
    neither extended nor a winner."""
    out = dict(answers)
    attempted: dict[str, set[tuple]] = {
        m: {layout_key(t["parallel"]) for t in a.tried if "parallel" in t}
        for m, a in out.items() if a is not None}
    # Each round gives some method at least one layout it had not attempted, and there are
    # finitely many layouts, so the loop ends; in practice after one or two rounds.
    while True:
        grew = False
        for method, answer in out.items():
            if answer is None or answer.exhaustive:
                continue
            faster = [other.parallel for name, other in out.items()
                      if name != method and other is not None and not other.record.oom
                      and _key(other) < _key(answer)]
            new: list[ParallelSpec] = []
            for layout in faster:
                key = layout_key(layout)
                if key not in attempted[method]:
                    attempted[method].add(key)
                    new.append(layout)
            if new:
                out[method] = extend(method, answer, new)
                grew = True
        if not grew:
            return out
