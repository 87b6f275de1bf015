"""``KernelCostModel``: a :class:`~slimpack.cost.model.CostModel` built from kernel models.

Each layer is priced as the kernels Megatron-LM launches for it, on one GPU of a ``tp``-way
tensor group: the four GEMMs of the linear layers (forward; data- and weight-gradient GEMMs
backward) through :func:`~slimpack.cost.kernels.gemm_seconds`, attention through the
FlashAttention model (per document, forward and backward separately) or, for
``attention_kernel="unfused"``, as Megatron-LM 2021-22 ran it (batched QK^T and PV GEMMs plus
a memory-bound softmax/dropout over the s x s scores), the memory-bound elementwise work
(norms, residual adds, activation function, dropout), and tensor-parallel communication.
The recipe (precision, sequence parallelism, overlap, ZeRO stage) comes from a
:class:`~slimpack.specs.training.TrainingSpec`.

``gemm_scale``, ``attention_fwd_scale``, ``attention_bwd_scale`` and ``network_scale``
multiply the corresponding efficiencies/bandwidths (1.0 = as fitted): the robustness
experiment perturbs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from slimpack.cost import kernels as K
from slimpack.cost.comm import CommModel
from slimpack.cost.flops import Piece, as_piece_list
from slimpack.cost.model import ZERO_TIMES, PassTimes
from slimpack.specs.hardware import HardwareSpec
from slimpack.specs.model import ModelSpec
from slimpack.specs.recompute import check_recompute
from slimpack.specs.training import TrainingSpec

BF16 = 2
FP8_CAST_BYTES = 4
"""HBM bytes per element of one Transformer Engine ``cast_transpose``: read bf16 (2 B), write
the fp8 tensor and its transpose (1 B each)."""
OPTIMIZER_BYTES_PER_PARAM = 34
"""Adam step on one parameter of the local shard, fp32 master weights: read master, m, v,
gradient (16 B), write master, m, v (12 B) and the bf16 copy (2 B), plus one more read of the
gradient for the global norm (4 B)."""


@dataclass(frozen=True, kw_only=True)
class KernelCostModel:
    """Kernel-grounded pricing (docs/cost-model.md, "Kernel-level model")."""

    model: ModelSpec
    hardware: HardwareSpec
    training: TrainingSpec = field(default_factory=TrainingSpec)
    gemm_scale: float = 1.0
    attention_fwd_scale: float = 1.0
    attention_bwd_scale: float = 1.0
    network_scale: float = 1.0
    comm: CommModel = field(init=False)
    _token_cache: dict = field(init=False, repr=False, compare=False)
    """(tokens, tp) -> the token-only part of a layer (GEMMs, elementwise, TP comm): planners
    price the same unit sizes many times."""
    _attn: K.AttentionConstants | None = field(init=False, repr=False, compare=False)
    """FlashAttention constants: ``None`` (the hardware family's) unless the recipe names
    FlashAttention-2-class kernels on Hopper."""
    _head_cache: dict = field(init=False, repr=False, compare=False)
    """(tokens, tp, vocab_shards) -> :meth:`head_times`: the simulator prices the head of
    every unit, and units repeat token counts across groups and layouts."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_token_cache", {})
        object.__setattr__(self, "_head_cache", {})
        object.__setattr__(self, "_attn", K.ATTENTION_CONSTANTS["hopper-fa2"]
                           if self.hardware.kernel_family == "hopper"
                           and self.training.hopper_attention == "fa2" else None)
        for name in ("gemm_scale", "attention_fwd_scale", "attention_bwd_scale",
                     "network_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"KernelCostModel.{name} must be > 0, got {getattr(self, name)!r}")
        if self.training.dtype == "fp8" and self.hardware.peak_fp8_tflops <= 0:
            raise ValueError(f"TrainingSpec.dtype='fp8' needs FP8 tensor cores; "
                             f"{self.hardware.name} has none")
        # Collectives run at NCCL's measured bus bandwidth, not the link's datasheet rate.
        hw = self.hardware
        intra, inter = K.NETWORK_EFFICIENCY[hw.kernel_family]
        hw = replace(hw, intra_node_gbps=hw.intra_node_gbps * intra * self.network_scale,
                     inter_node_gbps=hw.inter_node_gbps * inter * self.network_scale)
        object.__setattr__(self, "comm", CommModel(hardware=hw))

    # -- kernels -----------------------------------------------------------------------------
    def _gemm(self, m: float, n: float, k: float, batch: int = 1,
              dtype: str | None = None) -> float:
        """A GEMM in the recipe's precision (``dtype`` overrides: the LM head stays bf16):
        the tile/wave model, never faster than the measured sustained matmul throughput
        (:func:`~slimpack.cost.kernels.capped_gemm_seconds`)."""
        dtype = self.training.dtype if dtype is None else dtype
        seconds = K.capped_gemm_seconds(self.hardware, int(m), int(n), int(k), batch=batch,
                                        dtype=dtype)
        return seconds / self.gemm_scale

    def _linear_shapes(self, tokens: int, tp: int) -> list[tuple[int, int, int]]:
        """(m, n, k) of the forward GEMMs of one layer on one TP rank (fused QKV, out
        projection, fused gate+up or up, down)."""
        mdl = self.model
        kv = max(mdl.kv_dim / tp, mdl.head_dim)  # KV heads replicate past tp
        rows = tokens * mdl.moe_top_k
        up = (mdl.mlp_matrices - 1) * mdl.ffn_hidden / tp
        return [(tokens, int(mdl.q_dim / tp + 2 * kv), mdl.hidden),
                (tokens, mdl.hidden, int(mdl.q_dim / tp)),
                (rows, int(up), mdl.hidden),
                (rows, mdl.hidden, int(mdl.ffn_hidden / tp))]

    def linear_times(self, tokens: int, tp: int = 1) -> PassTimes:
        """GEMMs of one layer: forward, and backward = data-gradient + weight-gradient."""
        fwd = bwd = 0.0
        for m, n, k in self._linear_shapes(tokens, tp):
            fwd += self._gemm(m, n, k)
            bwd += self._gemm(m, k, n) + self._gemm(k, n, m)
        return PassTimes(forward_s=fwd, backward_s=bwd)

    def fp8_cast_times(self, tokens: int, tp: int = 1) -> PassTimes:
        """Transformer Engine's FP8 casts of one layer (0 for bf16), memory-bound.

        TE casts each FP8 GEMM operand with ``cast_transpose`` (read bf16, write the fp8 tensor
        and its fp8 transpose for the weight-gradient GEMM, amax taken in the same pass):
        ``FP8_CAST_BYTES`` = 4 B per element. Forward: the inputs of the out-projection and of
        the down-projection (the QKV and up-projection inputs come out of the fused norm
        already in fp8, TE's LayerNormLinear: no extra pass); backward: the incoming output
        gradient of all four GEMMs. Weights are cast once per step (first micro-batch), not
        priced per layer."""
        if self.training.dtype != "fp8":
            return ZERO_TIMES
        shapes = self._linear_shapes(tokens, tp)
        fwd = sum(m * k for m, _, k in (shapes[1], shapes[3]))
        bwd = sum(m * n for m, n, _ in shapes)
        return PassTimes(forward_s=K.memory_seconds(self.hardware, fwd * FP8_CAST_BYTES),
                         backward_s=K.memory_seconds(self.hardware, bwd * FP8_CAST_BYTES))

    def overlapped_tp_times(self, tokens: int, tp: int) -> PassTimes:
        """GEMMs plus TP communication of one layer with userbuffers-style overlap.

        Transformer Engine splits each all-gather + GEMM (and GEMM + reduce-scatter) into
        ``tp`` ring steps: ``tp`` GEMMs of ``m/tp`` rows run while the next chunk travels, so
        a pair costs ``max(tp * gemm(m/tp), comm) + comm/tp`` (the smaller GEMMs' own tile and
        wave efficiency, and one chunk's transfer that nothing hides: the first all-gather
        chunk or the last reduce-scatter chunk). Forward pairs: AG+QKV, proj+RS, AG+up,
        down+RS; backward: the data-gradient GEMMs with the mirrored collectives; the
        weight-gradient GEMMs run whole."""
        shapes = self._linear_shapes(tokens, tp)
        c = self.tp_comm_seconds(tokens, tp) / 4  # one AG or RS of the layer activations
        chunk = -(-tokens // tp)
        fwd = bwd = 0.0
        for m, n, k in shapes:
            fwd += max(tp * self._gemm(m * chunk / tokens, n, k), c) + c / tp
            bwd += max(tp * self._gemm(m * chunk / tokens, k, n), c) + c / tp
            bwd += self._gemm(k, n, m)
        return PassTimes(forward_s=fwd, backward_s=bwd)

    def attention_times(self, pieces: Sequence[Piece], tp: int = 1) -> PassTimes:
        mdl, hw = self.model, self.hardware
        heads = mdl.num_heads / tp
        if self.training.attention_kernel == "flash":
            tiles, queries = K.attention_work(pieces)
            f = K.attention_seconds_of_work(hw, tiles, queries, heads=heads,
                                            head_dim=mdl.head_dim, backward=False,
                                            consts=self._attn)
            b = K.attention_seconds_of_work(hw, tiles, queries, heads=heads,
                                            head_dim=mdl.head_dim, backward=True,
                                            consts=self._attn)
            return PassTimes(forward_s=f / self.attention_fwd_scale,
                             backward_s=b / self.attention_bwd_scale)
        # Unfused: the full s x s scores are computed (masking does not skip work).
        if isinstance(pieces, np.ndarray):
            pieces = [(int(t), int(p)) for t, p in pieces.tolist()]
        d, nh = mdl.head_dim, max(int(round(heads)), 1)
        fwd = bwd = 0.0
        for t, p in pieces:
            s = t + p
            fwd += self._gemm(t, s, d, nh) + self._gemm(t, d, s, nh)
            bwd += (self._gemm(t, d, s, nh) + self._gemm(s, d, t, nh)
                    + self._gemm(t, s, d, nh) + self._gemm(s, d, t, nh))
            scores = nh * t * s
            # scale-mask-softmax: read + write 2 B; dropout: read, write, 1 B mask.
            f_bytes = scores * (4 + (5 if self.training.dropout else 0))
            b_bytes = scores * (6 + (5 if self.training.dropout else 0))
            fwd += K.memory_seconds(hw, f_bytes)
            bwd += K.memory_seconds(hw, b_bytes)
        return PassTimes(forward_s=fwd / self.attention_fwd_scale,
                         backward_s=bwd / self.attention_bwd_scale)

    def elementwise_times(self, tokens: int, tp: int = 1) -> PassTimes:
        """Memory-bound work of one layer: two norms (read+write h), two residual adds (read
        2h, write h), dropout masks, the MLP activation, the rotary embedding of q and k
        (:meth:`rope_bytes_per_token`); backward moves about twice the bytes of the others
        (*reconstructed* op count). Without sequence parallelism the norms, residuals and
        dropouts run replicated on every TP rank."""
        mdl, tr = self.model, self.training
        h, ffn = mdl.hidden, mdl.ffn_hidden * mdl.moe_top_k
        replicated = 2 * 4 * h + 2 * 6 * h + (2 * 1 * h if tr.dropout else 0)
        act = (6 if mdl.mlp == "swiglu" else 4) * ffn
        per_token = replicated / (tp if tr.sequence_parallel else 1) + act / tp
        f = K.memory_seconds(self.hardware, tokens * per_token * BF16 / 2)
        rope = K.memory_seconds(self.hardware, tokens * self.rope_bytes_per_token(tp))
        return PassTimes(forward_s=f + rope, backward_s=2 * f + rope)

    def moe_routing_times(self, tokens: int, tp: int = 1) -> PassTimes:
        """An MoE layer's router and token permutation (0 for a dense model): the router GEMM
        (``hidden x num_experts``, bf16: it stays outside Transformer Engine's fp8 region),
        then the fused permute (read a token, write its ``top_k`` routed copies) and unpermute
        (read the copies, write the weighted sum), each memory-bound on bf16 rows;
        backward moves the same bytes and runs the router's two gradient GEMMs. Source of
        the kernel sequence: Megatron-Core's ``MoEAlltoAllTokenDispatcher`` with
        ``moe_permute_fusion`` (Transformer Engine's ``moe_permute``/``moe_unpermute``). The
        expert GEMMs are :meth:`linear_times`' rows (``tokens * top_k``, priced as one GEMM
        of all routed rows: balanced routing, grouped-GEMM tile effects not modelled)."""
        mdl = self.model
        if not mdl.is_moe:
            return ZERO_TIMES
        rows = tokens / tp
        permute = K.memory_seconds(self.hardware,
                                   rows * 2 * (1 + mdl.moe_top_k) * mdl.hidden * BF16)
        fwd = self._gemm(rows, mdl.num_experts, mdl.hidden, dtype="bf16") + permute
        bwd = (self._gemm(rows, mdl.hidden, mdl.num_experts, dtype="bf16")
               + self._gemm(mdl.hidden, mdl.num_experts, rows, dtype="bf16") + permute)
        return PassTimes(forward_s=fwd, backward_s=bwd)

    def rope_bytes_per_token(self, tp: int = 1) -> float:
        """Rotary embedding of one token's queries and keys on one TP rank (0 without RoPE):
        the fused kernel reads and writes them in bf16, 4 B per element, forward and again on
        their gradients backward; KV heads replicate past tp."""
        mdl = self.model
        if not mdl.rope:
            return 0.0
        return 2 * BF16 * (mdl.q_dim / tp + max(mdl.kv_dim / tp, mdl.head_dim))

    def tp_comm_seconds(self, tokens: int, tp: int) -> float:
        """Per pass: two all-reduces of the layer's activations, or with sequence parallelism
        two all-gathers and two reduce-scatters (the same ring volume)."""
        if tp <= 1:
            return 0.0
        nbytes = tokens * self.model.hidden * BF16
        if self.training.sequence_parallel:
            return 2 * (self.comm.all_gather(nbytes, tp, intra_node=True)
                        + self.comm.reduce_scatter(nbytes, tp, intra_node=True))
        return 2 * self.comm.all_reduce(nbytes, tp, intra_node=True)

    # -- CostModel ----------------------------------------------------------------------------
    def layer_times(self, pieces: Sequence[Piece], *, tp: int = 1,
                    recompute: str = "none") -> PassTimes:
        check_recompute("layer_times", recompute)
        if isinstance(pieces, np.ndarray):  # the simulator's (n, 2) arrays of CP chunks
            pieces = pieces[pieces[:, 0] > 0]
            if not len(pieces):
                return ZERO_TIMES
            tokens = int(pieces[:, 0].sum())
        else:
            pieces = [p for p in pieces if p[0] > 0]
            if not pieces:
                return ZERO_TIMES
            tokens = sum(p[0] for p in pieces)
        if self.training.attention_kernel != "flash":
            return self._combine(tokens, self.attention_times(pieces, tp), tp, recompute)
        tiles, queries = K.attention_work(pieces)
        return self._flash_layer_times(tokens, tiles, queries, tp, recompute)

    def rank_layer_times(self, per_rank: Sequence[np.ndarray], *, tp: int = 1,
                         recompute: str = "none") -> list[PassTimes]:
        """:meth:`layer_times` of each CP rank's ``(n, 2)`` piece array, summed in one numpy
        pass (a unit of a paper-size batch has thousands of chunks on each of 32 ranks)."""
        check_recompute("layer_times", recompute)
        if self.training.attention_kernel != "flash" or not per_rank:
            return [self.layer_times(r, tp=tp, recompute=recompute) for r in per_rank]
        counts = [len(r) for r in per_rank]
        if sum(counts) < K.VECTORISE_FROM:  # numpy's call overhead would dominate
            return [self.layer_times(r.tolist(), tp=tp, recompute=recompute) for r in per_rank]
        rank = np.repeat(np.arange(len(per_rank)), counts)
        pieces = np.concatenate(per_rank).reshape(-1, 2).astype(np.int64, copy=False)
        keep = pieces[:, 0] > 0
        rank, tokens, prefix = rank[keep], pieces[keep, 0], pieces[keep, 1]
        nq = -(-tokens // K.ATTN_TILE)
        tiles = nq * -(-prefix // K.ATTN_TILE) + nq * (nq + 1) // 2
        n = len(per_rank)
        # Per-rank sums; float64 holds these integers exactly (far below 2^53).
        sums = [np.bincount(rank, weights=values, minlength=n).astype(np.int64)
                for values in (tokens, tiles, nq)]
        return [ZERO_TIMES if not t else
                self._flash_layer_times(int(t), int(a), int(q), tp, recompute)
                for t, a, q in zip(*(x.tolist() for x in sums), strict=True)]

    def layer_times_of_work(self, tokens: np.ndarray, tiles: np.ndarray, queries: np.ndarray,
                            *, tp: int = 1, recompute: str = "none"
                            ) -> tuple[np.ndarray, np.ndarray] | None:
        """(forward, backward) seconds of :meth:`layer_times` for many pieces lists at once,
        each given by its sums: ``tokens``, causal key ``tiles`` visited and query tiles
        (:func:`~slimpack.cost.kernels.attention_work`), as integer arrays of one shape.
        Element for element equal to :meth:`layer_times` of the pieces (the same float
        operations in the same order; the token-only part comes from the same per token
        count cache). ``None`` when this model needs the pieces themselves (unfused
        attention prices each document's s x s scores)."""
        check_recompute("layer_times", recompute)
        if self.training.attention_kernel != "flash":
            return None
        tokens = np.asarray(tokens, dtype=np.int64)
        return self._work_times(tokens, tokens, tiles, queries, tp, recompute,
                                self.model.num_heads / tp)

    def layer_times_of_sums(self, tokens: int, tiles: int, queries: int, *, tp: int = 1,
                            recompute: str = "none") -> PassTimes | None:
        """:meth:`layer_times` of some pieces from their sums (one set of
        :meth:`layer_times_of_work`'s arguments, as Python ints): the same float operations
        in the same order, so the same seconds to the last bit. ``None`` when this model
        needs the pieces themselves (unfused attention)."""
        check_recompute("layer_times", recompute)
        if self.training.attention_kernel != "flash":
            return None
        if tokens <= 0:
            return ZERO_TIMES
        return self._flash_layer_times(tokens, tiles, queries, tp, recompute)

    def ulysses_layer_times_of_work(self, tokens: np.ndarray, tiles: np.ndarray,
                                    queries: np.ndarray, *, tp: int = 1, sp: int = 1,
                                    recompute: str = "none"
                                    ) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`ulysses_layer_times` of many units at once from their sums over all their
        pieces (:meth:`layer_times_of_work`'s arguments); element for element equal."""
        check_recompute("layer_times", recompute)
        if self.training.attention_kernel != "flash":
            return None
        tokens = np.asarray(tokens, dtype=np.int64)
        return self._work_times(tokens, -(-tokens // sp), tiles, queries, tp, recompute,
                                self.model.num_heads / (tp * sp))

    def _work_times(self, tokens: np.ndarray, linear_tokens: np.ndarray, tiles: np.ndarray,
                    queries: np.ndarray, tp: int, recompute: str,
                    heads: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_flash_layer_times` over arrays: ``linear_tokens`` through the token-only
        kernels, attention from the sums; zero where ``tokens`` is (no pieces)."""
        mdl, hw = self.model, self.hardware
        attn_f = K.attention_seconds_of_work(hw, tiles, queries, heads=heads,
                                             head_dim=mdl.head_dim, backward=False,
                                            consts=self._attn) \
            / self.attention_fwd_scale
        attn_b = K.attention_seconds_of_work(hw, tiles, queries, heads=heads,
                                             head_dim=mdl.head_dim, backward=True,
                                            consts=self._attn) \
            / self.attention_bwd_scale
        # The token-only part: one cached price per distinct token count.
        counts, where = np.unique(linear_tokens, return_inverse=True)
        parts = [self._token_part(int(n), tp) if n > 0 else ZERO_TIMES for n in counts.tolist()]
        token_f = np.array([p.forward_s for p in parts], dtype=np.float64)[where]
        token_b = np.array([p.backward_s for p in parts], dtype=np.float64)[where]
        fwd = token_f.reshape(tokens.shape) + attn_f
        bwd = token_b.reshape(tokens.shape) + attn_b
        if recompute == "full":
            bwd = bwd + fwd
        elif recompute == "selective":
            bwd = bwd + attn_f
        empty = tokens <= 0  # layer_times of no pieces: ZERO_TIMES
        return np.where(empty, 0.0, fwd), np.where(empty, 0.0, bwd)

    def ulysses_layer_times(self, pieces: Sequence[Piece] | np.ndarray, *, tp: int = 1,
                            sp: int = 1, recompute: str = "none") -> PassTimes:
        """One layer on one GPU of a Ulysses sequence-parallel group of ``sp`` tensor groups
        of ``tp`` (DeepSpeed-Ulysses, arXiv 2309.14509): each GPU runs ``1/sp`` of the
        tokens through the linear layers (with the ``tp``-way GEMMs and TP communication of
        that many tokens), then all-to-alls hand it ``1/sp`` of the heads of every token for
        attention. The all-to-alls themselves are the simulator's (``sim.costs``)."""
        check_recompute("layer_times", recompute)
        if self.training.attention_kernel != "flash":
            return self.layer_times(pieces, tp=tp * sp, recompute=recompute)
        listed = as_piece_list(pieces)
        tokens = sum(t for t, _ in listed if t > 0)
        if tokens == 0:
            return ZERO_TIMES
        tiles, queries = K.attention_work(listed)
        return self._flash_layer_times(-(-tokens // sp), tiles, queries, tp, recompute,
                                       heads=self.model.num_heads / (tp * sp))

    def _flash_layer_times(self, tokens: int, tiles: int, queries: int, tp: int,
                           recompute: str, heads: float | None = None) -> PassTimes:
        """A layer of ``tokens`` tokens at ``tp`` whose attention visits ``tiles`` key tiles
        from ``queries`` query tiles with ``heads`` heads (default: this GPU's tp share)."""
        mdl, hw = self.model, self.hardware
        heads = mdl.num_heads / tp if heads is None else heads
        attn = PassTimes(
            forward_s=K.attention_seconds_of_work(hw, tiles, queries, heads=heads,
                                                  head_dim=mdl.head_dim, backward=False,
                                            consts=self._attn)
            / self.attention_fwd_scale,
            backward_s=K.attention_seconds_of_work(hw, tiles, queries, heads=heads,
                                                   head_dim=mdl.head_dim, backward=True,
                                            consts=self._attn)
            / self.attention_bwd_scale)
        return self._combine(tokens, attn, tp, recompute)

    def _combine(self, tokens: int, attn: PassTimes, tp: int, recompute: str) -> PassTimes:
        """A layer: the token-proportional kernels (cached by token count) plus attention,
        with the recompute mode's extra forward work in backward."""
        token_part = self._token_part(tokens, tp)
        fwd = token_part.forward_s + attn.forward_s
        bwd = token_part.backward_s + attn.backward_s
        if recompute == "full":
            bwd += fwd
        elif recompute == "selective":
            # Korthikanti et al. 2022 section 4.2: the attention core is recomputed.
            bwd += attn.forward_s
        return PassTimes(forward_s=fwd, backward_s=bwd)

    def _token_part(self, tokens: int, tp: int) -> PassTimes:
        token_part = self._token_cache.get((tokens, tp))
        if token_part is None:
            token_part = self._token_times(tokens, tp)
            self._token_cache[(tokens, tp)] = token_part
        return token_part

    def _token_times(self, tokens: int, tp: int) -> PassTimes:
        """GEMMs, elementwise work, FP8 casts and (exposed) TP communication of one layer."""
        elem = self.elementwise_times(tokens, tp)
        if self.model.is_moe:
            routing = self.moe_routing_times(tokens, tp)
            elem = PassTimes(forward_s=elem.forward_s + routing.forward_s,
                             backward_s=elem.backward_s + routing.backward_s)
        cast = self.fp8_cast_times(tokens, tp)
        if self.training.tp_comm_overlap and tp > 1:
            lin_comm = self.overlapped_tp_times(tokens, tp)
        else:
            lin = self.linear_times(tokens, tp)
            comm = self.tp_comm_seconds(tokens, tp)
            lin_comm = PassTimes(forward_s=lin.forward_s + comm, backward_s=lin.backward_s + comm)
        return PassTimes(forward_s=lin_comm.forward_s + elem.forward_s + cast.forward_s,
                         backward_s=lin_comm.backward_s + elem.backward_s + cast.backward_s)

    def head_times(self, tokens: int, *, tp: int = 1, vocab_shards: int = 1) -> PassTimes:
        if tokens <= 0:
            return ZERO_TIMES
        key = (tokens, tp, vocab_shards)
        hit = self._head_cache.get(key)
        if hit is None:
            hit = self._head_cache[key] = self._head_times(tokens, tp, vocab_shards)
        return hit

    def _head_times(self, tokens: int, tp: int, vocab_shards: int) -> PassTimes:
        v = -(-self.model.vocab_size // (tp * vocab_shards))
        h = self.model.hidden
        # Logits and cross entropy in fp32: write logits, read them for softmax, write grads.
        loss = K.memory_seconds(self.hardware, tokens * v * 4 * 3)
        # The output layer runs outside Transformer Engine's fp8 region: bf16 in FP8 recipes.
        fwd = self._gemm(tokens, v, h, dtype="bf16") + loss / 2
        bwd = (self._gemm(tokens, h, v, dtype="bf16") + self._gemm(h, v, tokens, dtype="bf16")
               + loss / 2)
        return PassTimes(forward_s=fwd, backward_s=bwd)

    def optimizer_step_seconds(self, local_params: float) -> float:
        """Adam over ``local_params`` parameters (this GPU's shard): memory-bound; nothing
        with ``TrainingSpec.optimizer = "none"``."""
        if self.training.optimizer == "none":
            return 0.0
        return K.memory_seconds(self.hardware, local_params * OPTIMIZER_BYTES_PER_PARAM)


def default_cost_model(model: ModelSpec, hardware: HardwareSpec,
                       training: TrainingSpec | None = None) -> KernelCostModel:
    """The cost model every comparison uses unless the caller passes its own.

    The kernel-level model is the one validated against the published Megatron-LM runs
    (``slimpack validate``: docs/cost-model.md), so it is the one whose ratios the suite
    prints; ``AnalyticCostModel`` stays as the closed-form reference of DESIGN.md.
    """
    return KernelCostModel(model=model, hardware=hardware,
                           training=training if training is not None else TrainingSpec())
