"""The operation a pipeline stage executes, shared by the simulator and the runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
