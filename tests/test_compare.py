"""slimpack.compare and the ``slimpack plan`` / ``slimpack compare`` commands."""

from __future__ import annotations

import json
import math

import pytest

from repro.drift import is_wall_clock
from slimpack.batch import Batch
from slimpack.cli.main import main
from slimpack.compare import compare
from slimpack.plan import Plan
from slimpack.records import METHOD_RECORD_COLUMNS, MethodRecord
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

WORKLOAD = ["--model", "llama-7b", "--hardware", "h100", "--gpus", "32", "--dataset",
            "wlb-llm", "--context", "65536", "--global-batch", "64", "--seed", "1",
            "--time-limit", "0.3"]


def test_compare_library_records_every_key_and_sane_numbers():
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    batch = Batch.from_lengths([60000, 30000, 9000, 7000, 5000, 3000, 1000, 800] * 6)
    records = compare(["megatron", "wlb-llm", "flexsp", "slimpipe"], batch, model, hw, 32,
                      parallel=ParallelSpec(tp=8, cp=1, pp=4, dp=1), context=65536,
                      time_limit_s=0.3)
    assert all(isinstance(r, MethodRecord) for r in records)
    rows = [r.to_dict() for r in records]
    assert [r["method"] for r in rows] == ["megatron", "wlb-llm", "flexsp", "slimpipe"]
    for r in rows:
        assert list(r) == list(METHOD_RECORD_COLUMNS) and not r["error"], r["error"]
        assert r["step_time_s"] > 0 and 0 < r["mfu"] < 1 and r["step_over_ideal"] >= 1
        assert r["num_tokens"] == batch.num_tokens
    assert rows[0]["speedup_vs_first"] == pytest.approx(1.0)


def test_compare_in_worker_processes_gives_the_same_records():
    """``jobs`` runs methods in their own processes (a capped method started first); the
    records come back in ``methods`` order and only the wall-clock fields may differ."""
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    batch = Batch.from_lengths([60000, 30000, 9000, 7000, 5000, 3000, 1000, 800] * 4)
    methods = ["megatron", "slimpipe", "megatron-dcp"]
    caps = {"megatron": None, "slimpipe": 2, "megatron-dcp": None}

    def records(jobs: int) -> str:
        rows = compare(methods, batch, model, hw, 16, auto_parallel=True, context=65536,
                       search_budget_s=None, jobs=jobs, auto_parallel_top_k=caps)
        assert [r.method for r in rows] == methods
        return json.dumps([without_wall_clock(r.to_dict()) for r in rows])

    assert records(2) == records(1)
    with pytest.raises(ValueError, match="jobs"):
        compare(methods, batch, model, hw, 16, auto_parallel=True, jobs=0)


def without_wall_clock(value):
    """``value`` without the keys that time the machine (``repro.drift.is_wall_clock``)."""
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if not is_wall_clock(k)}
    return value


def test_compare_rejects_mismatched_world_size():
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    with pytest.raises(ValueError, match="gpus"):
        compare(["megatron"], Batch.from_lengths([10]), model, hw, 16,
                parallel=ParallelSpec(tp=8, dp=1))


