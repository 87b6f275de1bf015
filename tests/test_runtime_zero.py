"""ZeRO-3 in the runtime (slimpack/runtime/zero.py): parameters sharded over the ranks holding
a stage, all-gathered per plan phase, gradients reduce-scattered; the step trains exactly like
the unsliced single-process model (loss 1e-6 relative, every gradient, gathered from the
shards, 1e-5 norm-relative: slimpack/runtime/parity.py).

Cases: the parity matrix's ZeRO-3 rows (a FlexSP-shaped plan with mixed Ulysses degrees and an
idle rank, pp2 dp2, tp2 dp2, cp2 dp2) and FlexSP's own plan under its paper's ZeRO-3 recipe,
each job of 4 gloo processes started once per model.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.launch import free_port
from slimpack.runtime.many import run_plans
from slimpack.runtime.parity import parity
from slimpack.runtime.parity_matrix import CASES
from slimpack.runtime.reference import reference_step
from slimpack.runtime.zero import ZeroShards
from slimpack.specs import ParallelSpec, hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

pytestmark = pytest.mark.slow
H100 = hardware_preset("h100-80g")
ZERO3_CASES = [c for c in CASES if c.zero_stage == 3]


def _flexsp_zero3_plan():
    tiny = model_preset("tiny")
    cost = default_cost_model(tiny, H100, TrainingSpec(zero_stage=3))
    plan = plan_method("flexsp", Batch.from_lengths((900, 40, 17, 90, 5, 60, 8, 33)), tiny,
                       H100, ParallelSpec(dp=4), cost, context=1024)
    assert plan.zero_stage == 3
    assert any(g.cp > 1 and g.cp_kind == "ulysses" for g in plan.groups())  # Ulysses groups
    return plan


@pytest.mark.parametrize("model", sorted({c.model for c in ZERO3_CASES}))
def test_zero3_plans_match_the_unsliced_model(model):
    cases = [c for c in ZERO3_CASES if c.model == model]
    assert len(ZERO3_CASES) >= 4 and all(c.plan().world_size == 4 for c in cases)
    named = [(c.name, c.plan()) for c in cases]
    if model == "tiny":
        named.append(("flexsp planner, zero3", _flexsp_zero3_plan()))
    spec = model_preset(model)
    results = run_plans([p for _, p in named], spec, RuntimeConfig(seed=3), return_grads=True,
                        timeout_s=120)
    for (name, plan), result in zip(named, results, strict=True):
        ref = reference_step(spec, plan.sequence_lengths, seed=3)
        check = parity(result.loss, result.grads(), ref.loss, ref.grads)
        assert check.ok, f"{name}: {check.describe()}"


def _shards_rank(rank: int, world: int, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)  # the same whole weights on every rank, as the seeded init
        a, b = nn.Parameter(torch.randn(3, 5)), nn.Parameter(torch.randn(4))
        whole = [a.detach().clone(), b.detach().clone()]
        shards = ZeroShards([a, b], dist.new_group([0, 1]))
        # 19 values over 2 ranks: shards of 10, the last padded with one zero.
        assert shards.shard.numel() == 10 and shards.padded_numel == 20
        assert torch.equal(shards.shard, torch.cat([w.reshape(-1) for w in whole]
                                                   + [torch.zeros(1)])[rank * 10:rank * 10 + 10])
        assert a.numel() == 0 and b.numel() == 0 and shards.gathered_bytes == 0
        for phase in range(2):
            shards.unshard()
            assert torch.equal(a, whole[0]) and torch.equal(b, whole[1])
            assert shards.gathered_bytes == 2 * 20 * 4
            # Each rank's gradient of this phase: (rank + 1) * (phase + 1) * x.
            ((a * (rank + 1) * (phase + 1)).sum() + (b * (rank + 1) * (phase + 1)).sum()
             ).backward()
            shards.reshard()
            assert a.numel() == 0 and a.grad is None
        # Summed over both ranks (1 + 2) and both phases (1 + 2): 9 per element.
        want = torch.cat([torch.full((19,), 9.0), torch.zeros(1)])[rank * 10:rank * 10 + 10]
        assert torch.equal(shards.shard_grad, want)
        shards.gather_gradients()
        assert torch.equal(a.grad, torch.full((3, 5), 9.0)) and torch.equal(a, whole[0])
        assert torch.equal(b.grad, torch.full((4,), 9.0))
    finally:
        dist.destroy_process_group()


def test_shards_hold_a_slice_between_phases_and_sum_each_phase_into_it():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_shards_rank, nprocs=2, join=True, args=(2, f"tcp://127.0.0.1:{free_port()}"))
