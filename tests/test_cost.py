"""Cost model: FLOP formulas, memory numbers from the SlimPipe artifact, communication."""

import json

import pytest

from slimpack.cli.main import main
from slimpack.cost import (
    GIB,
    AnalyticCostModel,
    CommModel,
    activation_bytes_per_token_per_layer,
    attention_flops,
    estimate_memory,
    inflight_units,
    layer_flops,
    linear_flops_per_token,
    mfu,
    model_flops,
)
from slimpack.specs import ModelSpec, hardware_preset, model_preset

TOY = ModelSpec(name="toy", num_layers=2, hidden=8, ffn_hidden=16, num_heads=2, num_kv_heads=1)


def test_activation_bytes_per_token_match_slimpipe_artifact():
    # SlimPipe artifact memory estimator (docs/cost-model.md): exact integers.
    assert activation_bytes_per_token_per_layer(model_preset("llama-13b")) == 164_864
    assert activation_bytes_per_token_per_layer(model_preset("llama-70b")) == 274_432


def test_slimpipe_activation_example_14_78_gib():
    # SlimPipe artifact: llama-13b, s=256K, tp*cp=16, pp=8, n=16, v=5 -> 14.78 GiB on rank 0.
    est = estimate_memory(model_preset("llama-13b"), seq_len=262_144, schedule="slimpipe",
                          tp=8, cp=2, pp=8, vpp=5, slices=16)
    assert est.activation_bytes / GIB == pytest.approx(14.78, rel=0.005)
    assert est.inflight_units == 16 * 5 + 2 * 7


def test_other_schedules_follow_the_same_unit_formula():
    m = model_preset("llama-13b")
    a = activation_bytes_per_token_per_layer(m)
    s, tp, cp, pp, v = 262_144, 8, 2, 8, 5
    one_f_one_b = estimate_memory(m, seq_len=s, schedule="1f1b", tp=tp, cp=cp, pp=pp)
    # 1F1B: p micro-batch-stages of (s/(tp*cp)) tokens x (L/pp) layers on rank 0.
    assert one_f_one_b.activation_bytes == pytest.approx(pp * s / (tp * cp) * (40 / pp) * a)
    inter = estimate_memory(m, seq_len=s, schedule="interleaved", tp=tp, cp=cp, pp=pp, vpp=v)
    units = 2 * (pp - 1) + (v - 1) * pp + 1
    assert inter.activation_bytes == pytest.approx(units * s / (tp * cp) * (40 / (pp * v)) * a)
    # The last rank holds fewest units in every schedule.
    assert inflight_units("1f1b", pp=8, rank=7) == 1
    assert inflight_units("interleaved", pp=8, rank=7, vpp=5) == 33
    assert inflight_units("slimpipe", pp=8, rank=7, vpp=5, slices=16) == 80