def test_cli_plan_writes_plan_and_json_summary(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["plan", "--method", "wlb-llm", *WORKLOAD, "--tp", "8", "--pp", "4",
                 "-o", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["plan_seconds"] > 0 and summary["parallel"]["tp"] == 8
    assert Plan.load(out).validate().method == "wlb-llm"


def test_cli_compare_json_and_table(capsys):
    code = main(["compare", "--methods", "megatron,slimpipe", *WORKLOAD, "--tp", "8",
                 "--pp", "4", "--json"])
    assert code == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert [r["method"] for r in records] == ["megatron", "slimpipe"]
    assert all(list(r) == list(METHOD_RECORD_COLUMNS) for r in records)
    assert main(["compare", "--methods", "megatron", *WORKLOAD, "--tp", "8", "--pp", "4"]) == 0
    assert "step/ideal" in capsys.readouterr().out


def test_cli_auto_parallel_picks_a_config_per_method(capsys):
    code = main(["compare", "--methods", "megatron,flexsp", *WORKLOAD, "--auto-parallel",
                 "--json"])
    assert code == 0
    records = json.loads(capsys.readouterr().out)["records"]
    flexsp = records[1]
    assert flexsp["parallel"]["pp"] == 1  # FlexSP does not pipeline
    assert all(not math.isnan(r["step_time_s"] or math.nan) for r in records)


def test_cli_user_errors_are_one_line(capsys):
    assert main(["compare", "--methods", "megatron", *WORKLOAD, "--tp", "3"]) == 2
    assert "error" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse lists the registered methods
        main(["plan", "--method", "nope", *WORKLOAD, "--tp", "8"])
    assert exit_info.value.code == 2
    assert "slimpack" in capsys.readouterr().err
    assert main(["compare", "--methods", "megatron,nope", *WORKLOAD, "--tp", "8"]) == 2
    assert "unknown ['nope']" in capsys.readouterr().err


def test_cli_option_is_typed_and_checked(capsys):
    """--option values are parsed with the options dataclass's types, before any planning."""
    args = ["compare", "--methods", "megatron,slimpack", *WORKLOAD, "--tp", "8", "--pp", "4"]
    assert main([*args, "--option", "slimpack:serch=false"]) == 2
    assert "unknown option 'serch'" in capsys.readouterr().err
    assert main([*args, "--option", "slimpack:search=maybe"]) == 2
    assert "must be true or false" in capsys.readouterr().err
    assert main([*args, "--option", "search=false"]) == 2
    assert "name the method" in capsys.readouterr().err
    assert main([*args, "--option", "slimpack:search=false", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert [r["error"] for r in records] == ["", ""]


def test_cli_sample_pieces_workload_gives_every_method_megatrons_pieces(capsys):
    argv = ["compare", "--methods", "megatron,slimpack", *WORKLOAD, "--tp", "8", "--pp", "4"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    # On the documents the table says which methods price less attention (they cut).
    assert ("Documents: megatron cut documents at the 65536-token sample boundaries" in table)
    assert main([*argv, "--workload", "sample-pieces"]) == 0
    table = capsys.readouterr().out
    assert "sequences (sample pieces)" in table and "Documents:" not in table
    runs = {}
    for workload in ("documents", "sample-pieces"):
        assert main([*argv, "--workload", workload, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["workload"] == workload
        runs[workload] = {r["method"]: r for r in out["records"]}
    # Megatron-LM's data path cuts exactly these pieces: its step does not move; SlimPack's
    # batch is now the pieces too (the same tokens, more sequences).
    docs, pieces = runs["documents"], runs["sample-pieces"]
    assert pieces["megatron"]["step_time_s"] == docs["megatron"]["step_time_s"]
    assert pieces["slimpack"]["num_tokens"] == docs["slimpack"]["num_tokens"]
    assert pieces["slimpack"]["num_sequences"] > docs["slimpack"]["num_sequences"]


def test_cli_token_budget_sizes_the_batch_in_tokens(capsys):
    workload = [a for a in WORKLOAD]
    i = workload.index("--global-batch")
    workload[i:i + 2] = ["--token-budget", "300000"]
    code = main(["compare", "--methods", "megatron,slimpack", *workload, "--tp", "8",
                 "--pp", "4", "--json"])
    assert code == 0
    records = json.loads(capsys.readouterr().out)["records"]
    # The sampler fills the budget exactly (the last document is cut to fit).
    assert {r["num_tokens"] for r in records} == {300000}
    with pytest.raises(SystemExit):  # both sizes at once is an argparse usage error
        main(["compare", "--methods", "megatron", *WORKLOAD, "--token-budget", "5"])
