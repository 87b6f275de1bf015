"""Kernel-level terms of the Hopper/FP8 recipe (docs/cost-model.md, "Hopper and FP8 terms"):
each checked on a hand-computed number."""

from __future__ import annotations

import pytest

from slimpack.cost import kernels
from slimpack.cost.kernel_model import KernelCostModel
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

H100 = hardware_preset("h100")
LLAMA7 = model_preset("llama-7b")  # h 4096, MHA (kv 4096), ffn 11008


def test_fp8_casts_are_cast_transpose_bytes_over_hbm():
    """TE cast_transpose: read 2 B, write fp8 + transpose (1 B each) = 4 B per element.
    llama-7b, 8192 tokens, tp 1. Forward: inputs of out-proj (4096) and down-proj (11008):
    8192*15104*4 B = 494,927,872 B; backward: output gradients of QKV (12288), out-proj
    (4096), gate+up (22016) and down (4096): 8192*42496*4 B = 1,392,508,928 B; both at 80% of
    3.35 TB/s (2.68e12 B/s): 184.7 us and 519.6 us."""
    cost = KernelCostModel(model=LLAMA7, hardware=H100, training=TrainingSpec(dtype="fp8"))
    t = cost.fp8_cast_times(8192, tp=1)
    assert t.forward_s == pytest.approx(494_927_872 / 2.68e12, rel=1e-9)
    assert t.backward_s == pytest.approx(1_392_508_928 / 2.68e12, rel=1e-9)
    bf16 = KernelCostModel(model=LLAMA7, hardware=H100)
    assert bf16.fp8_cast_times(8192, tp=1).forward_s == 0.0


def test_lm_head_stays_bf16_in_the_fp8_recipe():
    """Megatron-core runs the output layer outside Transformer Engine's fp8 autocast."""
    fp8 = KernelCostModel(model=LLAMA7, hardware=H100, training=TrainingSpec(dtype="fp8"))
    bf16 = KernelCostModel(model=LLAMA7, hardware=H100)
    assert fp8.head_times(8192, tp=2) == bf16.head_times(8192, tp=2)
    assert fp8.linear_times(8192, tp=2).forward_s < bf16.linear_times(8192, tp=2).forward_s


