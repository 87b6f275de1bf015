"""Memory model (bytes) for activations, model states, KV caches and logits (docs/cost-model.md).

Assumptions are the SlimPipe artifact's: bf16, sequence parallelism, FlashAttention, SwiGLU,
no recompute unless asked. Activation bytes per token per layer are
``a = 12*h + 4*kv_dim + 6*ffn`` (MHA: ``16*h + 6*ffn``) before dividing by tp*cp; its
``4*kv_dim`` term is the K and V tensors, so the forward KV cache of in-flight slices is part of
the activations and is reported separately only as an "of which" figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slimpack.specs.model import ModelSpec

GIB = 2**30
BF16 = 2
FP32 = 4
SCHEDULE_KINDS = ("1f1b", "interleaved", "slimpipe")
SAVED_ACTIVATION_MODELS = ("megatron", "runtime")
ADAM_FP32_BYTES = 12
"""fp32 master weight, Adam first and second moment: bytes per parameter."""
APEX_PARAM_REMAINDER_BYTES = 2
"""Apex ``distributed_fused_adam`` with ``store_param_remainders``: the low 16 bits of each fp32
master weight (the bf16 model weight holds the high 16)."""
FP8_PARAM_BYTES = 2
"""An FP8 parameter (1 B) and its cached fp8 transpose (1 B): Hopper's FP8 GEMMs take both
orientations (*reconstructed* for ``fp8_params`` from the same need as
:data:`FP8_WEIGHT_CACHE_BYTES`)."""
FP8_WEIGHT_CACHE_BYTES = 2
"""Bytes per GEMM weight Transformer Engine keeps in FP8 recipes besides the bf16 weight: the
fp8 weight and its fp8 transpose, cached between micro-batches
(``TransformerEngineBaseModule.set_fp8_weights``: ``weight1_fp8`` and ``weight1_t_fp8``;
Megatron-Core's ``TELinear`` passes ``is_first_microbatch`` unless
``disable_parameter_transpose_cache``)."""


@dataclass(frozen=True, kw_only=True)
class ActivationAccounting:
    """What the memory walk counts as a slice's saved activations, and in which dtype.

    The default (``megatron``, 2 bytes) is the suite's GPU accounting: the SlimPipe
    artifact's per-token formula (:func:`activation_bytes_per_token_per_layer`, bf16,
    FlashAttention) and the fp32 logits of the longest slice held for the whole step. Every
    planner and record uses it; nothing changes unless a caller passes another value.

    ``runtime`` counts what this suite's PyTorch runtime keeps for backward
    (:func:`runtime_slice_bytes_per_layer`: autograd's saved tensors of
    ``slimpack/runtime/model.py`` under per-document SDPA, the CPU attention path), in
    ``bytes_per_element`` (4 for the CPU runtime's fp32, 2 for bf16/fp16), so the simulator
    can be compared with the runtime's tracked activation peak
    (:mod:`slimpack.validation.activation_memory`). It models ``recompute="none"`` without
    offload, tensor parallelism at cp = 1 and ring context parallelism (per cp rank) at
    tp = 1, with the LM head on the last stage or spread over the pipeline ranks
    (:func:`runtime_spread_head_bytes`, :func:`runtime_head_logits_bytes`), and refuses the
    rest by name (docs/architecture.md, runtime, "Simulated vs
    executed activation memory").
    """

    saved: str = "megatron"
    bytes_per_element: int = BF16

    def __post_init__(self) -> None:
        if self.saved not in SAVED_ACTIVATION_MODELS:
            raise ValueError(f"ActivationAccounting.saved must be one of "
                             f"{SAVED_ACTIVATION_MODELS}, got {self.saved!r}")
        if self.bytes_per_element not in (BF16, FP32):
            raise ValueError(f"ActivationAccounting.bytes_per_element must be 2 or 4, got "
                             f"{self.bytes_per_element!r}")
        if self.saved == "megatron" and self.bytes_per_element != BF16:
            raise ValueError("ActivationAccounting: the megatron formula is bf16's (2 bytes); "
                             "use saved='runtime' for another dtype")

    @property
    def is_default(self) -> bool:
        return self == GPU_BF16


GPU_BF16 = ActivationAccounting()
"""The default accounting: every number the simulator and planners report."""


@dataclass(frozen=True, kw_only=True)
class SliceShape:
    """What the runtime's saved activations of one slice depend on besides its token count."""

    tokens: int
    """Rows of the slice (its segments' own tokens)."""
    key_tokens: int
    """Keys its attention reads, summed over segments: each segment's KV prefix plus its own
    tokens (a segment of a sequence starting at ``start`` reads ``end`` keys)."""
    pieces: int
    """Attention calls (segments) of the slice."""
    caches_kv: bool
    """A later slice of the group reads its K/V (the runtime keeps them in its KV cache)."""
    masked_scores: int = 0
    """Query x key entries of the segments that read a KV prefix: SDPA is given an explicit
    bottom-right causal mask there (``is_causal`` aligns top-left), which it keeps as a
    dense additive mask in the activation dtype."""


def runtime_slice_bytes_per_layer(model: ModelSpec, shape: SliceShape, *,
                                  bytes_per_element: int, tp: int = 1,
                                  recompute: str = "none", offload: float = 0.0) -> float:
    """Bytes one rank of the runtime keeps for backward of one slice on one decoder layer
    at context parallelism 1, read off ``DecoderLayer.forward`` (``TPDecoderLayer`` at
    tp > 1) under autograd with per-document SDPA. ``e`` = bytes per element; a tp rank
    holds ``r = ceil(T/tp)`` rows between layers and ``P = r*tp`` (padded) rows inside:

    * each RMSNorm on the rank's rows: its input in fp32 (the fp32 copy in bf16 runs), the
      fp32 ``rsqrt``, the normalised rows (``r * (4h + 4 + e*h)``), and the weight-scaled
      rows the next linears read: the rank's own at tp = 1, the all-gathered ``P`` rows at
      tp > 1 (``e*h`` each); twice per layer;
    * the roped queries of the rank's heads (``P`` rows), SDPA's output and fp32
      log-sum-exp (``T`` rows), the out-projection's input when it is a new tensor
      (several segments concatenated, or padded rows added: ``P`` rows), the SwiGLU gate,
      its SiLU, the up projection and their product (``4 * P * ffn/tp``);
    * K and V of the rank's kv heads: the very tensors the KV cache keeps when a slice has
      one segment and no prefix (``P`` rows, counted once); otherwise attention saves the
      concatenation of every segment's prefix and own keys (one row per key read) and a
      slice with later slices also keeps its own K/V in the cache (``T`` rows);
    * a segment with a KV prefix: its dense additive mask (``e`` per query x key entry);
    * with padded rows, the padded RoPE tables of the layer (``2 * P * head_dim``).

    The Megatron formula (:func:`activation_bytes_per_token_per_layer`) instead keeps bf16
    K/V and FlashAttention's statistics only, no fp32 norm inputs, three SwiGLU tensors, and
    shares every term over tp (Megatron saves the sequence-parallel share of the linears'
    inputs and gathers it again in backward).
    """
    if recompute != "none":
        raise ValueError(f"runtime activation accounting models recompute='none' only, got "
                         f"recompute={recompute!r}")
    if offload:
        raise ValueError(f"runtime activation accounting models no offload, got "
                         f"offload={offload!r}")
    e, h, t = bytes_per_element, model.hidden, shape.tokens
    rows = -(-t // tp)
    padded = rows * tp
    heads, q_dim = model.num_heads // tp, model.q_dim // tp
    kv_dim = max(1, model.num_kv_heads // tp) * model.head_dim
    linear_in = e * h * (rows if tp == 1 else padded)
    norms = 2 * (rows * (FP32 * h + FP32 + e * h) + linear_in)
    attention = e * q_dim * (padded + t) + FP32 * heads * t
    if shape.pieces > 1 or padded > t:
        attention += e * q_dim * padded
    mlp = 4 * e * padded * (model.ffn_hidden // tp)
    kv_row = 2 * kv_dim * e
    direct = shape.pieces == 1 and shape.key_tokens == t
    kv = (kv_row * padded if direct
          else kv_row * (shape.key_tokens + (t if shape.caches_kv else 0)))
    rope = 2 * padded * model.head_dim * e if padded > t else 0
    return norms + attention + mlp + kv + rope + e * shape.masked_scores


@dataclass(frozen=True, kw_only=True)
class RingShareBytes:
    """One ring-CP rank's runtime bytes for one slice (see :func:`runtime_ring_share_bytes`)."""

    rows: int
    per_layer: float
    chunk: float
    head: float
    first: float


def runtime_ring_share_bytes(model: ModelSpec, segments: Sequence[tuple[int, int, int]], *,
                             cp: int, cp_index: int, sharding: str, caches_kv: bool,
                             bytes_per_element: int) -> RingShareBytes:
    """What ring-CP rank ``cp_index`` of the runtime keeps for one slice (tp = 1),
    ``segments`` being the slice's ``(tokens, start in its sequence, buffer offset)``. The
    rank holds its rows of the slice (:func:`~slimpack.cost.cp_sharding.shard_pieces`, the
    runtime's own rule); row terms are :func:`runtime_slice_bytes_per_layer`'s on those rows,
    but attention differs: each of its row ranges is one SDPA call whose keys are the
    range's segment up to its last row plus the segment's KV prefix, gathered from the
    whole cp group, so attention saves the concatenation of every range's keys (the
    gathered K/V buffer itself when the rank has one range and it reads no prefix) and a
    dense mask per range whose keys outnumber its queries; the rank's own K/V rows are
    cached apart (they enter the all-gather, which does not keep them), and the gather
    saves its int64 row index once per slice and chunk."""
    from slimpack.cost.cp_sharding import shard_pieces

    e, h = bytes_per_element, model.hidden
    offsets = [off for _, _, off in segments]
    ranges = shard_pieces([(n, off) for n, _, off in segments], cp, sharding)[cp_index]
    rows = sum(n for n, _ in ranges)
    keys, prefixed, masked = [], [], 0
    for n, row in ranges:
        seg = max(i for i, off in enumerate(offsets) if off <= row)
        _, start, offset = segments[seg]
        lk = start + row + n - offset
        keys.append(lk)
        prefixed.append(start > 0)
        masked += n * lk if lk != n else 0
    kv_row = 2 * model.kv_dim * e
    whole_slice = sum(n for n, _, _ in segments)
    gathered = whole_slice + sum(start for _, start, _ in segments)  # slice and KV prefix
    if not ranges:
        kv = 0
    elif len(ranges) == 1 and not prefixed[0]:
        kv = kv_row * gathered  # a view of the one gathered buffer (slice and prefixes)
    else:
        kv = kv_row * sum(keys)
    if caches_kv:
        kv += kv_row * rows
    per_layer = (rows * (2 * (FP32 * h + FP32 + 2 * e * h)
                         + e * (2 * model.q_dim + 4 * model.ffn_hidden)
                         + FP32 * model.num_heads)
                 + (e * model.q_dim * rows if len(ranges) > 1 else 0) + kv + e * masked)
    return RingShareBytes(
        rows=rows, per_layer=per_layer,
        chunk=2 * rows * model.head_dim * e + 8 * gathered,
        head=(runtime_head_bytes(model, rows, bytes_per_element=e) if rows else FP32),
        first=runtime_first_block_bytes(rows, bytes_per_element=e))


def runtime_chunk_bytes(model: ModelSpec, tokens: int, *, bytes_per_element: int,
                        tp: int = 1) -> float:
    """Per slice and model chunk, layers aside: the RoPE cos/sin tables every layer's
    rotation saves (one pair per slice forward on a chunk; none when tp pads the rows, as
    each layer then saves its padded copy)."""
    if -(-tokens // tp) * tp > tokens:
        return 0.0
    return 2 * tokens * model.head_dim * bytes_per_element


def runtime_first_block_bytes(tokens: int, *, bytes_per_element: int, tp: int = 1) -> float:
    """Per slice on the chunk holding the embedding: the int64 token ids it saves (at tp > 1
    the vocab-parallel embedding's local ids and its row mask in the activation dtype)."""
    return 8 * tokens if tp == 1 else (8 + bytes_per_element) * tokens


def runtime_head_bytes(model: ModelSpec, tokens: int, *, bytes_per_element: int,
                       tp: int = 1) -> float:
    """Per slice on the chunk holding the LM head: the final norm's saved rows, the fp32
    log-softmax (tp > 1: the vocab shard's softmax) cross-entropy saves, the int64 labels
    (tp > 1: the local label ids and two boolean row masks), the loss scalar."""
    e, h = bytes_per_element, model.hidden
    rows = -(-tokens // tp)
    padded = rows * tp
    if tp == 1:
        return tokens * (FP32 * h + FP32 + 2 * e * h + FP32 * model.vocab_size + 8) + FP32
    return (rows * (FP32 * h + FP32 + e * h)
            + padded * (e * h + FP32 * model.vocab_size // tp + 8 + 2) + FP32)


def runtime_spread_head_bytes(model: ModelSpec, tokens: int, *, bytes_per_element: int,
                              tp: int = 1) -> float:
    """Per slice on the model's last block when the LM head is spread over the pipeline
    ranks (``vocab_parallel_pp`` at pp > 1, ``slimpack/runtime/vocab_parallel.py``): the
    final norm's saved rows on the rank's ``r = ceil(T/tp)`` rows (fp32 input, fp32
    ``rsqrt``, the normalised rows) and the d(hidden) the head step reduced to the last
    stage, which the slice's graph keeps until its backward (all ``P = r*tp`` gathered rows
    at tp > 1). Nothing else: the cross-entropy's forward and backward ran at once, so no
    logits, softmax or labels are saved (unlike :func:`runtime_head_bytes`)."""
    e, h = bytes_per_element, model.hidden
    rows = -(-tokens // tp)
    return rows * (FP32 * h + FP32 + e * h) + rows * tp * e * h


def runtime_head_logits_bytes(model: ModelSpec, tokens: int, *, pp: int, tp: int = 1) -> float:
    """The fp32 logits block of one slice a rank holds while it runs its part of an LM head
    spread over ``pp`` pipeline ranks (``PipelineLMHead.logits_bytes``): every row of the
    slice's hidden states the last stage broadcast (``ceil(T/tp)*tp``; ``T`` is the cp
    rank's rows at cp > 1) times the rank's ``vocab/(pp*tp)`` vocabulary block. Transient:
    freed before the head step returns."""
    rows = -(-tokens // tp) * tp
    return rows * (model.vocab_size // (pp * tp)) * FP32


def activation_bytes_per_token_per_layer(model: ModelSpec, recompute: str = "none", *,
                                         fp8: bool = False) -> int:
    """Saved activation bytes per token per layer, before tp*cp sharding.

    * ``none``: ``12h + 4*kv_dim + 6*ffn*top_k`` (SlimPipe artifact; llama-13b 164,864 B).
    * ``selective``: the SwiGLU intermediates are recomputed (``6*ffn`` -> ``2*ffn``, the MLP
      input to the down projection is kept). *Reconstructed*: Megatron's selective mode with
      FlashAttention saves little else.
    * ``full``: only each layer's bf16 input is kept (``2h``).

    ``fp8``: Transformer Engine saves the fp8 casts of the four GEMM inputs for the
    weight-gradient GEMMs instead of their bf16 copies (1 B instead of 2 per element): the QKV
    and up-projection inputs (``h`` each), the out-projection input (``h``) and the
    down-projection input (``ffn``) shrink by half, ``3h + ffn`` bytes less (none under full
    recompute, which keeps only the layer input).

    MoE: the expert GEMMs' input is each token's ``top_k`` routed copies (the permuted rows a
    grouped GEMM keeps for its weight gradient), not one: ``top_k - 1`` more hidden rows,
    ``2h`` bytes each (``h`` in fp8). Megatron-Core applies the routing probabilities after
    the activation (``moe_apply_probs_on_input`` False by default: NVIDIA/Megatron-LM
    d98e8a64dd, ``megatron/core/transformer/transformer_config.py``), so the combine keeps
    no expert outputs of its own.
    """
    h, kv, ffn = model.hidden, model.kv_dim, model.ffn_hidden * model.moe_top_k
    saved_fp8 = 3 * h + ffn if fp8 else 0
    routed_copies = (model.moe_top_k - 1) * h * (1 if fp8 else 2)
    if recompute == "none":
        return 12 * h + 4 * kv + 6 * ffn - saved_fp8 + routed_copies
    if recompute == "selective":
        return 12 * h + 4 * kv + 2 * ffn - saved_fp8 + routed_copies
    if recompute == "full":
        return 2 * h
    raise ValueError(f"recompute must be one of none, selective, full; got {recompute!r}")


def kv_bytes_per_token_per_layer(model: ModelSpec, tp: int = 1) -> float:
    """bf16 K and V of one token on one tensor-parallel rank (KV heads replicate past tp)."""
    kv_heads_per_rank = max(model.num_kv_heads / tp, 1.0)
    return 2 * BF16 * kv_heads_per_rank * model.head_dim


def inflight_units(schedule: str, *, pp: int, rank: int = 0, vpp: int = 1, slices: int = 1) -> int:
    """Peak number of activation units alive on pipeline rank ``rank`` (rank 0 is worst).

    Units: a micro-batch-stage for 1F1B, a micro-batch-chunk for interleaved 1F1B and a
    slice-chunk for SlimPipe (docs/cost-model.md table, from the SlimPipe artifact).
    """
    if not 0 <= rank < pp:
        raise ValueError(f"rank must be in [0, {pp}), got {rank}")
    if schedule == "1f1b":
        return pp - rank
    if schedule == "interleaved":
        return 2 * (pp - 1 - rank) + (vpp - 1) * pp + 1
    if schedule == "slimpipe":
        return slices * vpp + 2 * (pp - 1 - rank)
    raise ValueError(f"schedule must be one of {SCHEDULE_KINDS}, got {schedule!r}")


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Peak memory of one pipeline rank, in bytes."""

    activation_bytes: float
    kv_cache_bytes: float
    """Forward KV of in-flight slices: *included in* activation_bytes."""
    kv_grad_bytes: float
    model_state_bytes: float
    logits_bytes: float
    inflight_units: int
    unit_bytes: float

    @property
    def peak_bytes(self) -> float:
        return (self.activation_bytes + self.kv_grad_bytes + self.model_state_bytes
                + self.logits_bytes)

    def as_gib(self) -> dict[str, float]:
        return {
            "activation_gib": self.activation_bytes / GIB,
            "kv_cache_gib": self.kv_cache_bytes / GIB,
            "kv_grad_gib": self.kv_grad_bytes / GIB,
            "model_state_gib": self.model_state_bytes / GIB,
            "logits_gib": self.logits_bytes / GIB,
            "peak_gib": self.peak_bytes / GIB,
        }


def model_state_bytes(model: ModelSpec, *, tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1,
                      ep: int = 1, distributed_optimizer: bool = True,
                      include_embedding: bool = True, zero_stage: int | None = None,
                      fp8: bool = False, grad_bytes: int = FP32, fp8_params: bool = False,
                      optimizer_bytes: float = ADAM_FP32_BYTES) -> float:
    """Parameters, gradients and optimizer states on the heaviest pipeline rank.

    Mixed precision: bf16 parameters (2 B) + fp32 main gradients (4 B) + the optimizer state
    (``optimizer_bytes``, default 12: fp32 master weights and Adam moments; see
    :func:`optimizer_bytes_per_param`); the distributed optimizer shards it over dp*cp
    (Megatron's data-parallel-with-context group). The first stage also holds the embedding
    table.

    ``zero_stage`` (overrides ``distributed_optimizer``): 0 replicates everything, 1 is the
    distributed optimizer, 3 shards parameters, gradients and optimizer states over dp*cp with
    16-bit gradients: ``(2 + 2 + K) * Psi / Nd`` with K = 12, the ZeRO paper's stage-3 formula
    (Rajbhandari et al. 2020, arXiv 1910.02054, section 5.3). ``fp8`` adds Transformer Engine's
    fp8 weight cache, :data:`FP8_WEIGHT_CACHE_BYTES` per weight of the layers' GEMMs (embedding,
    LM head, norms and router are not fp8 GEMMs); with ``fp8_params`` those weights are fp8
    parameters instead (1 B, plus their cached fp8 transpose, 1 B) and no bf16 copy exists.
    ``grad_bytes``: the data-parallel gradient buffer per parameter (4 fp32, 2 with bf16
    gradient reduction, :attr:`~slimpack.specs.training.TrainingSpec.grad_dtype`), stages 0
    and 1. ``ep`` (MoE): each rank holds ``num_experts / ep`` experts, whose gradients and
    optimizer states shard over the expert-data-parallel group of ``dp * cp / ep`` ranks.
    """
    if grad_bytes not in (BF16, FP32):
        raise ValueError(f"grad_bytes must be 2 (bf16) or 4 (fp32), got {grad_bytes!r}")
    if fp8_params and not fp8:
        raise ValueError("fp8_params needs fp8 (FP8 weights exist only in FP8 recipes)")
    if (dp * cp) % ep:
        raise ValueError(f"ep ({ep}) must divide dp*cp ({dp * cp})")
    if zero_stage is None:
        zero_stage = 1 if distributed_optimizer else 0
    if zero_stage not in (0, 1, 3):
        raise ValueError(f"zero_stage must be one of 0, 1, 3; got {zero_stage!r}")
    layers = model.num_layers / pp
    dense = model.attention_params_per_layer + 2 * model.hidden
    experts = 0.0
    if model.is_moe:
        # Each rank holds num_experts/ep experts; their gradients and optimizer states are
        # sharded over the expert-data-parallel group, dp*cp/ep ranks (Megatron-Core's
        # expert grid; expert tensor parallelism equal to tp).
        dense += model.hidden * model.num_experts  # the router, replicated
        experts = layers * model.expert_params_per_layer / ep / tp
        gemm_per_layer = model.attention_params_per_layer
    else:
        dense += model.mlp_params_per_layer
        gemm_per_layer = model.attention_params_per_layer + model.mlp_params_per_layer
    params = layers * dense / tp
    if include_embedding:
        params += model.embedding_params / tp

    def weight_bytes(count: float, gemm: float) -> float:
        """bf16 weights plus Transformer Engine's fp8 copies of the GEMM weights among them."""
        if fp8_params:
            return count * BF16 + gemm * (FP8_PARAM_BYTES - BF16)
        if fp8:
            return count * BF16 + gemm * FP8_WEIGHT_CACHE_BYTES
        return count * BF16

    weights = weight_bytes(params, layers * gemm_per_layer / tp)
    expert_weights = weight_bytes(experts, experts)
    if zero_stage == 3:
        return ((weights + params * (BF16 + optimizer_bytes)) / (dp * cp)
                + (expert_weights + experts * (BF16 + optimizer_bytes)) * ep / (dp * cp))
    shard = dp * cp if zero_stage == 1 else 1
    expert_shard = shard // ep if zero_stage == 1 else 1
    return (weights + params * (grad_bytes + optimizer_bytes / shard)
            + expert_weights + experts * (grad_bytes + optimizer_bytes / expert_shard))


def optimizer_bytes_per_param(*, optimizer: str = "megatron", optimizer_dtype: str = "fp32",
                              fp8_params: bool = False) -> int:
    """Sharded optimizer-state bytes per parameter of a bf16 (or fp8) model.

    ``megatron``: Megatron-Core's distributed optimizer, fp32 master weight and Adam moments
    (:data:`ADAM_FP32_BYTES`). ``apex``: NeMo's Apex ``distributed_fused_adam`` keeps its Adam
    moments in ``optimizer_dtype`` and the master weights as NeMo's
    ``MegatronGPTModel.setup_optimization`` sets them: with ``fp8_params`` stored in
    ``optimizer_dtype`` (``store_params=True``); with an fp32 optimizer over bf16 weights only
    the 16-bit remainders of the fp32 master weights (``store_param_remainders=True``: 2 B);
    with a bf16 optimizer over bf16 weights none (``store_params=False``). ``none``: no
    optimizer (the suite's runtime takes no optimizer step).
    """
    if optimizer == "none":
        return 0
    if optimizer == "megatron":
        if optimizer_dtype != "fp32":
            raise ValueError("optimizer_dtype='bf16' needs optimizer='apex'")
        return ADAM_FP32_BYTES
    if optimizer != "apex":
        raise ValueError(f"optimizer must be 'megatron', 'apex' or 'none', got {optimizer!r}")
    if optimizer_dtype not in ("fp32", "bf16"):
        raise ValueError(f"optimizer_dtype must be 'fp32' or 'bf16', got {optimizer_dtype!r}")
    element = FP32 if optimizer_dtype == "fp32" else BF16
    if fp8_params:
        master = element
    elif optimizer_dtype == "fp32":
        master = APEX_PARAM_REMAINDER_BYTES
    else:
        master = 0
    return master + 2 * element


def logits_bytes(model: ModelSpec, tokens: int, *, tp: int = 1, cp: int = 1,
                 spread_over_pp: int = 1) -> float:
    """fp32 logits of ``tokens`` tokens, vocab sharded over tp (and over pp for SlimPipe)."""
    return tokens * model.vocab_size * FP32 / (tp * cp * spread_over_pp)


def estimate_memory(model: ModelSpec, *, seq_len: int, schedule: str, tp: int = 1, cp: int = 1,
                    pp: int = 1, vpp: int = 1, slices: int = 1, dp: int = 1, rank: int = 0,
                    recompute: str = "none", vocab_parallel_pp: bool | None = None,
                    ep: int = 1) -> MemoryEstimate:
    """Peak memory on pipeline ``rank`` for micro-batches of one ``seq_len``-token sequence.

    One unit of activations is ``(s / (n*tp*cp)) * (L / (pp*vpp)) * a`` bytes with n slices
    (n = 1 for 1F1B and interleaved); it is multiplied by :func:`inflight_units`. With
    llama-13b, s = 256K, tp*cp = 16, pp = 8, n = 16, v = 5 this gives 14.78 GiB on rank 0 (the
    SlimPipe artifact's value). ``ep``: expert parallelism (MoE expert states,
    :func:`model_state_bytes`).
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be > 0, got {seq_len}")
    if schedule not in SCHEDULE_KINDS:
        raise ValueError(f"schedule must be one of {SCHEDULE_KINDS}, got {schedule!r}")
    if schedule == "1f1b":
        vpp = 1
    if schedule != "slimpipe":
        slices = 1
    if model.num_layers % (pp * vpp):
        raise ValueError(f"pp*vpp = {pp * vpp} must divide num_layers = {model.num_layers}")
    if slices < 1 or seq_len % slices:
        raise ValueError(f"slices must be >= 1 and divide seq_len ({seq_len}), got {slices}")
    if vocab_parallel_pp is None:
        vocab_parallel_pp = schedule == "slimpipe"
    a = activation_bytes_per_token_per_layer(model, recompute)
    layers_per_chunk = model.num_layers // (pp * vpp)
    unit_tokens = seq_len / (slices * tp * cp)
    unit_bytes = unit_tokens * layers_per_chunk * a
    units = inflight_units(schedule, pp=pp, rank=rank, vpp=vpp, slices=slices)
    activation = units * unit_bytes
    kv_per_unit = unit_tokens * tp * layers_per_chunk * kv_bytes_per_token_per_layer(model, tp)
    kv_cache = units * kv_per_unit if recompute != "full" else 0.0
    # dK/dV accumulators of the sequence being backwarded, one model chunk at a time (only
    # sliced schedules need them: an unsliced micro-batch has no later slice to receive from).
    kv_grad = 0.0
    if slices > 1:
        kv_grad = (seq_len / cp) * layers_per_chunk * kv_bytes_per_token_per_layer(model, tp)
    states = model_state_bytes(model, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep)
    logit_tokens = seq_len // slices
    if vocab_parallel_pp:
        logits = logits_bytes(model, logit_tokens, tp=tp, cp=cp, spread_over_pp=pp)
    else:
        logits = logits_bytes(model, logit_tokens, tp=tp, cp=cp) if rank == pp - 1 else 0.0
    return MemoryEstimate(activation_bytes=activation, kv_cache_bytes=kv_cache,
                          kv_grad_bytes=kv_grad, model_state_bytes=states, logits_bytes=logits,
                          inflight_units=units, unit_bytes=unit_bytes)
