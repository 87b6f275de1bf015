"""The parts of `make gpu-check` that run on any device, exercised on CPU: the attention
backend comparison, the parity matrix's single-rank subset in a one-rank process group (the
GPU check's own code path, with gloo instead of NCCL), and the summary table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from slimpack.cli.gpu_check import plot_kernels, summary_markdown
from slimpack.cost.kernels import capped_gemm_seconds
from slimpack.runtime.attention import VarlenLayout
from slimpack.runtime.attention_check import backend_agreement
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.launch import free_port
from slimpack.runtime.parity_matrix import CASES, run_single_rank_case, single_rank_cases


def test_sdpa_path_agrees_with_dense_reference_forward_and_backward():
    # fp32 on both sides: only summation order differs (a wrong mask or a dropped KV prefix
    # moves these by orders of magnitude more than 1e-5).
    layout = VarlenLayout(q_lens=(100, 37, 1), k_lens=(300, 37, 64))
    agree = backend_agreement(layout, heads=8, kv_heads=2, head_dim=16, backend="sdpa",
                              reference="dense", device=torch.device("cpu"),
                              dtype=torch.float32)
    assert set(agree.grad_rel) == {"dq", "dk", "dv"}
    assert agree.worst < 1e-5, agree


def test_agreement_measures_bf16_rounding_above_fp32():
    # The comparison is not blind: the same check in bf16 reports errors of the size bf16's
    # 8 mantissa bits give, orders of magnitude above fp32's.
    with_prefix = VarlenLayout(q_lens=(64,), k_lens=(128,))
    agree = backend_agreement(with_prefix, heads=4, kv_heads=4, head_dim=8, backend="sdpa",
                              reference="dense", device=torch.device("cpu"),
                              dtype=torch.float32)
    assert agree.worst < 1e-5
    bf16 = backend_agreement(with_prefix, heads=4, kv_heads=4, head_dim=8, backend="sdpa",
                             reference="dense", device=torch.device("cpu"),
                             dtype=torch.bfloat16)
    assert 1e-4 < bf16.worst < 5e-2


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.slow
def test_single_rank_matrix_cases_are_gradient_exact_in_one_rank_group(one_rank_group):
    cases = single_rank_cases()
    assert len(cases) >= 4
    kinds = {(c.recompute, c.offload > 0, c.model) for c in cases}
    assert {r for r, _, _ in kinds} == {"none", "selective", "full"}
    for case in cases:
        check = run_single_rank_case(case, RuntimeConfig())
        assert check.ok, f"{case.name}: {check.describe()}"


def test_single_rank_runner_refuses_a_multi_rank_case():
    multi = next(c for c in CASES if c.plan().world_size > 1)
    with pytest.raises(ValueError, match="world-1 cases only"):
        run_single_rank_case(multi, RuntimeConfig())


def test_summary_table_says_what_was_not_checked():
    summary = {"device": "NVIDIA H200", "torch": "2.x", "num_gpus": 1, "wall_s": 12.0,
               "attention": [{"check": "attention flash vs sdpa", "dtype": "bf16",
                              "error": None, "ok": None, "note": "not installed"}],
               "parity": [{"check": "matrix: 1 rank", "dtype": "fp32", "error": 2e-7,
                           "ok": True, "note": "x"},
                          {"check": "packed example plan", "dtype": "bf16", "error": 0.2,
                           "ok": False, "note": "y"}]}
    text = summary_markdown(summary)
    assert "| attention flash vs sdpa | bf16 |  | not checked | not installed |" in text
    assert "| matrix: 1 rank | fp32 | 2.0e-07 | pass | x |" in text
    assert "| packed example plan | bf16 | 2.0e-01 | FAIL | y |" in text


def test_kernel_bench_sweeps_run_on_cpu_and_price_every_row(tmp_path):
    """The GPU check's kernel sweeps on tiny CPU shapes: every row carries a measured time and
    the kernel-level model's prediction of the same kernel, and the CSV round-trips."""
    import csv

    from slimpack.runtime import kernel_bench as kb
    from slimpack.specs import hardware_preset

    hw = hardware_preset("h200")
    rows = kb.memory_sweep(hw, "cpu", lambda _: None, copy_mib=(1,), cast_shapes=((64, 32),),
                           device="cpu")
    rows += kb.gemm_sweep(hw, "cpu", ("bf16",), lambda _: None,
                          shapes=[("t", 64, 128, 32)], device="cpu")
    rows += kb.varlen_sweep(hw, "cpu", lambda _: None, profiles=("wikipedia",),
                            token_counts=(512,), heads=(2, 1, 16), backend="sdpa", device="cpu")
    assert [r.sweep for r in rows] == ["memory", "memory", "gemm", "varlen", "varlen"]
    assert all(r.measured_s > 0 and r.model_s > 0 for r in rows)
    gemm = rows[2]
    assert gemm.model_s == capped_gemm_seconds(hw, 64, 128, 32)
    kb.write_rows(rows, tmp_path / "k.csv")
    assert plot_kernels(rows, tmp_path / "k.png").stat().st_size > 0
    back = list(csv.DictReader((tmp_path / "k.csv").open()))
    assert len(back) == 5 and back[2]["pass"] == "" and float(back[3]["seqlen"]) == 512
    assert float(back[2]["tflops"]) == pytest.approx(2 * 64 * 128 * 32 / gemm.measured_s / 1e12)


