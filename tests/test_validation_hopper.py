"""The Hopper development set (slimpack/validation/hopper_published.json) and
``slimpack validate --set``: loader, expression, FLOP convention and CLI selection."""

from __future__ import annotations

import json

import pytest

from slimpack.cli.main import main
from slimpack.validation import Skipped
from slimpack.validation.hopper import express_hopper, load_hopper_records
from slimpack.validation.megatron import breakdown, nemo_model_flops, validate


@pytest.fixture(scope="module")
def records():
    return load_hopper_records()


def test_at_least_30_measured_records_each_citing_file_table_and_row(records):
    measured = [r for r in records if any(m["kind"] == "measured" for m in r["measurements"])]
    assert len(measured) >= 30
    assert len({r["id"] for r in records}) == len(records)
    for r in measured:
        src = r["source"]
        assert src["repo"] and src["commit"] and src["file"] and src["table"], r["id"]
        assert src.get("row") and src.get("column"), r["id"]
        assert r["precision"] in ("bf16", "fp8")
        p = r["parallel"]
        assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == p["num_gpus"], r["id"]
    assert {r["precision"] for r in measured} == {"bf16", "fp8"}
    assert any(r["parallel"]["cp"] > 1 for r in measured)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="do not exist"):
        load_hopper_records(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="'records'"):
        load_hopper_records(bad)


def test_squared_relu_is_a_two_matrix_mlp_and_the_recipe_switches_carry_over(records):
    by_id = {r["id"]: r for r in records}
    case = express_hopper(by_id["dgxc-nemotron4-15b-fp8-16gpu"])
    assert not isinstance(case, Skipped)
    assert case.model.mlp_matrices == 2 and case.training.dtype == "fp8"
    assert case.training.tp_comm_overlap and case.training.sequence_parallel
    assert case.parallel.tp == 4 and case.parallel.dp == 4
    llama = express_hopper(by_id["dgxc-llama3.1-8b-bf16-8gpu"])
    assert llama.parallel.cp == 2 and llama.model.mlp_matrices == 3
    assert not llama.model.tied_embeddings


def test_unexpressible_records_are_skipped_with_the_reason(records):
    rec = json.loads(json.dumps(records[0]))
    rec["precision"] = "nvfp4"
    skipped = express_hopper(rec)
    assert isinstance(skipped, Skipped) and "nvfp4" in skipped.reason
    rec = json.loads(json.dumps(records[0]))
    rec["parallel"]["ep"] = rec["parallel"]["dp"]
    assert "ep=" in express_hopper(rec).reason and "MoE" in express_hopper(rec).reason
    rec = json.loads(json.dumps(records[0]))
    rec["parallel"]["num_gpus"] += 8
    assert "num_gpus" in express_hopper(rec).reason


def test_nemo_flops_reproduce_the_nemo_2407_summary_row():
    """NeMo 24.07 performance summary (NVIDIA/NeMo 8e3d65dcfe, performance_summary.md),
    LLAMA2-7B, 8 GPUs, GBS 128, seq 4096: 16,934 tokens/s/GPU and 780 model TFLOP/s/GPU.
    NeMo's 2024 formula (attention not discounted for causality) gives 780 within 0.5%."""
    case = express_hopper(next(r for r in load_hopper_records()
                               if r["id"] == "nemo-longctx-llama2-7b-fp8-4k"))
    per_token = nemo_model_flops(case) / (case.gbs * case.seq_len)
    assert per_token * 16934 / 1e12 == pytest.approx(780, rel=0.005)


def test_breakdown_groups_by_precision_cp_and_gpu_band(records):
    chosen = [r for r in records if r["id"] in ("dgxc-llama3.1-8b-bf16-8gpu",
                                                "dgxc-nemotron4-15b-fp8-16gpu",
                                                "dgxc-nemotron4-340b-bf16-128gpu")]
    report = validate(chosen, express_fn=express_hopper)
    groups = breakdown(report)
    assert groups["precision"]["bf16"]["rows"] == 2 and groups["precision"]["fp8"]["rows"] == 1
    assert groups["cp"]["cp>1"]["rows"] == 1 and groups["cp"]["cp=1"]["rows"] == 2
    assert list(groups["gpus"]) == ["1-64 GPUs", "65-512 GPUs"]


def test_cli_rejects_a_bad_set_naming_the_allowed_values(capsys):
    assert main(["validate", "--set", "h100"]) == 2
    out = capsys.readouterr().out
    assert "dev, hopper, all" in out and "'h100'" in out
    assert main(["validate", "--set", "all", "--records", "x.json"]) == 2


