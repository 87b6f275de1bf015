"""`slimpack run`, `slimpack profile` and the GPU check's CPU-side behaviour."""

from __future__ import annotations

import json

import pytest
import torch

from slimpack.cli import gpu_check
from slimpack.cli.main import main
from slimpack.runtime.examples import packed_plan


@pytest.mark.slow
def test_profile_then_run_with_simulated_comparison(tmp_path, capsys):
    calib = tmp_path / "calib.csv"
    assert main(["profile", "--model", "tiny", "--out", str(calib), "--tokens", "16,32,64",
                 "--prefixes", "0,32", "--repeats", "1", "--quiet"]) == 0
    out = tmp_path / "run.json"
    assert main(["run", "--example", "packed", "--model", "tiny", "--pp", "2",
                 "--calibration", str(calib), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "simulated step" in printed and "measured" in printed
    row = json.loads(out.read_text(), parse_constant=_reject_constant)  # strict JSON
    assert row["backend"] == "runtime" and row["num_gpus"] == 2
    # Nested fields are JSON lists and objects, not JSON-in-a-string.
    assert row["step_time_s"] > 0 and len(row["peak_memory_bytes"]) == 2
    assert row["parallel"]["pp"] == 2 and isinstance(row["extra"], dict)
    assert {op["kind"] for op in row["ops"]} >= {"F", "B"}
    assert isinstance(row["comparison"]["step_error"], float)


def _reject_constant(name: str) -> None:
    raise AssertionError(f"bare {name} in JSON output")


def test_run_rejects_a_plan_for_another_world_size(tmp_path, capsys):
    path = tmp_path / "plan.json"
    packed_plan(pp=2, dp=2).save(path)
    assert main(["run", str(path), "--model", "tiny", "--nproc", "2"]) == 2
    assert "plan is for 4 processes" in capsys.readouterr().err


def test_run_needs_exactly_one_plan_source(capsys):
    assert main(["run", "--model", "tiny"]) == 2
    assert "exactly one" in capsys.readouterr().err


def test_run_rejects_nccl_without_cuda(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert main(["run", "--example", "packed", "--model", "tiny", "--backend", "nccl"]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_profile_rejects_bad_grids(tmp_path, capsys):
    assert main(["profile", "--model", "tiny", "--out", str(tmp_path / "c.csv"),
                 "--prefixes", "512"]) == 2
    assert "include 0" in capsys.readouterr().err


def test_gpu_check_arguments_and_cpu_exit(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--scale", "0"])
    args = gpu_check.parse_args(["--out", "somewhere", "--skip-profile"])
    assert args.out == "somewhere" and args.skip_profile
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the check itself runs under `make gpu-check`")
    assert gpu_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_nothing_outside_the_cli_imports_the_cli():
    # Domain logic (compare_with_simulator) lives in slimpack.runtime; the CLI is the top
    # layer, so no library module may import it (gpu_check used to).
    import ast
    from pathlib import Path

    import slimpack

    root = Path(slimpack.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.parent.name == "cli" and path.parent.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(root)}: {n}" for n in names
                          if n == "slimpack.cli" or n.startswith("slimpack.cli.")]
    assert offenders == []
