"""Uneven pipeline splits (``ParallelSpec.pipeline_split="embedding-and-loss"``: Megatron-Core's
``account_for_embedding_in_pipeline_split`` and ``account_for_loss_in_pipeline_split``): the
layout, the plan field the Megatron planners set, the simulator's time, memory and data-parallel
sync, the runtime's exact gradients, the refusals, and the published run it makes
expressible."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import KernelCostModel
from slimpack.plan import Plan, PlanError
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.launch import run_plan
from slimpack.runtime.parity import parity
from slimpack.runtime.reference import reference_step
from slimpack.runtime.stage import layer_block
from slimpack.runtime.validate import runtime_refusal
from slimpack.sim import simulate
from slimpack.sim.costs import group_costs
from slimpack.sim.dp_sync import stage_layers
from slimpack.sim.memory import group_memory
from slimpack.specs import ParallelSpec, hardware_preset, model_preset
from slimpack.validation.hopper import express_hopper, load_hopper_records
from slimpack.validation.megatron import validate

SMALL = model_preset("small")  # 8 layers: 8 + 2 over pp 5 -> 1, 2, 2, 2, 1
H100 = hardware_preset("h100")
SPLIT = ParallelSpec(tp=1, pp=5, dp=1, pipeline_split="embedding-and-loss")
COST = KernelCostModel(model=SMALL, hardware=H100)
BATCH = Batch.from_lengths([2048, 1500, 1000, 700, 400, 300] * 5, source="test")


def _plan(parallel: ParallelSpec = SPLIT, method: str = "megatron") -> Plan:
    return plan_method(method, BATCH, SMALL, H100, parallel, COST, context=2048)


def test_the_split_counts_the_embedding_and_the_loss_as_a_layer_each():
    """Llama 3.1 405B (126 layers) at pp 8 vpp 8, as Megatron-Bridge 25.11 ran it: 128 / 64 =
    2 layers a chunk, the first and last chunk one decoder layer."""
    par = ParallelSpec(tp=8, pp=8, vpp=8, dp=1, pipeline_split="embedding-and-loss")
    assert par.virtual_stage_layers(126) == (1,) + (2,) * 62 + (1,)
    assert SPLIT.virtual_stage_layers(8) == (1, 2, 2, 2, 1)
    assert ParallelSpec(pp=2, vpp=2).virtual_stage_layers(8) == (2, 2, 2, 2)
    with pytest.raises(ValueError, match=r"num_layers \+ 2 = 9"):
        SPLIT.virtual_stage_layers(7)
    with pytest.raises(ValueError, match="a layer each"):
        ParallelSpec(pp=4, pipeline_split="embedding-and-loss").virtual_stage_layers(2)
    with pytest.raises(ValueError, match="pipeline_split must be one of even, embedding-and-loss"):
        ParallelSpec(pp=2, pipeline_split="first-heavy")
    assert ParallelSpec.from_dict(SPLIT.to_dict()) == SPLIT
    assert "pipeline_split" not in ParallelSpec(pp=2).to_dict()  # records keep their bytes
    assert "split=embedding-and-loss" in SPLIT.describe()


def test_the_megatron_plan_carries_the_split_and_round_trips(tmp_path):
    plan = _plan()
    assert {g.virtual_stage_layers for g in plan.groups()} == {(1, 2, 2, 2, 1)}
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    group = next(plan.groups())
    with pytest.raises(PlanError, match="pp\\*vpp = 5 integers >= 1"):
        dataclasses.replace(group, virtual_stage_layers=(2, 2, 2, 2))
    even = dataclasses.replace(plan, parallel=dataclasses.replace(SPLIT, pipeline_split="even"))
    with pytest.raises(PlanError, match="plan's pipeline_split is 'even'"):
        even.validate()
    other = dataclasses.replace(plan, phases=tuple(
        dataclasses.replace(ph, groups=tuple(dataclasses.replace(
            g, virtual_stage_layers=(2, 1, 2, 2, 1)) for g in ph.groups)) for ph in plan.phases))
    with pytest.raises(PlanError, match=r"do not follow .*\[1, 2, 2, 2, 1\]"):
        other.validate()


def test_methods_that_do_not_plan_the_split_are_refused():
    with pytest.raises(ValueError, match="slimpack: pipeline_split 'embedding-and-loss' is not "
                                         "planned by this method"):
        _plan(method="slimpack")
    with pytest.raises(PlanError, match="virtual_stage_layers with "
                                        "Plan.attention_redistribution at pp > 1"):
        _plan().with_attention_redistribution(True).validate()


def test_the_runtime_runs_the_split_with_exact_gradients():
    """tiny (4 layers) at pp 3: blocks of 1, 2 and 1 layers on three gloo processes, loss
    and gradients equal to the unsliced model's."""
    tiny = model_preset("tiny")
    par = ParallelSpec(pp=3, dp=1, pipeline_split="embedding-and-loss")
    batch = Batch.from_lengths([96, 64, 40, 24, 16, 8], source="test")
    plan = plan_method("megatron", batch, tiny, H100, par,
                       KernelCostModel(model=tiny, hardware=H100), context=96)
    assert {g.virtual_stage_layers for g in plan.groups()} == {(1, 2, 1)}
    assert runtime_refusal(plan, tiny) == ""
    result = run_plan(plan, tiny, RuntimeConfig(seed=3), return_grads=True, timeout_s=120)
    ref = reference_step(tiny, plan.sequence_lengths, seed=3)
    check = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert check.ok, check.describe()
    assert layer_block(tiny, 3, 1, (1, 2, 1)) == range(1, 3)
    with pytest.raises(ValueError, match="must be 3 counts adding up to num_layers = 4"):
        layer_block(tiny, 3, 0, (2, 2, 1))


