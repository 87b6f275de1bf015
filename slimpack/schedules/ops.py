"""The operation a pipeline stage executes, shared by the simulator and the runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OpKind = Literal["F", "B"]


@dataclass(frozen=True, slots=True)
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

    def __str__(self) -> str:
        return f"{self.kind}(unit {self.unit}, chunk {self.chunk})"


def virtual_stage(stage: int, chunk: int, pp: int) -> int:
    """Index of the layer block (0 = first layers) that ``chunk`` of ``stage`` holds."""
    return chunk * pp + stage