def test_layer_gemm_shapes_follow_the_model_and_tp():
    """Llama 70B (hidden 8192, 64 heads, 8 kv heads of 128, ffn 28672) at tp 8: QKV
    (64 + 2 x 8) x 128 / 8 = 1280 columns, attention-out k = 8192 / 8, gate/up 2 x 28672 / 8."""
    from slimpack.runtime.kernel_bench import gemm_shapes, layer_gemm_shapes

    assert layer_gemm_shapes("llama-70b", 8, 4096) == [
        ("qkv", 4096, 1280, 8192), ("attn_out", 4096, 8192, 1024),
        ("gate_up", 4096, 7168, 8192), ("down", 4096, 8192, 3584)]
    shapes = gemm_shapes()
    assert len(shapes) == len(set(shapes)) == 5 + 3 * 4 * 3 * 4 + 3 * 2 * 4 * 2
    # FP8 GEMMs (torch._scaled_mm) need every dimension a multiple of 16.
    assert all(m % 16 == 0 and n % 16 == 0 and k % 16 == 0 for _, m, n, k in shapes)


GPU_RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu"


def test_committed_h200_kernel_table_is_priced_by_the_shipped_model():
    """results/gpu/kernels.csv (one H200 SXM, 2026-12-04) keeps the model's time beside each
    measurement; after a change of the kernel constants, `python -m slimpack.cli.gpu_check
    --out results/gpu --reprice` refreshes them (no GPU needed), and this test says when."""
    from slimpack.runtime import kernel_bench as kb
    from slimpack.specs import hardware_preset

    rows = kb.read_rows(GPU_RESULTS / "kernels.csv")
    assert {r.sweep for r in rows} == {"gemm", "attention", "varlen", "memory"}
    assert sum(r.sweep == "gemm" for r in rows) == 2 * len(kb.gemm_shapes())
    for row, fresh in zip(rows, kb.reprice(rows, hardware_preset("h200")), strict=True):
        assert fresh.model_s == pytest.approx(row.model_s, rel=1e-9), (row.shape, row.pass_)


def test_reprice_without_a_kernel_table_exits_2(tmp_path, capsys):
    from slimpack.cli.gpu_check import main

    assert main(["--out", str(tmp_path), "--reprice"]) == 2
    assert "kernels.csv" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_mfu_note_names_the_recipe_the_rows_were_simulated_under():
    from slimpack.cli.gpu_check import AS_RUN

    row = {"method": "megatron", "attention": "flash", "mfu": 0.4, "goal_mfu": 0.45,
           "sim_mfu": 0.5, "step_error": 0.1, "measured_peak_gib": 10.0, "sim_peak_gib": 9.0,
           "tokens": 65536}
    base = {"device": "NVIDIA H200", "torch": "2.x", "num_gpus": 1, "wall_s": 1.0}
    as_run = summary_markdown({**base, "mfu": [{**row, "sim_recipe": AS_RUN}]})
    older = summary_markdown({**base, "mfu": [row]})
    assert "both peaks hold no optimizer state" in as_run
    assert "the simulated peak includes them" in older
