"""Alpha-beta communication times (seconds) for point-to-point and ring collectives.

``bytes_`` is always the size of the full tensor a rank ends up with (all-gather output,
all-reduce buffer) or, for all-to-all and p2p, what one rank sends. Bandwidth is per GPU per
direction; groups that span nodes run at the inter-node bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.specs.hardware import HardwareSpec

COLLECTIVES = ("p2p", "all-reduce", "all-gather", "reduce-scatter", "all-to-all")


@dataclass(frozen=True, kw_only=True)
class CommModel:
    hardware: HardwareSpec

    def _link(self, intra_node: bool) -> tuple[float, float]:
        hw = self.hardware
        if intra_node:
            return hw.intra_node_latency_s, hw.intra_node_gbps * 1e9
        return hw.inter_node_latency_s, hw.inter_node_gbps * 1e9

    def time(self, kind: str, bytes_: float, group_size: int, *, intra_node: bool) -> float:
        """Seconds for one collective of ``kind`` over ``group_size`` ranks."""
        if kind not in COLLECTIVES:
            raise ValueError(f"collective kind must be one of {COLLECTIVES}, got {kind!r}")
        if bytes_ < 0:
            raise ValueError(f"bytes_ must be >= 0, got {bytes_}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        alpha, bw = self._link(intra_node)
        if kind == "p2p":
            return alpha + bytes_ / bw
        k = group_size
        if k == 1 or bytes_ == 0:
            return 0.0
        if kind == "all-reduce":  # ring: reduce-scatter then all-gather
            return 2 * (k - 1) * alpha + 2 * (k - 1) / k * bytes_ / bw
        # all-gather, reduce-scatter, all-to-all: each rank moves (k-1)/k of the data once.
        return (k - 1) * alpha + (k - 1) / k * bytes_ / bw

    def p2p(self, bytes_: float, *, intra_node: bool) -> float:
        return self.time("p2p", bytes_, 2, intra_node=intra_node)

    def all_reduce(self, bytes_: float, group_size: int, *, intra_node: bool) -> float:
        return self.time("all-reduce", bytes_, group_size, intra_node=intra_node)

    def all_gather(self, bytes_: float, group_size: int, *, intra_node: bool) -> float:
        return self.time("all-gather", bytes_, group_size, intra_node=intra_node)

    def reduce_scatter(self, bytes_: float, group_size: int, *, intra_node: bool) -> float:
        return self.time("reduce-scatter", bytes_, group_size, intra_node=intra_node)

    def all_to_all(self, bytes_: float, group_size: int, *, intra_node: bool) -> float:
        return self.time("all-to-all", bytes_, group_size, intra_node=intra_node)
