"""Recompute (selective, full, full on a chunk's first layers only) and activation offload
are executed, keep gradients exact, and change what a slice's forward keeps (single process,
then pipeline x data parallel on gloo)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slimpack.plan import Phase, Plan
from slimpack.runtime.activations import ActivationPolicy
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.data import make_tokens, num_label_tokens
from slimpack.runtime.examples import slimpack_plan, slimpipe_plan
from slimpack.runtime.launch import run_plan
from slimpack.runtime.layout import GroupLayout, slice_inputs
from slimpack.runtime.parity import parity
from slimpack.runtime.reference import reference_step
from slimpack.runtime.slice_autograd import SliceRunner
from slimpack.runtime.stage import build_chunks
from slimpack.specs import model_preset

TINY = model_preset("tiny")
CPU = torch.device("cpu")


def _run_single_process(plan: Plan, policy: ActivationPolicy):
    group = next(plan.groups())
    (chunk,) = build_chunks(TINY, pp=1, vpp=1, stage=0, seed=0, device=CPU, dtype=torch.float32)
    runner = SliceRunner(chunk, GroupLayout(group), attention_backend="sdpa",
                         head_dim=TINY.head_dim,
                         loss_scale=1.0 / num_label_tokens(plan.sequence_lengths), policy=policy)
    tokens = make_tokens(plan.sequence_lengths, vocab_size=TINY.vocab_size, seed=0)
    loss, device_bytes, offloaded = 0.0, 0, 0
    for unit in group.forward_units:
        for sl in group.unit_slices(unit):
            ids, labels, positions = slice_inputs(sl, tokens, CPU)
            loss += float(runner.forward(sl, ids, positions=positions, labels=labels))
            device_bytes += runner.graphs[sl.slice_id].saved_bytes
            offloaded += runner.graphs[sl.slice_id].offloaded_bytes
    for unit in group.backward_units:
        for sl in group.unit_slices(unit):
            runner.backward(sl, None)
    assert runner.pending() == [] and runner.dkv == {}
    grads = {name: p.grad for name, p in chunk.global_named_parameters()}
    return loss, grads, device_bytes, offloaded


@pytest.mark.parametrize("make_plan", [slimpipe_plan, slimpack_plan])
def test_each_recompute_mode_and_offload_share_is_exact_and_keeps_less(make_plan):
    plan = make_plan(pp=1, dp=1)  # a long sequence in slices with a KV cache
    ref = reference_step(TINY, plan.sequence_lengths, seed=0)
    kept = {}
    for mode in ("none", "selective", "full"):
        for share in (0.0, 0.5):
            loss, grads, device_bytes, offloaded = _run_single_process(
                plan, ActivationPolicy(recompute=mode, offload=share))
            check = parity(loss, grads, ref.loss, ref.grads)
            assert check.ok, f"{mode} offload {share}: {check.describe()}"
            kept[mode, share] = (device_bytes, offloaded)
    # Full recompute keeps each layer's input only: several times less than keeping all
    # (measured here 7.5x on tiny); selective drops the attention's internals.
    assert kept["full", 0.0][0] * 4 < kept["none", 0.0][0]
    assert kept["selective", 0.0][0] < kept["none", 0.0][0]
    for mode in ("none", "selective", "full"):
        device_bytes, offloaded = kept[mode, 0.5]
        assert kept[mode, 0.0][1] == 0 and offloaded > 0
        # The greedy share moves at most half of what is saved off the device; the own K/V
        # stay, so somewhat less than half is moved.
        assert offloaded <= 0.5 * (device_bytes + offloaded)
        assert device_bytes < kept[mode, 0.0][0]


def _with_group_fields(plan: Plan, **fields) -> Plan:
    phases = tuple(Phase(groups=tuple(dataclasses.replace(g, **fields) for g in ph.groups))
                   for ph in plan.phases)
    return dataclasses.replace(plan, phases=phases)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_with_offload_on_four_processes_matches_unsliced_model(mode):
    # pp 2 x dp 2, a long sequence cut into 4 slices per replica (KV cache across slices).
    plan = _with_group_fields(slimpipe_plan(pp=2, dp=2), recompute=mode, offload=0.5)
    result = run_plan(plan, TINY, RuntimeConfig(seed=3), return_grads=True, timeout_s=120)
    ref = reference_step(TINY, plan.sequence_lengths, seed=3)
    check = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert check.ok, check.describe()


def test_the_runtime_recomputes_only_the_first_layers_exactly():
    """tiny: 4 layers; recomputing the first 1 or 2 keeps gradients exact and keeps less than
    no recompute, more than recomputing all four."""
    plan = slimpipe_plan(pp=1, dp=1)
    ref = reference_step(TINY, plan.sequence_lengths, seed=0)
    kept = {}
    for layers in (None, 2, 1):
        loss, grads, device_bytes, _ = _run_single_process(
            plan, ActivationPolicy(recompute="full", recompute_layers=layers))
        check = parity(loss, grads, ref.loss, ref.grads)
        assert check.ok, f"recompute_layers={layers}: {check.describe()}"
        kept[layers] = device_bytes
    _, _, kept_all, _ = _run_single_process(plan, ActivationPolicy())
    assert kept[None] < kept[2] < kept[1] < kept_all


def test_a_pipeline_with_recompute_of_one_layer_per_stage_matches_the_unsliced_model():
    plan = _with_group_fields(slimpipe_plan(pp=2, dp=2), recompute="full", recompute_layers=1)
    result = run_plan(plan, TINY, RuntimeConfig(seed=3), return_grads=True, timeout_s=120)
    ref = reference_step(TINY, plan.sequence_lengths, seed=3)
    check = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert check.ok, check.describe()
