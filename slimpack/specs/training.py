"""How a run trains (``TrainingSpec``): precision, sequence parallelism, overlap, ZeRO stage.

The cost model carries one, so the same model and hardware can be priced as Megatron-LM runs
them in 2021 (fp16, no sequence parallelism, unfused attention) or today (bf16/fp8,
sequence parallelism, FlashAttention, distributed optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("bf16", "fp8")
GRAD_DTYPES = ("fp32", "bf16")
ZERO_STAGES = (0, 1, 3)
ATTENTION_KERNELS = ("flash", "unfused")
HOPPER_ATTENTION = ("fa3", "fa2")
OPTIMIZERS = ("megatron", "apex", "none")
OPTIMIZER_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    """Training-recipe switches the cost model prices (defaults: a current Megatron-core run)."""

    dtype: str = "bf16"
    """GEMM precision: ``bf16`` (fp16 prices the same) or ``fp8`` (Transformer Engine recipe:
    GEMMs at the FP8 peak, weights kept in bf16 plus their cached fp8 weight and transpose, or
    as FP8 parameters with ``fp8_params``; attention in bf16)."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism: norms/dropout split over TP ranks, all-gather +
    reduce-scatter instead of all-reduce (same bytes on a ring). Off: those elementwise ops
    run replicated on every TP rank (Korthikanti et al. 2022, arXiv 2205.05198, section 4.2.2)."""
    tp_comm_overlap: bool = False
    """Hide tensor-parallel communication behind the GEMMs (Transformer Engine userbuffers);
    off: it is serial with compute, as in Megatron-LM before 2023."""
    zero_stage: int = 1
    """0: plain data parallel; 1: distributed optimizer (Adam states sharded over dp*cp);
    3: parameters and gradients sharded too (ZeRO-3/FSDP, Rajbhandari et al. 2020)."""
    attention_kernel: str = "flash"
    """``flash`` (FlashAttention-2/3) or ``unfused`` (Megatron-LM 2021-22: QK^T and PV batched
    GEMMs around a fused scale-mask-softmax and dropout that materialise s x s scores)."""
    grad_dtype: str = "fp32"
    """Data-parallel gradient buffers: ``fp32`` (Megatron-LM accumulates and reduces bf16
    runs' gradients in fp32: 4 B per parameter) or ``bf16`` (NeMo's Apex
    ``distributed_fused_adam`` with ``grad_sync_dtype: bf16``, as NVIDIA's H100 recipes run
    it: 2 B per parameter; the fp32 master weights and Adam moments stay sharded)."""
    hopper_attention: str = "fa3"
    """Which generation of FlashAttention-class kernels ``flash`` means on Hopper: ``fa3``
    (FlashAttention-3 or cuDNN kernels of its generation, from July 2024) or ``fa2``
    (FlashAttention-2-class kernels, as containers before FlashAttention-3 ran them). Ampere
    has only the FlashAttention-2 generation; there this field changes nothing."""
    p2p_blocking: bool = False
    """Pipeline p2p on the compute stream, as Megatron-LM 2021-22 ran it (``_communicate`` in
    ``megatron/p2p_communication.py``: ``batch_isend_irecv``, wait, ``torch.cuda.synchronize``;
    DeepSpeed's pipeline engine sends and receives with blocking ``dist.send``/``recv``): a
    stage computes nothing while its send is in flight, and without sequence parallelism the
    receiver all-gathers the scatter/gather split over its TP group (``gather_split_1d_tensor``)
    before it computes. Off: sends run on their own lane beside compute."""
    dp_overlap: bool = True
    """The data-parallel gradient reduction starts as the last backward produces its buckets
    (PyTorch DDP, Megatron-core's ``overlap_grad_reduce``). False: it runs after the pipeline
    flush, as Megatron-LM 2021-22's ``local`` DDP did (``train_step``: the schedule, then
    ``allreduce_gradients()`` on every model chunk)."""
    dropout: bool = False
    """Hidden and attention-probability dropout (GPT-3 recipes): its masks and the extra
    elementwise passes are priced; the s x s attention mask only for ``unfused``."""
    fp8_params: bool = False
    """FP8 recipes only: the layers' GEMM weights are Transformer Engine FP8 parameters
    (``fp8_model_init``; NeMo's ``model.fp8_params``), 1 B each plus their cached fp8
    transpose, instead of bf16 weights plus the cached fp8 weight and transpose (2 + 2 B).
    NVIDIA's DGX Cloud FP8 recipes set it (``configure.sh``: ``+model.fp8_params``)."""
    optimizer: str = "megatron"
    """Who keeps the sharded optimizer state (:func:`slimpack.cost.memory.optimizer_bytes_per_param`):
    ``megatron`` (Megatron-Core's distributed optimizer: fp32 master weights and Adam moments,
    12 B per parameter) or ``apex`` (NeMo's Apex ``distributed_fused_adam``, state in
    ``optimizer_dtype``, master weights as NeMo's ``setup_optimization`` configures them) or
    ``none`` (no optimizer state and no optimizer step: what this suite's runtime executes, so
    that simulated and measured steps of the same plan hold the same things)."""
    optimizer_dtype: str = "fp32"
    """Apex ``distributed_fused_adam``'s ``dtype`` (optimizer state): ``fp32`` (its default) or
    ``bf16`` (the DGX Cloud Nemotron-4 340B recipe's ``optim.dtype``)."""

    def __post_init__(self) -> None:
        for name, allowed in (("dtype", DTYPES), ("grad_dtype", GRAD_DTYPES),
                              ("hopper_attention", HOPPER_ATTENTION), ("optimizer", OPTIMIZERS),
                              ("optimizer_dtype", OPTIMIZER_DTYPES),
                              ("attention_kernel", ATTENTION_KERNELS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"TrainingSpec.{name} must be one of {', '.join(allowed)}, "
                                 f"got {value!r}")
        if self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"TrainingSpec.zero_stage must be one of {ZERO_STAGES}, "
                             f"got {self.zero_stage!r}")
        if self.fp8_params and self.dtype != "fp8":
            raise ValueError("TrainingSpec.fp8_params needs dtype='fp8' (FP8 weights are a "
                             "Transformer Engine FP8 recipe)")
        if self.optimizer == "megatron" and self.optimizer_dtype != "fp32":
            raise ValueError("TrainingSpec.optimizer_dtype='bf16' needs optimizer='apex' "
                             "(Megatron-Core's distributed optimizer keeps fp32 state)")
