"""The operation a pipeline stage executes, shared by the simulator and the runtime."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

OpKind = Literal["F", "B"]


_set = object.__setattr__


@dataclass(frozen=True, slots=True, init=False)
class Op:
    """Forward or backward of one unit on one model chunk of a pipeline stage.

    ``unit`` indexes ``group.forward_units`` for ``"F"`` and ``group.backward_units`` for
    ``"B"``. ``chunk`` is the virtual stage ``0..vpp-1`` on this pipeline rank: chunk ``c`` of
    rank ``s`` holds global layer block ``c*pp + s`` (Megatron-LM's interleaving), so the
    virtual stage of an op is ``chunk*pp + stage``.
    """

    kind: OpKind
    unit: int
    chunk: int

    def __init__(self, kind: OpKind, unit: int, chunk: int) -> None:
        # Written out (not generated): schedules hold ~10^5 ops, and the generated frozen
        # __init__ costs twice as much.
        _set(self, "kind", kind)
        _set(self, "unit", unit)
        _set(self, "chunk", chunk)

    def __str__(self) -> str:
        return f"{self.kind}(unit {self.unit}, chunk {self.chunk})"


def virtual_stage(stage: int, chunk: int, pp: int) -> int:
    """Index of the layer block (0 = first layers) that ``chunk`` of ``stage`` holds."""
    return chunk * pp + stage


OpArrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(is forward, unit, chunk) of each op of one stage's list."""


class OpList(Sequence[Op]):
    """One stage's op list as :func:`~slimpack.schedules.build_schedule` returns it: its ops'
    fields as read-only arrays, which the walks over 10^6 ops (memory, timing, dry run) read
    (:func:`op_arrays`), and the :class:`Op` objects made from them only when something reads
    ops (the runtime, error messages, tests): a planner's candidates, ~10^6 ops each at paper
    scale, never do. Immutable; ``list(ops)`` and ``ops + more`` are plain lists."""

    __slots__ = ("_ops", "arrays")

    def __init__(self, arrays: OpArrays) -> None:
        for array in arrays:
            array.flags.writeable = False
        self.arrays = arrays
        self._ops: list[Op] | None = None

    def _list(self) -> list[Op]:
        if self._ops is None:
            is_forward, unit, chunk = (array.tolist() for array in self.arrays)
            self._ops = [Op("F" if f else "B", u, c)
                         for f, u, c in zip(is_forward, unit, chunk, strict=True)]
        return self._ops

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - an int or a slice, as a list's
        return self._list()[index]

    def __iter__(self) -> Iterator[Op]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OpList | list | tuple):
            return self._list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment] - equal to lists, so unhashable like them

    def __add__(self, other: Iterable[Op]) -> list[Op]:
        return [*self._list(), *other]

    def __radd__(self, other: Iterable[Op]) -> list[Op]:
        return [*other, *self._list()]

    def __repr__(self) -> str:
        return f"OpList({self._list()!r})"


def op_arrays(stage_ops: list) -> OpArrays:
    """(is forward, unit, chunk) of each op of one stage's list, as arrays (an
    :class:`OpList`'s own)."""
    if type(stage_ops) is OpList:
        return stage_ops.arrays
    count = len(stage_ops)
    return (np.fromiter((op.kind == "F" for op in stage_ops), dtype=bool, count=count),
            np.fromiter((op.unit for op in stage_ops), dtype=np.int64, count=count),
            np.fromiter((op.chunk for op in stage_ops), dtype=np.int64, count=count))


def ops_in_range(is_forward: np.ndarray, unit: np.ndarray, chunk: np.ndarray, *,
                 num_forward: int, num_backward: int, vpp: int) -> bool:
    """Whether every op names a unit below ``num_forward`` (F) / ``num_backward`` (B) and a
    chunk in ``[0, vpp)``: the compiled walks (timing, memory, dry run) index their tables by
    these without bounds checks, so each caller refuses op lists that fail this first."""
    if not len(unit):
        return True
    return bool((unit >= 0).all() and (unit < np.where(is_forward, num_forward,
                                                       num_backward)).all()
                and chunk.min() >= 0 and chunk.max() < vpp)


def describe_op_ranges(unit: np.ndarray, chunk: np.ndarray, *, num_forward: int,
                       num_backward: int, vpp: int) -> str:
    """What :func:`ops_in_range` requires, and what the ops name (for the refusal)."""
    return (f"ops must name units below {num_forward} (F) / {num_backward} (B) and chunks "
            f"below vpp={vpp}; got units {unit.min()}..{unit.max()}, chunks "
            f"{chunk.min()}..{chunk.max()}")