def test_each_virtual_stage_is_priced_and_holds_states_for_its_own_layers():
    group = next(_plan().groups())
    costs = group_costs(group, model=SMALL, cost=COST, gpus_per_node=8)
    assert costs.layers == [1, 2, 2, 2, 1]
    for u, one in enumerate(costs.fwd_s[0]):  # no head on virtual stage 0
        assert costs.fwd_s[1][u] == pytest.approx(2 * one, rel=1e-12)
    states = group_memory(group, model=SMALL, dp=1).model_state_bytes
    two_layers = group_memory(next(_plan(dataclasses.replace(SPLIT, pp=4, pipeline_split="even"))
                                   .groups()), model=SMALL, dp=1).model_state_bytes[1]
    assert states[1:4] == pytest.approx([two_layers] * 3, rel=1e-12)  # 2 layers, no embedding
    assert states[0] == pytest.approx(states[4], rel=1e-12)  # 1 layer + embedding / + head
    assert states[0] > two_layers / 2
    assert stage_layers(5, 1, 8, SPLIT.virtual_stage_layers(8)) == [
        {0}, {1, 2}, {3, 4}, {5, 6}, {7}]


def test_the_memory_walk_holds_each_stages_own_layers_in_flight():
    """1F1B at pp 5: stage 0 holds 5 micro-batches in flight on its 1 layer, stage 1 holds 4
    on its 2 layers, so stage 1 peaks higher in activations (with the even-split default,
    2 layers on stage 0, it would be the other way round)."""
    record = simulate(_plan(), model=SMALL, hardware=H100, cost=COST).record
    activations = record.extra["peak_activation_bytes"]
    assert activations[1] == pytest.approx(activations[0] * 8 / 5, rel=0.05)
    assert activations[1:4] == sorted(activations[1:4], reverse=True) and not record.oom


def test_the_megatron_bridge_llama31_405b_run_is_expressed():
    """Megatron-Bridge 25.11 DGX-H100, Llama 3.1 405B FP8-CS on 1,024 GPUs (tp 8 pp 8 cp 2
    vp 8): 292 tokens/s/GPU published. Expressed with the recipe's embedding-and-loss split
    and predicted within the Hopper set's 10% target; it fits memory as it ran."""
    record = next(r for r in load_hopper_records()
                  if r["id"] == "bridge2511-llama3.1-405b-fp8cs-1024gpu")
    case = express_hopper(record)
    assert case.parallel.pipeline_split == "embedding-and-loss"
    result = validate([record], express_fn=express_hopper)
    assert abs(result.rows[0].bias) < 0.10
    assert result.predicted_not_to_fit == []
    even = json.loads(json.dumps(record))
    del even["parallel"]["pipeline_split"]
    assert "must divide num_layers=126" in express_hopper(even).reason


def test_the_cli_plans_simulates_and_refuses_the_split(tmp_path, capsys):
    from slimpack.cli.main import main

    flags = ["--model", "llama-7b", "--gpus", "4", "--pp", "2", "--dataset", "commoncrawl",
             "--context", "8192", "--global-batch", "8", "--pipeline-split",
             "embedding-and-loss"]
    out = tmp_path / "plan.json"
    assert main(["plan", "--method", "megatron", *flags, "-o", str(out)]) == 0
    plan = Plan.load(out)
    assert plan.parallel.pipeline_split == "embedding-and-loss"
    assert {g.virtual_stage_layers for g in plan.groups()} == {(16, 16)}  # 32 + 2 over 2
    assert main(["simulate", str(out), "--hardware", "h100"]) == 0
    capsys.readouterr()
    assert main(["plan", "--method", "slimpack", *flags]) == 2
    assert "slimpack: pipeline_split 'embedding-and-loss' is not planned" \
        in capsys.readouterr().err
    assert main(["plan", "--method", "megatron", *flags[:4], "--auto-parallel", *flags[6:]]) == 2
    assert "--pipeline-split" in capsys.readouterr().err