def test_userbuffers_overlap_is_chunked_gemms_plus_one_unhidden_chunk():
    """One AG+GEMM pair at tp 2 costs max(2 * gemm(m/2), c) + c/2. Checked on the QKV pair of
    llama-7b, 8192 tokens: GEMM-bound here, so the pair is the two half GEMMs plus half of
    one all-gather of 8192*4096*2 B over NVLink."""
    tr = TrainingSpec(tp_comm_overlap=True)
    cost = KernelCostModel(model=LLAMA7, hardware=H100, training=tr)
    c = cost.tp_comm_seconds(8192, 2) / 4
    assert c == pytest.approx(cost.comm.all_gather(8192 * 4096 * 2, 2, intra_node=True))
    half = kernels.gemm_seconds(H100, 4096, 6144, 4096)  # QKV on one rank: n = 12288/2
    assert 2 * half > c  # GEMM-bound
    qkv_pair = 2 * half + c / 2
    full = cost.overlapped_tp_times(8192, 2)
    # the other three pairs and the weight-gradient GEMMs by the same rule: the forward is
    # never cheaper than its chunked GEMMs plus four unhidden chunks
    shapes = cost._linear_shapes(8192, 2)
    chunked = sum(2 * kernels.gemm_seconds(H100, m // 2, n, k) for m, n, k in shapes)
    assert full.forward_s >= chunked + 4 * c / 2 - 1e-12
    assert qkv_pair == pytest.approx(2 * kernels.gemm_seconds(H100, 4096, 6144, 4096) + c / 2)
    # overlap is not free: slower than the GEMMs alone, faster than GEMMs then communication
    serial = KernelCostModel(model=LLAMA7, hardware=H100)
    lin = serial.linear_times(8192, 2)
    assert lin.forward_s < full.forward_s < lin.forward_s + serial.tp_comm_seconds(8192, 2)


def test_overlap_off_or_tp_one_keeps_the_serial_price():
    on = KernelCostModel(model=LLAMA7, hardware=H100, training=TrainingSpec(tp_comm_overlap=True))
    off = KernelCostModel(model=LLAMA7, hardware=H100)
    assert on.layer_times([(4096, 0)], tp=1) == off.layer_times([(4096, 0)], tp=1)


def test_hopper_attention_backward_follows_fa3s_h100_sweep():
    """meta-pytorch/tritonbench PR #1256: FlashAttention-3 backward on H100, BF16, d=128,
    non-causal, 313.3 / 434.8 / 519.8 / 561.4 TFLOP/s at 1K/2K/4K/8K tokens (fitted, within
    3%); the causal sweep of PR #1267 (derived from its times, not fitted) at 2K-8K within 7%:
    8192 tokens 15,308.16 us for B=4, H=48 -> 538.7 TFLOP/s."""
    for s, published in ((1024, 313.324), (2048, 434.825), (4096, 519.827), (8192, 561.41)):
        eff = kernels.attention_efficiency(H100, s, head_dim=128, backward=True)
        assert eff * 989 == pytest.approx(published, rel=0.03), s
    causal = kernels.attention_efficiency(H100, 8192, head_dim=128, backward=True, causal=True)
    assert causal * 989 == pytest.approx(538.7, rel=0.07)


def test_fp8_activation_storage_halves_the_saved_gemm_inputs():
    """llama-7b: 12h + 4kv + 6ffn = 131,584 B per token per layer in bf16; Transformer Engine
    keeps the four GEMM inputs in fp8: 3h + ffn = 23,296 B less (108,288 B)."""
    from slimpack.cost.memory import activation_bytes_per_token_per_layer as act
    assert act(LLAMA7) == 131_584
    assert act(LLAMA7, fp8=True) == 108_288
    assert act(LLAMA7, "selective", fp8=True) == 12 * 4096 + 4 * 4096 + 2 * 11008 - 23_296
    assert act(LLAMA7, "full", fp8=True) == act(LLAMA7, "full") == 2 * 4096


def test_bf16_gradient_buffers_save_two_bytes_per_parameter():
    """Distributed optimizer over dp 8: 2 (bf16 weights) + 4 (fp32 grads) + 12/8 = 7.5 B per
    parameter; bf16 gradient buffers (NeMo distributed_fused_adam, grad_sync_dtype bf16):
    5.5 B."""
    from slimpack.cost.memory import model_state_bytes
    fp32 = model_state_bytes(LLAMA7, dp=8)
    bf16 = model_state_bytes(LLAMA7, dp=8, grad_bytes=2)
    assert bf16 / fp32 == pytest.approx(5.5 / 7.5, rel=1e-12)
    with pytest.raises(ValueError, match="grad_bytes"):
        model_state_bytes(LLAMA7, grad_bytes=1)
    with pytest.raises(ValueError, match="grad_dtype"):
        TrainingSpec(grad_dtype="fp16")


def test_fa2_generation_attention_on_hopper_holds_out_on_the_stated_35_percent():
    """``hopper_attention="fa2"``: constants fitted to our H200 SXM sweep of torch's
    FlashAttention-2 kernels (eta_fwd 0.36, row_fwd 0.55; eta_bwd 0.31, row_bwd 3.2). Held out:
    Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608), abstract: FlashAttention-2 reaches
    35% utilization of an H100; the fit gives 0.36 x 512/(512 + 0.55) = 0.3596 at 64K tokens,
    within 3%. Ampere is unaffected."""
    from slimpack.cost.kernels import ATTENTION_CONSTANTS
    fa2 = ATTENTION_CONSTANTS["hopper-fa2"]
    eff = kernels.attention_efficiency(H100, 65536, head_dim=128, consts=fa2)
    assert eff == pytest.approx(0.36 * 512 / (512 + 0.55), rel=1e-9)
    assert eff == pytest.approx(0.35, rel=0.03)
    cost = KernelCostModel(model=LLAMA7, hardware=H100,
                           training=TrainingSpec(hopper_attention="fa2"))
    fa3 = KernelCostModel(model=LLAMA7, hardware=H100)
    t2, t3 = cost.attention_times([(65536, 0)]), fa3.attention_times([(65536, 0)])
    # causal 64K tokens: 512 query tiles visit 512*513/2 key tiles, plus each kernel's row
    # overhead per query tile (FA2-class 0.55, FA3 1.95)
    tiles = 512 * 513 / 2
    assert t2.forward_s / t3.forward_s == pytest.approx(
        0.76 / 0.36 * (tiles + 0.55 * 512) / (tiles + 1.95 * 512), rel=1e-6)
    a100 = hardware_preset("a100")
    assert (KernelCostModel(model=LLAMA7, hardware=a100,
                            training=TrainingSpec(hopper_attention="fa2")).attention_times(
                [(8192, 0)]) == KernelCostModel(model=LLAMA7, hardware=a100).attention_times(
                [(8192, 0)]))
    with pytest.raises(ValueError, match="hopper_attention"):
        TrainingSpec(hopper_attention="fa4")


def test_hopper_collectives_run_at_the_nccl_maintainers_effective_bandwidth():
    """nccl-tests issue #212: NVLink4's 450 GB/s line rate gives an effective 370 GB/s bus
    bandwidth (0.82); issue #290: NDR 400 Gb/s gives 46-48 GB/s per NIC (0.94 of 50). A
    1 GiB all-gather over 8 GPUs of a node: 7/8 * 2^30 B / 369 GB/s + 7 * 5 us."""
    cost = KernelCostModel(model=LLAMA7, hardware=H100)
    t = cost.comm.all_gather(2**30, 8, intra_node=True)
    assert t == pytest.approx(7 / 8 * 2**30 / (450e9 * 0.82) + 7 * 5e-6, rel=1e-9)
    assert cost.comm.p2p(2**30, intra_node=False) == pytest.approx(
        15e-6 + 2**30 / (50e9 * 0.94), rel=1e-9)


def test_rotary_embedding_is_q_and_k_read_and_written_in_bf16():
    """llama-7b at tp 2: q 4096/2 and k 4096/2 per token, read + write 2 B each = 16,384 B per
    token; 8192 tokens at 80% of 3.35 TB/s = 50.1 us, forward and backward alike. GPT-3 style
    models (learned absolute positions, ``rope=False``) pay nothing."""
    from dataclasses import replace
    cost = KernelCostModel(model=LLAMA7, hardware=H100)
    assert cost.rope_bytes_per_token(2) == 16_384
    no_rope = KernelCostModel(model=replace(LLAMA7, rope=False), hardware=H100)
    with_rope, without = cost.elementwise_times(8192, 2), no_rope.elementwise_times(8192, 2)
    assert with_rope.forward_s - without.forward_s == pytest.approx(8192 * 16_384 / 2.68e12)
    assert with_rope.backward_s - without.backward_s == pytest.approx(8192 * 16_384 / 2.68e12)
    assert no_rope.rope_bytes_per_token(2) == 0.0


LLAMA7_GEMM_PARAMS = 32 * (67_108_864 + 135_266_304)  # attention + SwiGLU matrices, 32 layers
LLAMA7_PARAMS = 32 * (67_108_864 + 135_266_304 + 2 * 4096) + 525_336_576  # + norms, embedding


def test_fp8_weight_cache_is_weight_and_transpose_of_the_gemm_weights_only():
    """Transformer Engine caches the fp8 weight and its fp8 transpose (set_fp8_weights:
    weight1_fp8, weight1_t_fp8): 2 B per GEMM weight, none on embedding and norms. llama-7b,
    dp 4: 2 * 6,476,005,376 = 12,952,010,752 B more than bf16 (was 1 B on every parameter)."""
    from slimpack.cost.memory import model_state_bytes
    bf16 = model_state_bytes(LLAMA7, dp=4)
    fp8 = model_state_bytes(LLAMA7, dp=4, fp8=True)
    assert bf16 == pytest.approx(LLAMA7_PARAMS * (2 + 4 + 12 / 4), rel=1e-12)
    assert fp8 - bf16 == pytest.approx(12_952_010_752, rel=1e-12)
    # FP8 parameters (fp8_params): 1 B weight + 1 B transpose replace the bf16 weight + cache.
    fp8_params = model_state_bytes(LLAMA7, dp=4, fp8=True, fp8_params=True)
    assert fp8_params == pytest.approx(bf16, rel=1e-12)
    with pytest.raises(ValueError, match="fp8_params"):
        model_state_bytes(LLAMA7, fp8_params=True)


def test_optimizer_state_bytes_follow_nemo_distributed_fused_adam():
    """NeMo's setup_optimization for Apex distributed_fused_adam: fp32 optimizer over bf16
    weights stores 16-bit master remainders (2 + 4 + 4 = 10 B); bf16 optimizer over bf16
    weights stores no master (2 + 2 = 4 B); with fp8_params the master is stored in the
    optimizer dtype (4 + 8 = 12 B, 2 + 4 = 6 B). Megatron-Core: fp32 master and moments, 12 B."""
    from slimpack.cost.memory import model_state_bytes, optimizer_bytes_per_param
    assert optimizer_bytes_per_param() == 12
    assert optimizer_bytes_per_param(optimizer="apex") == 10
    assert optimizer_bytes_per_param(optimizer="apex", optimizer_dtype="bf16") == 4
    assert optimizer_bytes_per_param(optimizer="apex", fp8_params=True) == 12
    assert optimizer_bytes_per_param(optimizer="apex", optimizer_dtype="bf16",
                                     fp8_params=True) == 6
    # DGX Cloud Llama recipe, bf16, dp 8 (bf16 gradients): 2 + 2 + 10/8 = 5.25 B per parameter.
    got = model_state_bytes(LLAMA7, dp=8, grad_bytes=2, optimizer_bytes=10)
    assert got == pytest.approx(LLAMA7_PARAMS * 5.25, rel=1e-12)
    with pytest.raises(ValueError, match="optimizer_dtype"):
        TrainingSpec(optimizer_dtype="bf16")
    with pytest.raises(ValueError, match="optimizer"):
        TrainingSpec(optimizer="zero")
    with pytest.raises(ValueError, match="fp8_params"):
        TrainingSpec(fp8_params=True)


def test_no_optimizer_is_what_the_runtime_holds_and_runs():
    """``optimizer="none"`` (the suite's runtime takes no optimizer step): bf16 weights and
    bf16 gradients only, 2 + 2 = 4 B per parameter, and no Adam step in the step time."""
    from slimpack.cost.memory import model_state_bytes, optimizer_bytes_per_param
    from slimpack.sim.memory import stage_state_bytes

    assert optimizer_bytes_per_param(optimizer="none") == 0
    none = TrainingSpec(optimizer="none", grad_dtype="bf16")
    head = 525_336_576  # the untied LM head (vocab 128,256 x 4096) on the one stage
    assert stage_state_bytes(LLAMA7, tp=1, cp=1, pp=1, dp=1, vocab_parallel_pp=False,
                             training=none) == [pytest.approx((LLAMA7_PARAMS + head) * 4,
                                                              rel=1e-12)]
    assert model_state_bytes(LLAMA7) == pytest.approx(LLAMA7_PARAMS * 18, rel=1e-12)
    cost = KernelCostModel(model=LLAMA7, hardware=H100, training=none)
    assert cost.optimizer_step_seconds(1e9) == 0.0
    assert KernelCostModel(model=LLAMA7, hardware=H100).optimizer_step_seconds(1e9) > 0
