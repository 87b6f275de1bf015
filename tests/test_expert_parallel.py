"""Expert parallelism in the simulator (``slimpack/sim/expert_dispatch.py``): the token
dispatcher's all-to-alls, expert states sharded over the expert-data-parallel group, and
the refusals of what is not modelled. Numbers are checked against hand-written formulas."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slimpack.cost.kernel_model import KernelCostModel
from slimpack.cost.memory import ADAM_FP32_BYTES, model_state_bytes
from slimpack.plan import PlanError
from slimpack.sim import simulate
from slimpack.sim.synthetic import uniform_plan
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec
from slimpack.validation.hopper import express_hopper, load_hopper_records
from slimpack.validation.megatron import Skipped

H100 = hardware_preset("h100-80g")
MIXTRAL = model_preset("mixtral-8x7b")  # 8 experts, top-2, hidden 4096, 32 layers
SEQ = 4096


def _plan(*, ep: int, dp: int = 4, tp: int = 1, recompute: str = "none", model=MIXTRAL):
    plan = uniform_plan(schedule="1f1b", pp=2, microbatches=4, seq_len=SEQ, tp=tp, dp=dp,
                        model=model.name, recompute=recompute)
    return dataclasses.replace(plan, parallel=dataclasses.replace(plan.parallel, ep=ep))


def _a2a_by_hand(cost: KernelCostModel, rank_tokens: int, ep: int) -> float:
    """One all-to-all inside a node: (ep-1) latencies + (ep-1)/ep of the routed rows
    (tokens * top_k * hidden * 2 B) at the link's bandwidth."""
    hw = cost.comm.hardware
    nbytes = rank_tokens * MIXTRAL.moe_top_k * MIXTRAL.hidden * 2
    return (ep - 1) * hw.intra_node_latency_s + (ep - 1) / ep * nbytes / (hw.intra_node_gbps * 1e9)


@pytest.mark.parametrize("recompute, backward_a2a", [("none", 2), ("full", 4)])
def test_each_layer_pays_two_all_to_alls_each_way(recompute, backward_a2a):
    """Dispatch and combine in forward, their gradients in backward; a fully recomputed
    layer dispatches its tokens again before its backward."""
    cost = KernelCostModel(model=MIXTRAL, hardware=H100)
    local = simulate(_plan(ep=1, recompute=recompute), model=MIXTRAL, hardware=H100,
                     cost=cost).record
    spread = simulate(_plan(ep=4, recompute=recompute), model=MIXTRAL, hardware=H100,
                      cost=cost).record
    a2a = _a2a_by_hand(cost, SEQ, 4)
    layers = MIXTRAL.num_layers
    for u in range(len(local.unit_forward_s)):
        assert spread.unit_forward_s[u] - local.unit_forward_s[u] == pytest.approx(
            layers * 2 * a2a, rel=1e-9)
        assert spread.unit_backward_s[u] - local.unit_backward_s[u] == pytest.approx(
            layers * backward_a2a * a2a, rel=1e-9)
    # Compute ends later; the step need not (the experts' gradients no longer cross dp).
    assert spread.extra["compute_end_s"] > local.extra["compute_end_s"]


def test_expert_states_shard_over_the_expert_data_parallel_group():
    """ZeRO-1 at dp 4: with ep 1 every rank holds all 8 experts, optimizer states over 4
    ranks (2 + 4 + 12/4 B a parameter); with ep 4 it holds 2 experts whose optimizer states
    are not sharded (dp*cp/ep = 1: 2 + 4 + 12 B). The other parameters are the same."""
    experts = MIXTRAL.num_layers / 2 * 3 * MIXTRAL.hidden * MIXTRAL.ffn_hidden * 8  # pp 2
    one = model_state_bytes(MIXTRAL, pp=2, dp=4, ep=1)
    four = model_state_bytes(MIXTRAL, pp=2, dp=4, ep=4)
    by_hand = experts * (2 + 4 + ADAM_FP32_BYTES / 4) - experts / 4 * (2 + 4 + ADAM_FP32_BYTES)
    assert one - four == pytest.approx(by_hand, rel=1e-12)
    with pytest.raises(ValueError, match="ep"):
        model_state_bytes(MIXTRAL, pp=2, dp=4, ep=3)