def test_memory_cli_json_matches_artifact(capsys):
    rc = main(["memory", "--model", "llama-13b", "--seq-len", "262144", "--tp", "8", "--cp",
               "2", "--pp", "8", "--vpp", "5", "--slices", "16", "--schedule", "slimpipe",
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["activation_gib"] == pytest.approx(14.78, rel=0.005)
    for key in ("model_state_gib", "kv_cache_gib", "peak_gib"):
        assert out[key] > 0
    assert out["peak_gib"] > out["activation_gib"]


def test_memory_cli_table_and_errors(capsys):
    assert main(["memory", "--model", "llama-7b", "--seq-len", "4096", "--pp", "4",
                 "--hardware", "h100"]) == 0
    text = capsys.readouterr().out
    assert "activations" in text and "fits" in text
    assert main(["memory", "--model", "llama-7b", "--seq-len", "-5"]) == 2
    assert "seq_len must be > 0" in capsys.readouterr().err
    assert main(["memory", "--model", "llama-7b", "--seq-len", "4096", "--pp", "3"]) == 2
    assert "must divide num_layers=32" in capsys.readouterr().err


def test_packed_attention_sums_per_document_not_over_the_pack():
    # Hand computation: documents of 3 and 5 tokens, q_dim = 8.
    # Causal pairs per document: 3*4/2 + 5*6/2 = 6 + 15 = 21, so 4*8*21 = 672 FLOPs;
    # treating the pack as one 8-token sequence would give 4*8*36 = 1152.
    flops = layer_flops(TOY, [(3, 0), (5, 0)])
    assert flops.attention == 672
    assert layer_flops(TOY, [(8, 0)]).attention == 1152
    # Linear: 2*(h*(q + 2kv) + q*h + 3*h*ffn) = 2*(8*(8+8) + 64 + 384) = 1152 per token.
    assert linear_flops_per_token(TOY) == 1152
    assert flops.linear == 8 * 1152


def test_kv_prefix_adds_l_times_p():
    # A 4-token slice after a 6-token prefix: 4*6 + 4*5/2 = 34 pairs.
    assert attention_flops(TOY, 4, 6) == 4 * 8 * 34
    # Slicing a sequence conserves attention work: [0,6) + [6,10) == [0,10).
    assert attention_flops(TOY, 6, 0) + attention_flops(TOY, 4, 6) == attention_flops(TOY, 10, 0)
    with pytest.raises(ValueError, match="tokens and kv_prefix must be >= 0"):
        attention_flops(TOY, -1, 0)


def test_model_flops_and_mfu():
    m = model_preset("llama-7b")
    # Dense 6*N*D rule of thumb (N = non-embedding params + head) for short sequences: the
    # attention term is tiny at 128 tokens, so model_flops ~ 6 * N * tokens within 3%.
    n = m.num_layers * (m.attention_params_per_layer + m.mlp_params_per_layer) + m.embedding_params
    assert model_flops(m, [128] * 10) == pytest.approx(6 * n * 1280, rel=0.03)
    assert mfu(1e15, 1.0, 2, 1e15) == 0.5
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1, 1.0)


def test_backward_ratios_are_separate_and_configurable():
    m, hw = model_preset("llama-7b"), hardware_preset("h100")
    base = AnalyticCostModel(model=m, hardware=hw, kernel_overhead_s=0.0)
    attn_heavy = [(32_768, 0)]
    linear_heavy = [(256, 0)] * 128
    ratio_attn = base.layer_times(attn_heavy).backward_s / base.layer_times(attn_heavy).forward_s
    ratio_lin = base.layer_times(linear_heavy).backward_s / base.layer_times(linear_heavy).forward_s
    assert 2.0 < ratio_lin < ratio_attn < 2.5
    steeper = AnalyticCostModel(model=m, hardware=hw, kernel_overhead_s=0.0,
                                backward_attention_ratio=3.0)
    assert steeper.layer_times(attn_heavy).backward_s > base.layer_times(attn_heavy).backward_s
    full = base.layer_times(attn_heavy, recompute="full")
    none = base.layer_times(attn_heavy)
    assert full.backward_s == pytest.approx(none.backward_s + none.forward_s)


def test_alpha_beta_collectives():
    hw = hardware_preset("h100")
    comm = CommModel(hardware=hw)
    gb = 1e9
    # Ring all-reduce moves 2(k-1)/k of the buffer: 8 ranks, 1 GB, 450 GB/s NVLink.
    assert comm.all_reduce(gb, 8, intra_node=True) == pytest.approx(
        14 * hw.intra_node_latency_s + 2 * 7 / 8 * gb / 450e9)
    assert comm.all_gather(gb, 8, intra_node=False) == pytest.approx(
        7 * hw.inter_node_latency_s + 7 / 8 * gb / 50e9)
    assert comm.p2p(gb, intra_node=True) < comm.p2p(gb, intra_node=False)
    assert comm.all_to_all(gb, 1, intra_node=True) == 0.0
    with pytest.raises(ValueError, match="collective kind"):
        comm.time("broadcast", 1, 2, intra_node=True)
