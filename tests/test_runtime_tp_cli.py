"""`slimpack run PLAN.json` executes a tensor-parallel plan a planner wrote, and reports step
time, tokens/s and peak memory per rank, on screen and in the record."""

from __future__ import annotations

import json

from slimpack.cli.main import main


def test_run_executes_a_tensor_parallel_megatron_plan(tmp_path, capsys):
    plan_path, out = tmp_path / "megatron.json", tmp_path / "run.json"
    assert main(["plan", "--method", "megatron", "--model", "tiny", "--gpus", "2", "--tp", "2",
                 "--dataset", "wikipedia", "--context", "128", "--global-batch", "6",
                 "-o", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["run", str(plan_path), "--model", "tiny", "--warmup", "0",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tokens/s; peak memory per rank" in printed
    row = json.loads(out.read_text())
    assert row["parallel"]["tp"] == 2 and row["num_gpus"] == 2
    assert row["tokens_per_s"] > 0 and row["step_time_s"] > 0
    per_rank = row["extra"]["rank_peak_memory_bytes"]
    assert len(per_rank) == 2 and all(b > 0 for b in per_rank)
    # One stage of two tp ranks: the stage's peak is the larger rank's.
    assert row["peak_memory_bytes"] == [max(per_rank)]


def test_run_executes_a_megatron_plan_with_tensor_and_context_parallelism(tmp_path, capsys):
    plan_path, out = tmp_path / "tp2cp2.json", tmp_path / "run.json"
    assert main(["plan", "--method", "megatron", "--model", "tiny", "--gpus", "4", "--tp", "2",
                 "--cp", "2", "--dataset", "wikipedia", "--context", "128",
                 "--global-batch", "6", "-o", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["run", str(plan_path), "--model", "tiny", "--warmup", "0",
                 "--out", str(out)]) == 0
    assert "tokens/s; peak memory per rank" in capsys.readouterr().out
    row = json.loads(out.read_text())
    assert row["parallel"]["tp"] == 2 and row["parallel"]["cp"] == 2 and row["num_gpus"] == 4
    per_rank = row["extra"]["rank_peak_memory_bytes"]
    assert len(per_rank) == 4 and all(b > 0 for b in per_rank)
    assert row["peak_memory_bytes"] == [max(per_rank)]  # one stage of cp2 x tp2 ranks


def test_parity_matrix_runs_a_named_case_and_reports_it(capsys):
    from slimpack.runtime.parity_matrix import main as matrix

    assert matrix(["--only", "tp2, asymmetric units"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tp2")]
    assert len(rows) == 1 and rows[0].endswith("| yes |")


def test_run_example_with_tp_flag(capsys):
    assert main(["run", "--example", "packed", "--tp", "2", "--pp", "1", "--model", "tiny",
                 "--warmup", "0"]) == 0
    printed = capsys.readouterr().out
    per_rank = printed.split("peak memory per rank")[1]
    assert per_rank.count(",") == 1  # two ranks: one stage of two tensor-parallel ranks
