"""The cost-model interface and its analytic (roofline) implementation.

Planners and the simulator price work only through :class:`CostModel`, so a calibrated
implementation built from runtime profiles (``slimpack profile``) can replace the analytic one
without touching them. Times are seconds on one GPU; work is given per device as pieces
``(tokens, kv_prefix)`` (see :mod:`slimpack.cost.flops`), so callers that shard work over CP
ranks describe each rank's actual share.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from slimpack.cost.comm import CommModel
from slimpack.cost.flops import Piece, as_piece_list, head_flops, linear_flops_per_token
from slimpack.specs.hardware import HardwareSpec
from slimpack.specs.model import ModelSpec
from slimpack.specs.recompute import check_recompute
from slimpack.specs.training import TrainingSpec

TILE = 128
"""FlashAttention's query/key tile edge, in tokens."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PassTimes:
    """Forward and backward seconds of some work (backward includes any recompute)."""

    forward_s: float
    backward_s: float

    def __add__(self, other: PassTimes) -> PassTimes:
        return PassTimes(forward_s=self.forward_s + other.forward_s,
                         backward_s=self.backward_s + other.backward_s)

    def scaled(self, factor: float) -> PassTimes:
        return PassTimes(forward_s=self.forward_s * factor, backward_s=self.backward_s * factor)


ZERO_TIMES = PassTimes(forward_s=0.0, backward_s=0.0)


@runtime_checkable
class CostModel(Protocol):
    """What every planner and the simulator may ask about time."""

    model: ModelSpec
    hardware: HardwareSpec
    comm: CommModel

    def layer_times(self, pieces: Sequence[Piece], *, tp: int = 1,
                    recompute: str = "none") -> PassTimes:
        """One transformer layer over ``pieces`` on one GPU of a ``tp``-way tensor group."""
        ...

    def head_times(self, tokens: int, *, tp: int = 1, vocab_shards: int = 1) -> PassTimes:
        """LM head + loss over ``tokens`` tokens, vocabulary split ``tp*vocab_shards`` ways."""
        ...


def rank_layer_times(cost: CostModel, per_rank: Sequence[Sequence[Piece]], *, tp: int = 1,
                     recompute: str = "none") -> list[PassTimes]:
    """:meth:`CostModel.layer_times` of every CP rank's pieces; a cost model with a batched
    ``rank_layer_times`` (the kernel-level model, for numpy piece arrays) prices them in one
    pass with the same result."""
    batched = getattr(cost, "rank_layer_times", None)
    if batched is not None and all(hasattr(r, "shape") for r in per_rank):
        return batched(per_rank, tp=tp, recompute=recompute)
    return [cost.layer_times(r, tp=tp, recompute=recompute) for r in per_rank]


