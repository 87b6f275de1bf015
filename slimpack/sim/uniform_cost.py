"""A cost model where every unit costs the same, for closed-form validation.

Real costs depend on tokens and KV prefixes; the textbook bubble formulas assume they do not.
``UniformCostModel`` prices any unit's layer at constant forward/backward seconds and makes
all communication free, so a simulated uniform plan must match those formulas exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from slimpack.cost.comm import CommModel
from slimpack.cost.flops import Piece
from slimpack.cost.model import ZERO_TIMES, PassTimes
from slimpack.specs.hardware import HardwareSpec, hardware_preset
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class FreeCommModel(CommModel):
    """Every collective and point-to-point transfer takes zero seconds."""

    def time(self, kind: str, bytes_: float, group_size: int, *, intra_node: bool) -> float:
        return 0.0


@dataclass(frozen=True, kw_only=True)
class UniformCostModel:
    """Constant seconds per layer per unit, whatever its tokens; free head and comms."""

    model: ModelSpec
    hardware: HardwareSpec = field(default_factory=lambda: hardware_preset("h100-80g"))
    forward_s: float = 1e-3
    """Forward seconds of one layer for one unit."""
    backward_s: float = 2e-3
    """Backward seconds of one layer for one unit."""
    comm: CommModel = field(init=False)

    def __post_init__(self) -> None:
        if self.forward_s <= 0 or self.backward_s <= 0:
            raise ValueError(f"forward_s and backward_s must be > 0, got {self.forward_s}, "
                             f"{self.backward_s}")
        object.__setattr__(self, "comm", FreeCommModel(hardware=self.hardware))

    def layer_times(self, pieces: Sequence[Piece], *, tp: int = 1,
                    recompute: str = "none") -> PassTimes:
        if not any(tokens > 0 for tokens, _ in pieces):
            return ZERO_TIMES
        return PassTimes(forward_s=self.forward_s, backward_s=self.backward_s)

    def head_times(self, tokens: int, *, tp: int = 1, vocab_shards: int = 1) -> PassTimes:
        return ZERO_TIMES