def test_expert_gradients_reduce_over_dp_cp_over_ep_ranks():
    """At ep = dp the expert-data-parallel group is one rank: only the other parameters
    are reduce-scattered (fp32) and all-gathered (bf16) over the dp ranks."""
    training = TrainingSpec(dp_overlap=False)
    cost = KernelCostModel(model=MIXTRAL, hardware=H100, training=training)
    record = simulate(_plan(ep=4), model=MIXTRAL, hardware=H100, cost=cost).record
    layers = MIXTRAL.num_layers // 2
    experts = 3 * MIXTRAL.hidden * MIXTRAL.ffn_hidden * MIXTRAL.num_experts
    dense = layers * (MIXTRAL.params_per_layer - experts) + MIXTRAL.embedding_params
    comm = cost.comm
    by_hand = (comm.reduce_scatter(dense * 4, 4, intra_node=True)
               + comm.all_gather(dense * 2, 4, intra_node=True))
    assert record.extra["dp_sync_s"] == pytest.approx(by_hand, rel=1e-12)


def test_what_is_not_modelled_is_refused():
    dense = model_preset("llama-7b")
    with pytest.raises(PlanError, match=r"ep=2 needs an MoE model"):
        simulate(_plan(ep=2, model=dense), model=dense, hardware=H100)
    with pytest.raises(PlanError, match=r"ep=2 with tp=2"):
        simulate(_plan(ep=2, tp=2), model=MIXTRAL, hardware=H100)
    with pytest.raises(ValueError, match=r"ParallelSpec.ep=2 needs an MoE model"):
        dataclasses.replace(_plan(ep=1).parallel, ep=2).validate_for_model(dense)


def _record(name: str) -> dict:
    return next(r for r in load_hopper_records() if name in r["id"])


def test_the_moe_validation_records_state_their_published_shapes():
    """Qwen3-30B-A3B (30.5B parameters, Qwen/Qwen3-30B-A3B model card) is expressed with
    ep 8; gpt-oss-120b (116.8B, OpenAI's gpt-oss model card) is skipped for its
    sliding-window layers, its shape still stated. 1% covers the biases and norms not
    priced."""
    qwen = express_hopper(_record("qwen3-30b-a3b"))
    assert qwen.parallel.ep == 8 and qwen.model.num_experts == 128
    assert qwen.model.num_params == pytest.approx(30.5e9, rel=0.01)
    oss = _record("gpt-oss-120b")
    skipped = express_hopper(oss)
    assert isinstance(skipped, Skipped) and "sliding-window" in skipped.reason
    m = json.loads(json.dumps(oss["model"]))
    spec = dataclasses.replace(qwen.model, num_layers=m["layers"], hidden=m["hidden"],
                               ffn_hidden=m["ffn"], num_heads=m["heads"],
                               num_kv_heads=m["kv_heads"], head_dim=m["head_dim"],
                               vocab_size=m["vocab"], num_experts=m["experts"],
                               moe_top_k=m["top_k"])
    assert spec.num_params == pytest.approx(116.8e9, rel=0.01)


def test_plan_method_refuses_a_planner_that_drops_expert_parallelism():
    """Megatron's plan keeps the layout's ep (and the simulator prices it); a planner that
    answers with another ep would have its plan priced without the all-to-alls."""
    from baselines import naive
    from slimpack.batch import Batch
    from slimpack.compare import plan_method
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.methods import DEFAULT_METHODS
    from slimpack.planning.method import MethodSpec
    from slimpack.specs import ParallelSpec

    def dropping(batch, setup, options):
        packed = naive.plan(batch, setup, options)
        return dataclasses.replace(packed, parallel=dataclasses.replace(packed.parallel, ep=1))

    registry = DEFAULT_METHODS.with_methods(MethodSpec(
        name="drops-ep", planner=dropping, options=naive.NaiveOptions,
        summary="naive packing that forgets ep (a test's method)", source=__file__))
    batch = Batch.from_lengths([4096] * 8)
    parallel = ParallelSpec(pp=2, dp=4, ep=2)
    cost = default_cost_model(MIXTRAL, H100)
    kept = plan_method("megatron", batch, MIXTRAL, H100, parallel, cost, context=SEQ,
                       time_limit_s=None)
    assert kept.parallel.ep == 2
    with pytest.raises(ValueError, match=r"drops-ep: planned ep=1 for a layout with ep=2"):
        plan_method("drops-ep", batch, MIXTRAL, H100, parallel, cost, context=SEQ,
                    time_limit_s=None, registry=registry)