def test_cli_hopper_set_prints_rows_and_the_breakdown(capsys, tmp_path, records):
    small = tmp_path / "two.json"
    oss = next(r for r in records if "gpt-oss" in r["id"])
    small.write_text(json.dumps({"records": records[:1] + [oss]}))
    assert main(["validate", "--set", "hopper", "--records", str(small)]) == 0
    out = capsys.readouterr().out
    assert records[0]["id"] in out and oss["id"] in out
    # gpt-oss has sliding-window layers: listed as not expressible, with its reason
    assert "expressible 1 of 2 measured" in out
    assert "skipped: sliding-window attention not modelled" in out
    assert "by precision:" in out and "by cp:" in out and "by gpus:" in out
    assert main(["validate", "--set", "hopper", "--records", str(small), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["summary"]["expressible"] == 1 and "breakdown" in payload
    assert payload["skipped"][0]["record"] == oss["id"]


def test_a_run_that_ran_fits_the_simulated_memory(records):
    """DGX Cloud Benchmarking Llama 3.1 8B BF16 on 8 H100s (tp1 cp2 dp4, 4096 tokens per GPU,
    no recompute) ran: 8.0B parameters x (2 + 2 bf16 grads + 10/8 Apex state with bf16 master
    remainders) B = 42 GB of states plus ~19 GiB of activations and logits fit the 80 GiB part;
    with fp32 gradient buffers and Megatron-Core's fp32 master weights (2 + 4 + 12/8 B) it
    would not."""
    rec = next(r for r in records if r["id"] == "dgxc-llama3.1-8b-bf16-8gpu")
    report = validate([rec], express_fn=express_hopper)
    assert report.rows[0].fits is True and report.summary()["predicted_not_to_fit"] == 0
    fp32 = json.loads(json.dumps(rec))
    fp32["training"].update(grad_dtype="fp32", optimizer="megatron")
    assert validate([fp32], express_fn=express_hopper).predicted_not_to_fit == [rec["id"]]


def test_the_nemo_2403_llama2_7b_run_fits_under_its_releases_launcher_recipe(records):
    """NeMo 24.03.01 Llama 2 7B FP8, 4K tokens, tp1 pp1 dp4 (the long-sequence page) ran. The
    launcher at that release (NVIDIA/NeMo-Framework-Launcher tag 24.03.01,
    examples/training/llama/h100/llama2_7b_fp8.sh and llama2_7b.yaml) reduces gradients in bf16
    with Apex's distributed Adam: 52.9 GiB of states plus 13.7 GiB of activations and logits
    fit the 73.6 GiB usable. Under Megatron-Core's defaults (fp32 gradients, fp32 master
    weights) the same run would need 82.3 GiB: the recipe, not a memory term, decides it."""
    rec = next(r for r in records if r["id"] == "nemo-longctx-llama2-7b-fp8-4k")
    assert rec["training"]["grad_dtype"] == "bf16" and rec["training"]["optimizer"] == "apex"
    report = validate([rec], express_fn=express_hopper)
    assert report.rows[0].fits is True
    defaults = json.loads(json.dumps(rec))
    defaults["training"].update(grad_dtype="fp32", optimizer="megatron")
    assert validate([defaults], express_fn=express_hopper).predicted_not_to_fit == [rec["id"]]
    every = validate(records, express_fn=express_hopper)
    assert every.predicted_not_to_fit == []


def test_published_runs_the_suite_cannot_express_are_listed_with_the_reason(records):
    """Megatron-Bridge 25.11 DGX-H100 rows: gpt-oss-120b alternates sliding-window and full
    attention layers, which the suite does not price. Qwen3-30B-A3B (expert parallelism,
    tests/test_expert_parallel.py), Llama3 8B FP8 with recompute of 5 layers and Llama 3.1
    405B with its embedding-and-loss pipeline split are expressed
    (tests/test_recompute_layers.py, tests/test_pipeline_split.py)."""
    skipped = validate(records, express_fn=express_hopper).skipped
    assert [s.record_id for s in skipped] == ["bridge2511-gpt-oss-120b-bf16-64gpu"]
    assert "sliding-window" in skipped[0].reason


def test_tokens_per_second_per_gpu_is_the_batch_over_step_and_gpus(records):
    """Megatron-Bridge's Tokens/sec/GPU: gbs * seq / (step * GPUs)."""
    rec = next(r for r in records if r["id"] == "bridge2511-llama3-70b-fp8cs-64gpu")
    row = validate([rec], express_fn=express_hopper).rows[0]
    assert row.predicted == pytest.approx(128 * 8192 / (row.step_time_s * 64), rel=1e-12)
    assert row.bias == pytest.approx(row.predicted / 1602 - 1, rel=1e-12)


def test_worker_processes_give_the_same_rows_in_the_same_order(records, capsys):
    chosen = [r for r in records if r["id"] in ("dgxc-nemotron4-15b-fp8-16gpu",
                                                "dgxc-llama3.1-8b-bf16-8gpu",
                                                "bridge2511-qwen3-30b-a3b-fp8cs-16gpu")]
    serial = validate(chosen, express_fn=express_hopper)
    parallel = validate(chosen, express_fn=express_hopper, jobs=2)
    assert [r.as_dict() for r in parallel.rows] == [r.as_dict() for r in serial.rows]
    assert parallel.skipped == serial.skipped
    with pytest.raises(ValueError, match="jobs"):
        validate(chosen, express_fn=express_hopper, jobs=0)
    assert main(["validate", "--set", "hopper", "--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().out
