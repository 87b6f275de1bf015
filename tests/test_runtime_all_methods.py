"""Every registered method's plan, written by ``slimpack plan`` at a CPU-sized setting (tiny
model, 8 processes, 4096 tokens of Wikipedia lengths, context 512), runs on the runtime
(gloo, fp32) gradient-exact, or is refused naming the field; and the simulator, told the
runtime's dtype and attention path, predicts each rank's executed activation peak
(docs/architecture.md, runtime, "Simulated vs executed activation memory")."""

from __future__ import annotations

import json

import pytest

from slimpack.cli.main import main as cli
from slimpack.methods import method_names
from slimpack.plan import Plan
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.many import run_plans
from slimpack.runtime.reference import reference_step
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs import model_preset
from slimpack.validation.activation_memory import SETTING, compare_ranks, default_accounting_error

TINY = model_preset(SETTING.model)
CONFIG = RuntimeConfig(seed=1)

REFUSED: dict[str, str] = {}
"""Methods whose plan at this setting the runtime refuses, and the field it names (none: the
last, SlimPipe's attention_redistribution at pp > 1, is executed since issue 23)."""

EXACT_BOUND = 1e-5
"""Every accepted plan (dp8; pp2 dp4; tp2 pp2 dp2; pp4 dp2; ring cp 1/2/4 groups; cp2 pp2 dp2;
SlimPack's 128-token slices in asymmetric units at pp2 dp4, its LM head spread over the
pipeline ranks): the runtime accounting matches the tracked peak to a few bytes per rank
(measured: at most 1.2e-6 relative, tp2's)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plans")
    plans, refusals = {}, {}
    for method in method_names():
        path = tmp / f"{method}.json"
        assert cli(SETTING.plan_args(method, str(path))) == 0
        plan = Plan.load(path)
        assert plan.world_size == SETTING.gpus
        try:
            check_runtime_plan(plan, TINY, world_size=SETTING.gpus)
        except ValueError as err:
            refusals[method] = str(err)
            continue
        plans[method] = plan
    results = run_plans(list(plans.values()), TINY, CONFIG, return_grads=True, timeout_s=900)
    return plans, refusals, dict(zip(plans, results, strict=True))


@pytest.mark.slow
def test_refused_plans_name_the_field(runs):
    _, refusals, _ = runs
    assert set(refusals) == set(REFUSED)
    for method, field in REFUSED.items():
        assert field in refusals[method]


@pytest.mark.slow
def test_every_accepted_plan_trains_like_the_unsliced_model(runs):
    plans, _, results = runs
    assert len(plans) == len(method_names()) - len(REFUSED)
    for method, plan in plans.items():
        ref = reference_step(TINY, plan.sequence_lengths, seed=CONFIG.seed)
        result = results[method]
        assert abs(result.loss - ref.loss) <= 1e-6 * abs(ref.loss), method
        grads = result.grads()
        assert set(grads) == set(ref.grads), method
        worst = max(float((grads[n] - w).norm() / w.norm()) for n, w in ref.grads.items())
        assert worst < 1e-5, f"{method}: max norm-relative gradient error {worst:.2e}"


@pytest.mark.slow
def test_run_record_holds_step_time_peak_memory_per_rank_and_throughput(runs):
    plans, _, results = runs
    for method, plan in plans.items():
        record = results[method].record
        assert record.method == method and record.num_gpus == SETTING.gpus
        assert record.step_time_s > 0
        assert record.tokens_per_s == pytest.approx(plan.num_tokens / record.step_time_s)
        per_rank = record.extra["rank_peak_memory_bytes"]
        activations = record.extra["rank_peak_activation_bytes"]
        assert len(per_rank) == len(activations) == SETTING.gpus
        assert all(0 < a < m for a, m in zip(activations, per_rank, strict=True)), method
        stages = [0.0] * plan.parallel.pp
        for rank, stage in check_runtime_plan(plan, TINY).stage_of_rank.items():
            stages[stage] = max(stages[stage], per_rank[rank])
        assert list(record.peak_memory_bytes) == stages


@pytest.mark.slow
def test_simulated_activation_peak_per_rank_matches_the_runtime(runs):
    plans, _, results = runs
    layouts = set()
    for method, plan in plans.items():
        rows = compare_ranks(plan, TINY, results[method].record, CONFIG)
        assert len(rows) == SETTING.gpus
        worst = max(abs(r.error) for r in rows)
        assert worst <= EXACT_BOUND, f"{method}: max activation error {worst:.2e}"
        # Untold (bf16, FlashAttention, Megatron's saves) it is far off: measured -61%..-75%.
        assert default_accounting_error(plan, TINY, results[method].record) < -0.5, method
        layouts.add(tuple(sorted(plan.parallel.to_dict().items())))
    assert len(layouts) >= 5  # dp8, pp2 dp4, tp2 pp2 dp2, pp4 dp2, cp4 dp2, cp2 pp2 dp2


@pytest.mark.slow
def test_cli_run_prints_what_the_record_holds(tmp_path, capsys):
    path, out = tmp_path / "slimpack.json", tmp_path / "run.json"
    assert cli(SETTING.plan_args("slimpack", str(path))) == 0
    assert cli(["run", str(path), "--warmup", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert f"step {record['step_time_s'] * 1e3:.1f} ms" in printed
    assert f"{record['tokens_per_s']:,.0f} tokens/s" in printed
    mib = [round(b / 2**20, 2) for b in record["extra"]["rank_peak_memory_bytes"]]
    assert f"peak memory per rank {mib} MiB" in printed and len(mib) == SETTING.gpus
    act = [round(b / 2**20, 2) for b in record["extra"]["rank_peak_activation_bytes"]]
    assert f"model state excluded) {act} MiB" in printed