@dataclass(frozen=True, kw_only=True)
class AnalyticCostModel:
    """Roofline pricing: FLOPs / (peak * efficiency), with efficiency falling for small work.

    The backward ratios are kept separate because their gap is what asymmetric forward and
    backward MicroPacks exploit: linear layers take 2x their forward FLOPs backward, causal
    FlashAttention about 2.5x (its backward recomputes the softmax).
    """

    model: ModelSpec
    hardware: HardwareSpec
    backward_linear_ratio: float = 2.0
    backward_attention_ratio: float = 2.5
    kernel_overhead_s: float = 40e-6
    """Fixed launch and synchronisation cost per layer per pass (about a dozen kernels)."""
    tp_comm: bool = True
    """Price the sequence-parallel all-gather/reduce-scatter of each layer (2 fwd, 2 bwd)."""
    comm: CommModel = field(init=False)

    def __post_init__(self) -> None:
        if self.backward_linear_ratio <= 0 or self.backward_attention_ratio <= 0:
            raise ValueError("backward_linear_ratio and backward_attention_ratio must be > 0")
        object.__setattr__(self, "comm", CommModel(hardware=self.hardware))

    # -- efficiency -------------------------------------------------------------------------
    def _gemm_rate(self, rows: float) -> float:
        hw = self.hardware
        saturation = rows / (rows + hw.half_efficiency_tokens) if rows > 0 else 1.0
        return hw.peak_flops * hw.gemm_efficiency * saturation

    @property
    def _attention_rate(self) -> float:
        return self.hardware.peak_flops * self.hardware.attention_efficiency

    def linear_seconds(self, flops: float, *, rows: float) -> float:
        """Seconds for GEMM FLOPs over a packed buffer of ``rows`` tokens."""
        return flops / self._gemm_rate(rows) if flops else 0.0

    def attention_seconds(self, pieces: Sequence[Piece], *, tp: int = 1) -> float:
        """Forward seconds of causal attention over ``pieces`` (one varlen kernel).

        FlashAttention computes whole 128x128 (query, key) tiles, each document on its own
        (varlen), so a document costs the tiles it touches, not its causal pairs: short
        documents waste most of each tile, long ones almost none. Query tile t of a piece
        with q tokens and prefix p reaches key tile ``(p + 128*(t+1))/128``, giving about
        ``nq*ceil(p/128) + nq*(nq+1)/2`` tiles for ``nq = ceil(q/128)``.
        """
        tiles = 0.0
        for tokens, prefix in pieces:
            nq = -(-tokens // TILE)
            tiles += nq * -(-prefix // TILE) + nq * (nq + 1) / 2
        flops = 4.0 * self.model.q_dim * tiles * TILE * TILE / tp
        return flops / self._attention_rate

    # -- CostModel ----------------------------------------------------------------------------
    def layer_times(self, pieces: Sequence[Piece], *, tp: int = 1,
                    recompute: str = "none") -> PassTimes:
        check_recompute("layer_times", recompute)
        pieces = [(t, p) for t, p in as_piece_list(pieces) if t > 0]
        if not pieces:
            return ZERO_TIMES
        tokens = sum(p[0] for p in pieces)
        linear_flops = linear_flops_per_token(self.model) * tokens / tp
        # Sequence parallelism: each TP rank's GEMMs run over all the unit's rows.
        fwd_linear = self.linear_seconds(linear_flops, rows=tokens)
        fwd_attention = self.attention_seconds(pieces, tp=tp)
        fwd = fwd_linear + fwd_attention
        bwd = (self.backward_linear_ratio * fwd_linear
               + self.backward_attention_ratio * fwd_attention)
        if recompute == "full":
            bwd += fwd
        elif recompute == "selective":
            # SwiGLU activation recompute is elementwise: price it as a memory pass.
            bwd += tokens * self.model.ffn_hidden * self.model.moe_top_k * 2 * 3 / tp / (
                self.hardware.hbm_tbps * 1e12)
        fwd += self.kernel_overhead_s
        bwd += 2 * self.kernel_overhead_s
        if self.tp_comm and tp > 1:
            # Sequence parallelism: all-gather before and reduce-scatter after both the
            # attention and the MLP block, on the layer's bf16 hidden states.
            nbytes = tokens * self.model.hidden * 2
            one = self.comm.all_gather(nbytes, tp, intra_node=True)
            fwd += 4 * one
            bwd += 4 * one
        return PassTimes(forward_s=fwd, backward_s=bwd)

    def layer_times_of_work(self, tokens: np.ndarray, tiles: np.ndarray, queries: np.ndarray,
                            *, tp: int = 1, recompute: str = "none"
                            ) -> tuple[np.ndarray, np.ndarray] | None:
        """(forward, backward) seconds of :meth:`layer_times` for many pieces lists at once,
        each given by its sums (integer arrays of one shape): ``tokens``, causal key
        ``tiles`` (``sum nq*ceil(p/128) + nq*(nq+1)/2``, the float sum of
        :meth:`attention_seconds` held exactly) and query tiles (unused here). Element for
        element equal to :meth:`layer_times`: the same float operations in the same order.
        ``None`` (price piece by piece) where an integer product would pass 2^53 and numpy's
        float conversion could round where Python's integer arithmetic does not."""
        check_recompute("layer_times", recompute)
        tokens = np.asarray(tokens, dtype=np.int64)
        tiles = np.asarray(tiles, dtype=np.int64)
        mdl, hw = self.model, self.hardware
        selective_bytes = mdl.ffn_hidden * mdl.moe_top_k * 2 * 3
        largest = int(tokens.max()) if tokens.size else 0
        if max(largest * max(selective_bytes, mdl.hidden * 2), int(tiles.max(initial=0)),
               largest + hw.half_efficiency_tokens) >= 2**53:
            return None
        linear_flops = linear_flops_per_token(mdl) * tokens / tp
        saturation = tokens / (tokens + hw.half_efficiency_tokens)
        with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 where empty, masked below
            fwd_linear = linear_flops / (hw.peak_flops * hw.gemm_efficiency * saturation)
        fwd_attention = 4.0 * mdl.q_dim * tiles * TILE * TILE / tp / self._attention_rate
        fwd = fwd_linear + fwd_attention
        bwd = (self.backward_linear_ratio * fwd_linear
               + self.backward_attention_ratio * fwd_attention)
        if recompute == "full":
            bwd = bwd + fwd
        elif recompute == "selective":
            bwd = bwd + tokens * selective_bytes / tp / (hw.hbm_tbps * 1e12)
        fwd = fwd + self.kernel_overhead_s
        bwd = bwd + 2 * self.kernel_overhead_s
        if self.tp_comm and tp > 1:
            counts, where = np.unique(tokens, return_inverse=True)
            one = np.array([self.comm.all_gather(n * mdl.hidden * 2, tp, intra_node=True)
                            for n in counts.tolist()], dtype=np.float64)[where]
            one = one.reshape(tokens.shape)
            fwd = fwd + 4 * one
            bwd = bwd + 4 * one
        empty = tokens <= 0  # layer_times of no pieces: ZERO_TIMES
        return np.where(empty, 0.0, fwd), np.where(empty, 0.0, bwd)

    def head_times(self, tokens: int, *, tp: int = 1, vocab_shards: int = 1) -> PassTimes:
        if tokens <= 0:
            return ZERO_TIMES
        flops = head_flops(self.model, tokens) / (tp * vocab_shards)
        fwd = self.linear_seconds(flops, rows=tokens) + self.kernel_overhead_s
        return PassTimes(forward_s=fwd, backward_s=2 * fwd)


def sequence_pieces(lengths: Iterable[int]) -> list[Piece]:
    """Whole documents, no prefix: the pieces of a packed micro-batch on one device."""
    return [(int(n), 0) for n in lengths]


def training_of(cost: CostModel) -> TrainingSpec:
    """The training recipe a cost model prices (ZeRO stage, dtype, kernels): the one place
    planners and the simulator read it, so both charge the same recipe. A cost model without
    one (the analytic reference model) prices the default recipe."""
    training = getattr(cost, "training", None)
    return training if training is not None else TrainingSpec()
