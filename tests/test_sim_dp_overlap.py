"""``TrainingSpec.dp_overlap`` (docs/cost-model.md, "Scale terms"): Megatron-LM 2021-22's
``local`` DDP all-reduces gradients after the pipeline flush."""

from __future__ import annotations

import pytest

from slimpack.cost.kernel_model import KernelCostModel
from slimpack.sim import simulate
from slimpack.sim.synthetic import uniform_plan
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec
from slimpack.validation.megatron import express, load_records

H100 = hardware_preset("h100-80g")


def test_no_dp_overlap_puts_the_whole_sync_after_compute():
    """Without overlap the step is compute end + the sync + the Adam step."""
    model = model_preset("llama-7b")
    plan = uniform_plan(schedule="1f1b", pp=4, microbatches=4, seq_len=4096, tp=8, dp=4,
                        model=model.name)
    serial_cost = KernelCostModel(model=model, hardware=H100,
                                  training=TrainingSpec(dp_overlap=False))
    serial = simulate(plan, model=model, hardware=H100, cost=serial_cost).record
    overlapped = simulate(plan, model=model, hardware=H100,
                          cost=KernelCostModel(model=model, hardware=H100)).record
    e = serial.extra
    assert e["dp_sync_s"] > 0
    assert serial.step_time_s == pytest.approx(
        e["compute_end_s"] + e["dp_sync_s"] + e["optimizer_step_s"], rel=1e-9)
    assert overlapped.step_time_s < serial.step_time_s


def test_validation_runs_overlap_only_where_the_source_ran_torch_ddp():
    """Narayanan et al.'s Table 1 script: PyTorch DDP up to 18.4B, Megatron's local DDP
    above; Korthikanti et al. 6.3 state no overlap; DeepSpeed (MT-NLG, ZeRO-3) keeps the
    default."""
    cases = {c.record_id: c for c in map(express, load_records()) if hasattr(c, "training")}
    assert cases["narayanan21-t1-18.4B"].training.dp_overlap
    assert not cases["narayanan21-t1-39.1B"].training.dp_overlap
    assert not cases["korthikanti22-s63-530B-dp8-sp-selective"].training.dp_overlap
    assert cases["mtnlg22-530B-2240gpu"].training.dp_overlap
    assert cases["narayanan21-t2-zero3-174.6B-384gpu"].training.dp_overlap
