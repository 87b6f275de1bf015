"""Blocking pipeline p2p (``TrainingSpec.p2p_blocking``, docs/cost-model.md "Scale terms"):
the engine on a hand-timed 1F1B case, and the scatter/gather all-gather on its formula."""

from __future__ import annotations

import pytest

from slimpack.cost.kernel_model import KernelCostModel
from slimpack.schedules import Op
from slimpack.sim.costs import GroupCosts, group_costs
from slimpack.sim.engine import run_group
from slimpack.sim.memory import GroupMemory
from slimpack.sim.synthetic import uniform_plan
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

# pp 2, two micro-batches, 1F1B: F 1 s, B 2 s per stage, every send 0.5 s.
OPS = [[Op("F", 0, 0), Op("F", 1, 0), Op("B", 0, 0), Op("B", 1, 0)],
       [Op("F", 0, 0), Op("B", 0, 0), Op("F", 1, 0), Op("B", 1, 0)]]
ZEROS = [0.0, 0.0]
MEMORY = GroupMemory(fwd_alloc=ZEROS, bwd_free=ZEROS, kvgrad_alloc=ZEROS, kvgrad_free=ZEROS,
                     static_bytes=ZEROS, model_state_bytes=ZEROS, logits_bytes=ZEROS,
                     kv_share=0.0, fwd_offload=ZEROS, bwd_fetch=ZEROS)


def _costs(blocking: bool) -> GroupCosts:
    return GroupCosts(layers=[1, 1], fwd_s=[[1.0, 1.0]] * 2, bwd_s=[[2.0, 2.0]] * 2,
                      fwd_ideal_s=[[1.0, 1.0]] * 2, bwd_ideal_s=[[2.0, 2.0]] * 2,
                      fwd_send_s=[[0.5, 0.5]] * 2, bwd_send_s=[[0.5, 0.5]] * 2,
                      fwd_unit_tokens=[1, 1], bwd_unit_tokens=[1, 1], blocking_sends=blocking)


def test_blocking_sends_hold_the_compute_lane_until_they_arrive():
    """Sends beside compute: stage 0 F0 0-1, F1 1-2 (its send waits for the lane: arrives
    2.5); stage 1 F0 1.5-2.5, B0 2.5-4.5 (arrives 5.0), F1 4.5-5.5, B1 5.5-7.5 (arrives 8.0);
    stage 0 B0 5-7, B1 8-10. Blocking: stage 0 is held to 1.5 after F0, F1 runs 1.5-2.5 and is
    held to 3.0; stage 1 is held to 5.0 after B0, F1 5-6, B1 6-8 held to 8.5; stage 0 B0 5-7,
    B1 8.5-10.5. Busy time (compute only) is 6 s per stage either way."""
    free = run_group(group_id=0, ops=OPS, costs=_costs(False), memory=MEMORY,
                     start_s=[0.0, 0.0], record=False)
    held = run_group(group_id=0, ops=OPS, costs=_costs(True), memory=MEMORY,
                     start_s=[0.0, 0.0], record=False)
    assert free.compute_end == [10.0, 7.5]
    assert held.compute_end == [10.5, 8.5]
    assert free.busy_s == held.busy_s == [6.0, 6.0]


def test_scatter_gather_all_gather_is_added_without_sequence_parallelism():
    """Blocking p2p at tp 8 without sequence parallelism: a send is the 1/tp share over one
    link plus the receiver's all-gather of the whole activation over NVLink, which is the
    same-node all-gather of ``t * h * 2`` bytes on 8 ranks."""
    model = model_preset("llama-7b")
    hw = hardware_preset("a100-80g")
    plan = uniform_plan(schedule="1f1b", pp=2, microbatches=2, tp=8, seq_len=2048)
    group = next(plan.groups())
    tokens = 2048  # one sequence per unit
    base = TrainingSpec(sequence_parallel=False)
    off = group_costs(group, model=model, gpus_per_node=8,
                      cost=KernelCostModel(model=model, hardware=hw, training=base))
    cost = KernelCostModel(model=model, hardware=hw,
                           training=TrainingSpec(sequence_parallel=False, p2p_blocking=True))
    on = group_costs(group, model=model, cost=cost, gpus_per_node=8)
    gather = cost.comm.all_gather(tokens * model.hidden * 2, 8, intra_node=True)
    assert on.fwd_unit_tokens[0] == tokens
    assert on.blocking_sends and not off.blocking_sends
    assert on.fwd_send_s[0][0] == pytest.approx(off.fwd_send_s[0][0] + gather, rel=1e-12)
    sp = KernelCostModel(model=model, hardware=hw, training=TrainingSpec(p2p_blocking=True))
    assert group_costs(group, model=model, cost=sp, gpus_per_node=8).fwd_send_s == \
        group_costs(group, model=model, gpus_per_node=8,
                    cost=KernelCostModel(model=model, hardware=hw)).fwd_send_s


def test_the_megatron_a100_runs_are_priced_with_blocking_p2p():
    """Megatron-LM 2021-22 and DeepSpeed's pipeline engine block on p2p; the Hopper recipes
    (Megatron-core) keep the default."""
    from slimpack.validation.hopper import express_hopper, load_hopper_records
    from slimpack.validation.megatron import express, load_records

    cases = [express(r) for r in load_records()]
    assert all(c.training.p2p_blocking for c in cases if hasattr(c, "training"))
    hopper = [express_hopper(r) for r in load_hopper_records()]
    assert not any(c.training.p2p_blocking for c in hopper if hasattr(c, "training"))