def test_an_expert_group_wider_than_a_node_dispatches_over_the_network():
    """At tp 1 an expert group is ep consecutive ranks of a stage: 8 of them share a DGX node,
    16 span two (the all-to-all then runs at the inter-node bandwidth)."""
    from slimpack.sim.expert_dispatch import expert_groups_intra_node
    from slimpack.specs import ParallelSpec

    assert expert_groups_intra_node(ParallelSpec(pp=2, dp=16, ep=8))
    assert not expert_groups_intra_node(ParallelSpec(pp=2, dp=16, ep=16))
    assert expert_groups_intra_node(ParallelSpec(pp=1, dp=12, ep=4))  # 0-3, 4-7, 8-11
    assert not expert_groups_intra_node(ParallelSpec(pp=1, dp=12, ep=6))  # 6-11 spans 2 nodes


def test_the_planners_memory_check_and_the_simulator_agree_under_ep():
    """``plan_peak_bytes`` (what ``memory_fits`` and ``--strict`` read) is the simulator's
    peak, expert states sharded by ep included."""
    from slimpack.sim.memory import plan_peak_bytes

    for ep in (1, 4):
        plan = _plan(ep=ep)
        record = simulate(plan, model=MIXTRAL, hardware=H100).record
        assert plan_peak_bytes(plan, MIXTRAL) == pytest.approx(max(record.peak_memory_bytes),
                                                               rel=1e-12)


def test_the_cli_plans_and_simulates_ep_and_refuses_it_on_a_dense_model(tmp_path, capsys):
    from slimpack.cli.main import main
    from slimpack.plan import Plan

    flags = ["--gpus", "16", "--pp", "2", "--ep", "4", "--dataset", "wikipedia",
             "--context", "8192", "--global-batch", "16"]
    out = tmp_path / "plan.json"
    assert main(["plan", "--method", "megatron", "--model", "mixtral-8x7b", *flags,
                 "-o", str(out)]) == 0
    assert Plan.load(out).parallel.ep == 4
    assert main(["simulate", str(out), "--model", "mixtral-8x7b", "--hardware", "h100"]) == 0
    capsys.readouterr()
    dense = tmp_path / "dense.json"
    assert main(["plan", "--method", "megatron", "--model", "llama-7b", *flags,
                 "-o", str(dense)]) == 2
    assert "ParallelSpec.ep=4 needs an MoE model" in capsys.readouterr().err
    assert not dense.exists()
    assert main(["plan", "--method", "megatron", "--model", "mixtral-8x7b", "--auto-parallel",
                 *flags[:2], *flags[4:]]) == 2  # --ep 4 with --auto-parallel
    assert "--auto-parallel" in capsys.readouterr().err


def test_router_and_permutation_are_priced_per_moe_layer():
    """Forward: the router GEMM (bf16) plus the fused permute and unpermute, 2 (1 + top_k)
    hidden bf16 values a token through HBM at the elementwise rate; backward the same bytes
    and the router's two gradient GEMMs. A dense model has none."""
    from slimpack.cost import kernels as K

    cost = KernelCostModel(model=MIXTRAL, hardware=H100, training=TrainingSpec(dtype="fp8"))
    tokens, h, e = 8192, MIXTRAL.hidden, MIXTRAL.num_experts
    permute = tokens * 2 * (1 + MIXTRAL.moe_top_k) * h * 2 / (H100.hbm_tbps * 1e12
                                                              * K.HBM_FRACTION)
    routing = cost.moe_routing_times(tokens)
    gemm = cost._gemm  # the one GEMM price every kernel of the model uses
    assert routing.forward_s == pytest.approx(gemm(tokens, e, h, dtype="bf16") + permute,
                                              rel=1e-12)
    assert routing.backward_s == pytest.approx(
        gemm(tokens, h, e, dtype="bf16") + gemm(h, e, tokens, dtype="bf16") + permute,
        rel=1e-12)
    layer = cost.layer_times([(tokens, 0)])
    dense = KernelCostModel(model=dataclasses.replace(MIXTRAL, num_experts=1, moe_top_k=1),
                            hardware=H100, training=TrainingSpec(dtype="fp8"))
    assert dense.moe_routing_times(tokens).forward_s == 0.0
    assert layer.forward_s > cost.linear_times(tokens).forward_s + routing.forward_s


