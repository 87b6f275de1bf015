"""Bad input gets one clear error naming the field and what is allowed, before any work is
done, with a non-zero exit and nothing half-written."""

from __future__ import annotations

import json
import os

import pytest
from harness_selftest import REGISTRY

from slimpack.cli.main import main
from slimpack.methods import method_names
from slimpack.plan import Plan

TINY = ["--model", "tiny", "--hardware", "h100", "--gpus", "2", "--pp", "2",
        "--dataset", "wikipedia", "--context", "4096", "--global-batch", "8",
        "--time-limit", "0.5"]


def _tiny_plan(tmp_path) -> str:
    out = tmp_path / "tiny.json"
    assert main(["plan", "--method", "megatron", *TINY, "-o", str(out)]) == 0
    return str(out)


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name)


# -- 1. output paths --------------------------------------------------------------------------
def test_plan_output_into_missing_dir_fails_before_planning(tmp_path, capsys):
    out = tmp_path / "missing" / "p.json"
    # An unknown dataset would fail later; the output path is checked first, before any work.
    code = main(["plan", "--method", "megatron", *TINY, "--dataset", "no-such-profile",
                 "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "-o/--output" in err and "does not exist" in err and "Traceback" not in err
    assert not (tmp_path / "missing").exists()


def test_plan_output_onto_directory_leaves_no_tmp(tmp_path, capsys):
    target = tmp_path / "existing_dir"
    target.mkdir()
    code = main(["plan", "--method", "megatron", *TINY, "-o", str(target)])
    assert code == 2
    assert "is a directory" in capsys.readouterr().err
    assert _leftovers(tmp_path) == []


def test_plan_save_is_atomic_and_cleans_up_on_failure(tmp_path):
    plan = Plan.load(_tiny_plan(tmp_path))
    plan.metadata["bad"] = object()  # not JSON-serialisable: the write fails midway
    dest = tmp_path / "p.json"
    dest.write_text("old")
    with pytest.raises(TypeError):
        plan.save(dest)
    assert dest.read_text() == "old" and _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="does not exist"):
        plan.save(tmp_path / "nope" / "p.json")


@pytest.mark.parametrize("flag", ["--gantt", "--trace"])
def test_simulate_outputs_into_missing_dir(tmp_path, capsys, flag):
    plan = _tiny_plan(tmp_path)
    code = main(["simulate", plan, flag, str(tmp_path / "missing" / "f.out")])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and "does not exist" in err
    assert _leftovers(tmp_path) == []


def test_simulate_trace_written_atomically(tmp_path):
    plan = _tiny_plan(tmp_path)
    trace = tmp_path / "t.json"
    assert main(["simulate", plan, "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())  # complete JSON
    assert _leftovers(tmp_path) == []


def test_repro_unwritable_results_dir(tmp_path, capsys):
    from repro.__main__ import main as repro_main

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    # A results dir under a regular file cannot be created, whoever runs the test (even root).
    code = repro_main(["run", "selftest-a", "--registry", REGISTRY, "--no-progress",
                       "--results-dir", str(blocker / "results")])
    err = capsys.readouterr().err
    assert code == 2 and "--results-dir" in err and "writable" in err
    assert os.path.isfile(blocker)


# -- 2. numbers -------------------------------------------------------------------------------
def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "-inf", "soon"])
@pytest.mark.parametrize("command", ["plan", "compare"])
def test_time_limit_must_be_positive_finite(capsys, value, command):
    head = ["plan", "--method", "megatron"] if command == "plan" else \
        ["compare", "--methods", "megatron"]
    args = [a for a in TINY]
    at = args.index("--time-limit")
    args[at:at + 2] = [f"--time-limit={value}"]  # '=' form: argparse reads '-inf' as a flag
    err = _usage_error([*head, *args], capsys)
    assert "--time-limit" in err and "number > 0" in err


@pytest.mark.parametrize(("flag", "value"), [("--global-batch", "1000000000"),
                                             ("--global-batch", "0"),
                                             ("--global-batch", "2.5"),
                                             ("--token-budget", "1e15"),
                                             ("--token-budget", "-3")])
def test_batch_size_bounds_checked_before_sampling(capsys, flag, value):
    args = [a for a in TINY if a not in ("--global-batch", "8")]
    err = _usage_error(["plan", "--method", "megatron", *args, flag, value], capsys)
    assert f"argument {flag}" in err and "integer" in err


def test_token_budget_accepts_whole_exponent_notation(tmp_path, capsys):
    args = [a for a in TINY if a not in ("--global-batch", "8")]
    assert main(["plan", "--method", "megatron", *args, "--token-budget", "2e4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_tokens"] == 20000


@pytest.mark.parametrize(("flag", "value"), [("--timeout", "0"), ("--timeout", "nan"),
                                             ("--nproc", "0"), ("--nproc", "-2")])
def test_run_timeout_and_nproc_must_be_positive(tmp_path, capsys, flag, value):
    err = _usage_error(["run", "--example", "packed", "--model", "tiny", flag, value], capsys)
    assert flag in err


# -- 3. integers ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1.9, 2.0, True, "3", None])
def test_batch_lengths_must_be_integers(bad):
    from slimpack.batch import Batch

    with pytest.raises(ValueError, match=r"Sequence\.length must be an integer"):
        Batch.from_lengths([100, bad])


def test_sequence_fields_must_be_integers():
    from slimpack.batch import Sequence

    with pytest.raises(ValueError, match=r"Sequence\.length must be an integer, got 2\.5"):
        Sequence(seq_id=0, length=2.5)
    with pytest.raises(ValueError, match=r"Sequence\.seq_id must be an integer"):
        Sequence(seq_id=False, length=3)


def test_numpy_integers_accepted_and_normalised():
    import numpy as np

    from slimpack.batch import Batch
    from slimpack.specs import ParallelSpec

    batch = Batch.from_lengths(np.array([3, 5], dtype=np.int32))
    assert batch.lengths == [3, 5] and all(type(n) is int for n in batch.lengths)
    spec = ParallelSpec(tp=np.int64(2), dp=np.int16(3))
    assert (spec.tp, spec.dp, spec.world) == (2, 3, 6) and type(spec.tp) is int
    json.dumps(spec.to_dict())  # plain ints serialise


@pytest.mark.parametrize(("field", "bad"), [("tp", 2.5), ("cp", 2.0), ("pp", True),
                                            ("vpp", "2"), ("dp", None), ("world_size", 4.0)])
def test_parallel_spec_degrees_must_be_integers(field, bad):
    from slimpack.specs import ParallelSpec

    with pytest.raises(ValueError, match=rf"ParallelSpec\.{field} must be an integer"):
        ParallelSpec(**{field: bad})
    if field != "world_size":
        with pytest.raises(ValueError, match=r"ParallelSpec\.\w+ must be an integer"):
            ParallelSpec.for_world(8, **{field: bad}) if field in ("tp", "cp", "pp", "vpp") \
                else ParallelSpec.for_world(bad)


# -- 4. plan JSON -----------------------------------------------------------------------------
def _plan_dict(tmp_path) -> dict:
    return json.loads(open(_tiny_plan(tmp_path)).read())


def _set(data: dict, path: str, value) -> dict:
    node = data
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(("path", "value", "message"), [
    ("method", None, "method must be a string"),
    ("model", 7, "model must be a string"),
    ("parallel.pp", "2", "parallel.pp must be an integer"),
    ("parallel", None, "parallel must be an object"),
    ("sequence_lengths.0", "5", "sequence_lengths\\['0'\\] must be an integer"),
    ("sequence_lengths.0", 5.5, "sequence_lengths\\['0'\\] must be an integer"),
    ("phases", {}, "phases must be a list"),
    ("phases.0", None, "phases\\[0\\] must be an object"),
    ("phases.0.groups.0.pp", "2", "phases\\[0\\].groups\\[0\\].pp must be an integer"),
    ("phases.0.groups.0.tp", None, "groups\\[0\\].tp must be an integer"),
    ("phases.0.groups.0.schedule", 1, "groups\\[0\\].schedule must be a string"),
    ("phases.0.groups.0.ranks", "01", "groups\\[0\\].ranks must be a list"),
    ("phases.0.groups.0.slices.0.segments.0", [0, 0.0, 10.5],
     "slices\\[0\\].segments\\[0\\]\\[1\\] must be an integer"),
    ("phases.0.groups.0.slices.0.segments.0", [0, 1],
     "segments\\[0\\] must be \\[seq_id, start, end\\]"),
    ("phases.0.groups.0.forward_units.0", [0.0], "forward_units\\[0\\]\\[0\\] must be an integer"),
    ("phases.0.groups.0.vocab_parallel_pp", 1, "vocab_parallel_pp must be true or false"),
    ("metadata", [], "metadata must be an object"),
])
def test_plan_json_fields_are_type_checked(tmp_path, path, value, message):
    from slimpack.plan import PlanError

    data = _set(_plan_dict(tmp_path), path, value)
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(data)


@pytest.mark.parametrize("top", [[], "plan", None, 3])
def test_plan_json_top_level_must_be_an_object(tmp_path, capsys, top):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(top))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "top level must be an object" in err and "Traceback" not in err


def test_plan_json_missing_field_named(tmp_path):
    from slimpack.plan import PlanError

    data = _plan_dict(tmp_path)
    del data["phases"][0]["groups"][0]["forward_units"]
    with pytest.raises(PlanError, match="missing field 'phases\\[0\\].groups\\[0\\].forward_units'"):
        Plan.from_dict(data)


def test_plan_json_is_strict_and_round_trips_nan_as_null(tmp_path):
    plan = Plan.load(_tiny_plan(tmp_path))
    plan.metadata.update(estimated_seconds=float("nan"), worst=float("inf"),
                         nested={"x": [1.0, float("-inf")]})
    path = tmp_path / "nan.json"
    plan.save(path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    again = Plan.load(path)
    assert again.metadata["estimated_seconds"] is None and again.metadata["worst"] is None
    assert again.metadata["nested"] == {"x": [1.0, None]}


def test_step_record_json_nested_and_strict():
    from slimpack.records import StepRecord

    rec = StepRecord(method="m", backend="sim", model="tiny", hardware="h100",
                     parallel={"tp": 1, "pp": 2}, num_gpus=2, num_sequences=1, num_tokens=8,
                     step_time_s=1.0, tokens_per_s=8.0, mfu=float("nan"), bubble_fraction=0.1,
                     peak_memory_bytes=(1.0, 2.0), oom=False, imbalance_degree=1.0,
                     ideal_step_time_s=0.0, extra={"err": float("inf")})
    data = json.loads(rec.to_json())
    assert data["parallel"] == {"tp": 1, "pp": 2} and data["peak_memory_bytes"] == [1.0, 2.0]
    assert data["mfu"] is None and data["step_over_ideal"] is None and data["extra"]["err"] is None
    assert json.loads(rec.to_row()["extra"]) == {"err": None}


# -- 5. exit codes ----------------------------------------------------------------------------
def test_compare_exits_1_when_a_method_fails_and_still_prints_table(capsys):
    # naive accepts the option's type but refuses the value when it plans: a runtime failure.
    code = main(["compare", "--methods", "naive,megatron", *TINY,
                 "--option", "naive:packing=nope"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "megatron" in out and "error" in out  # the table is still there
    assert "naive failed: ValueError" in err and "1 of 2 methods failed" in err


def test_compare_prices_each_method_under_its_papers_zero_stage(capsys):
    # FlexSP's paper ran it with ZeRO-3: compare does too unless --zero-stage says otherwise.
    argv = ["compare", "--methods", "megatron,flexsp", "--model", "tiny", "--hardware", "h100",
            "--gpus", "2", "--dataset", "wikipedia", "--context", "4096", "--global-batch", "8",
            "--auto-parallel", "--json"]
    assert main(argv) == 0
    stages = {r["method"]: r["zero_stage"] for r in json.loads(capsys.readouterr().out)["records"]}
    assert stages == {"megatron": 1, "flexsp": 3}
    assert main([*argv, "--zero-stage", "flexsp=1"]) == 0
    stages = {r["method"]: r["zero_stage"] for r in json.loads(capsys.readouterr().out)["records"]}
    assert stages == {"megatron": 1, "flexsp": 1}


def test_compare_json_also_exits_1_on_failure(capsys):
    code = main(["compare", "--methods", "naive", *TINY, "--option", "naive:packing=nope",
                 "--json"])
    records = json.loads(capsys.readouterr().out)["records"]
    assert code == 1 and records[0]["error"]


OOM = ["--model", "llama-70b", "--hardware", "a100-40g", "--gpus", "8", "--tp", "8",
       "--dataset", "wikipedia", "--context", "32768", "--global-batch", "4",
       "--time-limit", "1"]


def test_plan_warns_when_it_does_not_fit_and_strict_exits_1(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--method", "megatron", *OOM, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "does not fit in a100-40g memory" in err and "GiB" in err
    assert Plan.load(out).memory_fits is False
    out.unlink()
    assert main(["plan", "--method", "megatron", *OOM, "-o", str(out), "--strict"]) == 1
    assert "--strict" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("method", method_names())
def test_strict_exits_1_for_every_method_whose_plan_does_not_fit(method, tmp_path, capsys):
    """Every registered method gives a memory verdict (issue 24: SlimPack gave none, and
    ``--strict`` wrote its 149 GiB plan): llama-70b on 8 A100-40G fits for none of them."""
    out = tmp_path / "p.json"
    layout = ["--tp", "4", "--pp", "2"] if method == "slimpipe" else []
    args = OOM if not layout else [*OOM[:6], *layout, *OOM[8:]]
    assert main(["plan", "--method", method, *args, "-o", str(out), "--strict"]) == 1
    err = capsys.readouterr().err
    assert "does not fit in a100-40g memory" in err and "--strict" in err
    assert not out.exists()


def test_plan_that_fits_prints_no_warning(tmp_path, capsys):
    assert main(["plan", "--method", "megatron", *TINY, "--strict"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_simulate_refuses_plan_for_another_model(tmp_path, capsys):
    plan = _tiny_plan(tmp_path)
    assert main(["simulate", plan, "--model", "llama-70b"]) == 2
    err = capsys.readouterr().err
    assert "--model 'llama-70b' does not match the plan's model 'tiny'" in err
    assert main(["simulate", plan, "--model", "tiny"]) == 0


def test_simulate_refuses_degrees_the_model_cannot_take(tmp_path, capsys):
    data = _plan_dict(tmp_path)
    data["model"] = ""  # no model recorded: --model is taken at its word, then checked
    for group in (g for ph in data["phases"] for g in ph["groups"]):
        group["tp"], group["pp"] = 8, 1
        group["ranks"] = list(range(8))
    data["parallel"].update(tp=8, pp=1, dp=1)
    path = tmp_path / "tp8.json"
    path.write_text(json.dumps(data))
    assert main(["simulate", str(path), "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "cannot run tiny" in err and "num_heads=4" in err


# -- more of issue 14's list: options that were silently ignored ---------------------------------
def test_memory_refuses_options_its_schedule_ignores(capsys):
    base = ["memory", "--model", "llama-7b", "--seq-len", "4096", "--pp", "4"]
    assert main([*base, "--slices", "4", "--schedule", "1f1b"]) == 2
    assert "--slices 4 applies only to --schedule slimpipe" in capsys.readouterr().err
    assert main([*base, "--vpp", "2", "--schedule", "1f1b"]) == 2
    assert "--vpp 2 needs --schedule interleaved or slimpipe" in capsys.readouterr().err
    assert main([*base, "--slices", "4", "--schedule", "slimpipe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slices"] == 4


def test_uniform_interleaved_with_too_few_microbatches_has_no_closed_form(capsys):
    args = ["simulate", "--uniform", "--schedule", "interleaved", "--pp", "4", "--vpp", "2",
            "--json"]
    assert main([*args, "--microbatches", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["closed_form_bubble_fraction"] is None and "needs --microbatches" in \
        out["closed_form_note"]
    assert main([*args, "--microbatches", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bubble_fraction"] == pytest.approx(out["closed_form_bubble_fraction"], rel=1e-9)


def test_golden_check_with_no_golden_files_fails(tmp_path, capsys):
    from repro.__main__ import main as repro_main

    assert repro_main(["golden", "--check", "--results-dir", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "no golden headlines" in err and "golden: ok" not in err


def test_run_refuses_a_model_too_big_for_host_memory(capsys):
    from slimpack.cli.run import check_host_memory, host_memory_available
    from slimpack.runtime.examples import packed_plan
    from slimpack.specs import model_preset

    plan = packed_plan(pp=2, dp=2)
    tiny = model_preset("tiny")
    check_host_memory(plan, tiny, dtype="fp32", available=2**30)  # a few MB: fine
    need = 2 * tiny.num_params * 4 * 2
    with pytest.raises(ValueError, match=r"needs at least .* GiB of host memory"):
        check_host_memory(plan, tiny, dtype="fp32", available=need - 1)
    check_host_memory(plan, tiny, dtype="bf16", available=need - 1)  # half the bytes

    available = host_memory_available()
    if available is None or available > 600 * 2**30:
        pytest.skip("needs /proc/meminfo and under 600 GiB free")
    assert main(["run", "--example", "packed", "--model", "llama-70b", "--pp", "2"]) == 2
    assert "GiB of host memory on CPU" in capsys.readouterr().err


# -- the table: every bad input of issue 14 and its neighbours, one clear line each ---------------
def _variant(base: dict, edit) -> object:  # noqa: ANN001 - a callable editing the plan dict
    data = json.loads(json.dumps(base))
    replaced = edit(data)  # an edit returns a whole new document, or None after editing in place
    return data if replaced is None else replaced


PLAN_EDITS = {
    "LIST": lambda d: [],
    "PPSTR": lambda d: d["parallel"].update(pp="2"),
    "FLOATSEG": lambda d: d["phases"][0]["groups"][0]["slices"][0]["segments"][0].__setitem__(
        2, 10.5),
    "NULLMETHOD": lambda d: d.update(method=None),
    "NULLRANKS": lambda d: d["phases"][0]["groups"][0].update(ranks=None),
}
W = [a for a in TINY if a not in ("--global-batch", "8")]
TABLE = [
    (["compare", "--methods", "megatron", *TINY, "--zero-stage", "2"], "one of 0, 1, 3"),
    (["compare", "--methods", "megatron", *TINY, "--zero-stage", "flexsp=3"],
     "'flexsp' is not in --methods"),
    (["plan", "--method", "megatron", *TINY, "-o", "{missing}/p.json"], "does not exist"),
    (["plan", "--method", "megatron", *TINY, "-o", "{tmp}"], "is a directory"),
    (["plan", "--method", "megatron", *TINY, "--time-limit=-1"], "finite number > 0"),
    (["plan", "--method", "megatron", *TINY, "--time-limit=nan"], "finite number > 0"),
    (["plan", "--method", "megatron", *TINY, "--time-limit=inf"], "finite number > 0"),
    (["plan", "--method", "megatron", *W, "--global-batch", "1000000000"], "[1, 1,000,000]"),
    (["plan", "--method", "megatron", *W, "--token-budget", "1e15"], "--token-budget"),
    (["plan", "--method", "megatron", *W, "--global-batch", "2.5"], "must be an integer"),
    (["plan", "--method", "nope", *TINY], "invalid choice"),
    (["plan", "--method", "megatron", *TINY, "--model", "gpt-9"], "unknown model preset"),
    (["plan", "--method", "megatron", *TINY, "--hardware", "tpu"], "unknown hardware preset"),
    (["plan", "--method", "megatron", *TINY, "--dataset", "no-such"], "profiles are"),
    (["plan", "--method", "megatron", *TINY, "--context", "0"], "--context must be >= 1"),
    (["plan", "--method", "megatron", *TINY, "--pp", "3"], "must divide world_size 2"),
    (["plan", "--method", "megatron", *TINY, "--gpus", "0"], "--gpus must be >= 1"),
    (["plan", "--method", "megatron", *TINY, "--auto-parallel"], "not both"),
    (["plan", "--method", "megatron", *TINY, "--option", "nope=1"], "unknown option 'nope'"),
    (["plan", "--method", "megatron", *OOM, "--strict"], "does not fit"),
    (["compare", "--methods", "", *TINY], "at least one planner"),
    (["compare", "--methods", "megatron,nope", *TINY], "unknown ['nope']"),
    (["compare", "--methods", "megatron", *TINY, "--option", "search=false"], "name the method"),
    (["compare", "--methods", "naive", *TINY, "--option", "naive:packing=nope"],
     "naive failed"),
    (["simulate", "{missing}.json"], "does not exist"),
    (["simulate"], "give a plan JSON file"),
    (["simulate", "--uniform", "--pp", "0"], "argument --pp"),
    (["simulate", "--uniform", "--schedule", "1f1b", "--vpp", "2"], "needs --vpp 1"),
    (["simulate", "PLAN", "--gantt", "{missing}/g.png"], "--gantt"),
    (["simulate", "PLAN", "--trace", "{missing}/t.json"], "--trace"),
    (["simulate", "PLAN", "--model", "llama-70b"], "does not match the plan's model"),
    (["simulate", "LIST"], "top level must be an object"),
    (["simulate", "PPSTR"], "parallel.pp must be an integer"),
    (["simulate", "FLOATSEG"], "segments[0][2] must be an integer, got 10.5"),
    (["simulate", "NULLMETHOD"], "method must be a string"),
    (["simulate", "NULLRANKS"], "groups[0].ranks must be a list"),
    (["run", "--example", "packed", "--model", "tiny", "--timeout", "0"], "argument --timeout"),
    (["run", "--example", "packed", "--model", "tiny", "--nproc", "0"], "argument --nproc"),
    (["run", "--model", "tiny"], "exactly one"),
    (["memory", "--model", "llama-7b", "--seq-len", "4096", "--slices", "4"],
     "applies only to --schedule slimpipe"),
    (["memory", "--model", "llama-7b", "--seq-len", "4096", "--vpp", "2"], "needs --schedule"),
    (["memory", "--model", "llama-7b", "--seq-len", "-5"], "seq_len must be > 0"),
    (["memory", "--model", "llama-7b", "--seq-len", "4096", "--tp", "0"], "argument --tp"),
    (["profile", "--model", "tiny", "--out", "{tmp}/c.csv", "--prefixes", "512"], "include 0"),
]


@pytest.mark.parametrize(("argv", "message"), TABLE, ids=[" ".join(a[:2]) + f" #{i}"
                                                          for i, (a, _) in enumerate(TABLE)])
def test_bad_input_table(tmp_path, capsys, argv, message):
    plans = {}
    if any(a in PLAN_EDITS or a == "PLAN" for a in argv):
        plans["PLAN"] = _tiny_plan(tmp_path)
        base = json.loads(open(plans["PLAN"]).read())
        for name, edit in PLAN_EDITS.items():
            path = tmp_path / f"{name}.json"
            path.write_text(json.dumps(_variant(base, edit)))
            plans[name] = str(path)
        capsys.readouterr()
    argv = [plans.get(a, a.format(tmp=tmp_path, missing=tmp_path / "missing")) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code in (1, 2), err
    assert message in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp" or ".tmp" in p.name] == []


def test_every_flag_has_help_and_help_lists_presets():
    import argparse

    from slimpack.cli.main import build_parser
    from slimpack.specs import HARDWARE_PRESETS, MODEL_PRESETS

    missing = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}")
            elif not action.help and action.dest != "help":
                missing.append(f"{prefix} {action.option_strings or action.dest}")

    parser = build_parser()
    walk(parser, "slimpack")
    assert missing == []
    plan = parser._subparsers._group_actions[0].choices["plan"]  # noqa: SLF001
    helps = {a.dest: a.help for a in plan._actions}  # noqa: SLF001 - unwrapped help strings
    assert all(m in helps["model"] for m in MODEL_PRESETS)
    assert all(h in helps["hardware"] for h in HARDWARE_PRESETS)


@pytest.mark.parametrize("argv", [
    ["data", "plot", "wikipedia", "-o", "{out}"],
    ["profile", "--model", "tiny", "--out", "{out}", "--tokens", "16", "--prefixes", "0",
     "--repeats", "1", "--quiet"],
    ["run", "--example", "packed", "--model", "tiny", "--out", "{out}"],
])
def test_commands_that_create_directories_check_outputs_first(tmp_path, capsys, argv):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    flag_at = next(i for i, a in enumerate(argv) if a == "{out}") - 1
    for out, message in ((blocker / "sub" / "x.out", "is not a directory"),
                         (tmp_path, "is a directory")):
        assert main([a.format(out=out) for a in argv]) == 2
        err = capsys.readouterr().err
        assert argv[flag_at] in err and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
