"""The parts of `make gpu-check` that run on any device, exercised on CPU: the attention
backend comparison, the parity matrix's single-rank subset in a one-rank process group (the
GPU check's own code path, with gloo instead of NCCL), and the summary table."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from slimpack.cli.gpu_check import summary_markdown
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