def test_an_moe_layer_keeps_each_tokens_routed_copies():
    """No recompute, bf16: ``12h + 4 kv + 6 ffn top_k`` plus ``top_k - 1`` more hidden rows
    (the grouped GEMM's permuted input), 2 B each; in fp8 those rows are 1 B; full recompute
    keeps the layer input only."""
    from slimpack.cost.memory import activation_bytes_per_token_per_layer as saved

    h, kv, ffn, k = MIXTRAL.hidden, MIXTRAL.kv_dim, MIXTRAL.ffn_hidden, MIXTRAL.moe_top_k
    assert saved(MIXTRAL) == 12 * h + 4 * kv + 6 * ffn * k + (k - 1) * h * 2
    assert saved(MIXTRAL, fp8=True) == (12 * h + 4 * kv + 6 * ffn * k - (3 * h + ffn * k)
                                        + (k - 1) * h)
    assert saved(MIXTRAL, "full") == 2 * h


def test_the_layout_search_has_an_ep_axis_for_moe_models_only():
    """ep in {1, 2, 4, 8} for mixtral's 8 experts, a power of two dividing dp*cp, at tp 1
    only; a dense model keeps ep 1."""
    from slimpack.planning.auto_parallel import auto_parallel_candidates

    moe = auto_parallel_candidates(MIXTRAL, H100, 32, 8192)
    assert {c.parallel.ep for c in moe} == {1, 2, 4, 8}
    assert all(c.parallel.tp == 1 and (c.parallel.dp * c.parallel.cp) % c.parallel.ep == 0
               for c in moe if c.parallel.ep > 1)
    dense = auto_parallel_candidates(model_preset("llama-7b"), H100, 32, 8192)
    assert {c.parallel.ep for c in dense} == {1}


def test_megatrons_recompute_choice_prices_the_experts_it_holds():
    """mixtral on 16 H100 at pp 2 dp 8: every rank holding all 8 experts (ep 1) fits no
    recompute mode; with ep 8 each holds one and a cheaper mode fits."""
    from slimpack.planning.memory_fit import resolve_recompute
    from slimpack.specs import ParallelSpec

    one = resolve_recompute("auto", MIXTRAL, H100, ParallelSpec(pp=2, dp=8), 8192, "1f1b")
    eight = resolve_recompute("auto", MIXTRAL, H100, ParallelSpec(pp=2, dp=8, ep=8), 8192,
                              "1f1b")
    assert one == ("full", False)
    assert eight[1] is True


def test_compare_searches_expert_parallelism_for_an_moe_model():
    """16 H100, 16 samples of 4K: the search's candidates are the ep-extended layouts, and
    the fastest holds the experts spread (its states, its DP sync and its recompute shrink
    with ep; the all-to-alls of 4K-token units stay on NVLink)."""
    from slimpack.batch import Batch
    from slimpack.compare import compare, method_candidates

    batch = Batch.from_lengths([SEQ] * 16)
    (record,) = compare(["megatron"], batch, MIXTRAL, H100, 16, auto_parallel=True,
                        context=SEQ, time_limit_s=None)
    layouts = method_candidates("megatron", MIXTRAL, H100, 16, SEQ)
    assert record.layouts_candidates == len(layouts)
    assert {c.parallel.ep for c in layouts} == {1, 2, 4, 8}
    assert record.search_exhaustive and not record.error
    assert record.parallel["ep"] > 1


def test_slimpack_keeps_its_replicas_unmerged_under_ep():
    """A 256K outlier among 4K documents: at ep 1 SlimPack merges replicas for it (a group at
    cp 8 of a cp 2 layout); at ep 2 it plans without DP-Merge, whose merged groups would
    leave the plan's layout, and the simulator prices the plan."""
    from slimpack.batch import Batch
    from slimpack.compare import plan_method
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.specs import ParallelSpec

    model = dataclasses.replace(model_preset("llama-7b"), name="moe-7b", num_experts=8,
                                moe_top_k=2, ffn_hidden=2752)
    batch = Batch.from_lengths([262144] + [4096] * 120)
    cost = default_cost_model(model, H100)
    cps = {}
    for ep in (1, 2):
        plan = plan_method("slimpack", batch, model, H100, ParallelSpec(cp=2, pp=2, dp=4, ep=ep),
                           cost, context=262144, time_limit_s=None)
        cps[ep] = {g.cp for g in plan.groups()}
        simulate(plan, model=model, hardware=H100, cost=cost)
    assert max(cps[1]) > 2 and cps[2] == {2}
