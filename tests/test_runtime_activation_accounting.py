"""The simulator's runtime activation accounting (``ActivationAccounting(saved="runtime")``)
against the bytes the runtime's autograd really keeps, slice by slice, in one process: a
whole sequence, packed documents, and a sequence cut into slices that read a KV prefix."""

from __future__ import annotations

import json

import pytest
import torch

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.cost.memory import (
    GPU_BF16,
    ActivationAccounting,
    SliceShape,
    runtime_chunk_bytes,
    runtime_first_block_bytes,
    runtime_head_bytes,
    runtime_slice_bytes_per_layer,
)
from slimpack.runtime.data import make_tokens
from slimpack.runtime.layout import GroupLayout, slice_inputs
from slimpack.runtime.slice_autograd import SliceRunner
from slimpack.runtime.stage import build_chunks
from slimpack.sim.memory import group_memory
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")


def _group(method: str, lengths: list[int], **options):
    cost = default_cost_model(TINY, H100)
    plan = plan_method(method, Batch.from_lengths(lengths), TINY, H100, ParallelSpec(), cost,
                       context=max(lengths), **options)
    (group,) = plan.groups()
    return plan, group


def _formula_bytes(group, sl) -> float:
    """Everything the runtime accounting charges one slice on a one-chunk model."""
    last_start = {}
    for other in group.slices:
        for seg in other.segments:
            last_start[seg.seq_id] = max(last_start.get(seg.seq_id, 0), seg.start)
    segs = sl.segments
    shape = SliceShape(tokens=sl.num_tokens, key_tokens=sum(s.end for s in segs),
                       pieces=len(segs),
                       caches_kv=any(last_start[s.seq_id] > s.start for s in segs),
                       masked_scores=sum(s.num_tokens * s.end for s in segs if s.start > 0))
    return (TINY.num_layers * runtime_slice_bytes_per_layer(TINY, shape, bytes_per_element=4)
            + runtime_chunk_bytes(TINY, sl.num_tokens, bytes_per_element=4)
            + runtime_head_bytes(TINY, sl.num_tokens, bytes_per_element=4)
            + runtime_first_block_bytes(sl.num_tokens, bytes_per_element=4))


@pytest.mark.parametrize(("method", "lengths", "options"), [
    ("reference", [200], {}),
    ("naive", [64, 32, 100, 20], {}),
    ("slimpipe", [512], {"num_slices": 4, "min_slice_tokens": 128}),
])
def test_accounting_equals_the_bytes_autograd_keeps(method, lengths, options):
    plan, group = _group(method, lengths, **options)
    (chunk,) = build_chunks(TINY, pp=1, vpp=1, stage=0, seed=0, device=torch.device("cpu"),
                            dtype=torch.float32)
    runner = SliceRunner(chunk, GroupLayout(group), attention_backend="sdpa",
                         head_dim=TINY.head_dim, loss_scale=1.0)
    tokens = make_tokens(plan.sequence_lengths, vocab_size=TINY.vocab_size, seed=0)
    expected = 0.0
    for unit in group.forward_units:
        for sl in group.unit_slices(unit):
            ids, labels, positions = slice_inputs(sl, tokens, torch.device("cpu"))
            runner.forward(sl, ids, positions=positions, labels=labels)
            expected += _formula_bytes(group, sl)
            assert runner.live_bytes() == expected
    if method == "slimpipe":  # the later slices read a prefix and feed the next ones
        assert len(group.slices) == 4 and any(runner.kv_cache.values())


def test_runtime_accounting_charges_the_walk_what_the_formula_says():
    _, group = _group("slimpipe", [512], num_slices=4, min_slice_tokens=128)
    accounting = ActivationAccounting(saved="runtime", bytes_per_element=4)
    memory = group_memory(group, model=TINY, dp=1, accounting=accounting)
    assert memory.logits_bytes == [0.0]  # the runtime frees a slice's logits with its graph
    per_slice = [_formula_bytes(group, sl) for sl in group.slices]
    extras = memory.block_extras
    walked = [memory.fwd_alloc[u] * TINY.num_layers + extras.fwd(u, 0)
              for u in range(len(group.forward_units))]
    by_unit = [sum(per_slice[group.slices.index(sl)] for sl in group.unit_slices(u))
               for u in group.forward_units]
    assert walked == pytest.approx(by_unit, rel=1e-12)


def test_default_accounting_is_the_bf16_gpu_one():
    _, group = _group("slimpipe", [512], num_slices=4, min_slice_tokens=128)
    default = group_memory(group, model=TINY, dp=1)
    assert default == group_memory(group, model=TINY, dp=1, accounting=GPU_BF16)
    assert default.block_extras is None and default.logits_bytes[0] > 0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"saved": "flash"}, "saved"), ({"bytes_per_element": 8}, "bytes_per_element"),
    ({"bytes_per_element": 4}, "megatron"),
])
def test_accounting_refuses_what_it_does_not_model(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ActivationAccounting(**kwargs)


@pytest.mark.parametrize(("kwargs", "field"), [({"recompute": "full"}, "recompute"),
                                               ({"offload": 0.5}, "offload")])
def test_runtime_formula_refuses_recompute_and_offload(kwargs, field):
    shape = SliceShape(tokens=8, key_tokens=8, pieces=1, caches_kv=False)
    with pytest.raises(ValueError, match=field):
        runtime_slice_bytes_per_layer(TINY, shape, bytes_per_element=4, **kwargs)


def test_the_count_walk_and_the_op_walk_agree_under_the_runtime_accounting():
    """Without virtual stages the walk runs on forward counts (vectorised); the per-slice
    head, RoPE and token-id bytes must land on the same stages as in the op-list walk."""
    from slimpack.schedules import build_schedule
    from slimpack.sim.costs import layers_per_virtual_stage
    from slimpack.sim.memory import peak_bytes_by_stage, schedule_peak_bytes

    cost = default_cost_model(TINY, H100)
    plan = plan_method("slimpack", Batch.from_lengths([300, 40, 17, 90, 5, 120, 60, 8, 33, 150]),
                       TINY, H100, ParallelSpec(pp=2, dp=2), cost, context=320,
                       vocab_parallel_pp=False, attention_redistribution=False, slice_tokens=128)
    accounting = ActivationAccounting(saved="runtime", bytes_per_element=4)
    layers = layers_per_virtual_stage(TINY.num_layers, 2, 1)
    for group in plan.groups():
        memory = group_memory(group, model=TINY, dp=2, accounting=accounting)
        by_ops = peak_bytes_by_stage(build_schedule(group), memory, layers)
        by_counts = schedule_peak_bytes(group, TINY, 2, accounting=accounting)
        assert by_counts == pytest.approx(by_ops, rel=1e-12)
        assert memory.block_extras.head_blocks == {1}  # the head on the last stage only


@pytest.mark.parametrize(("fields", "named"), [
    ({"recompute": "full"}, "recompute"), ({"offload": 0.5}, "offload"),
    ({"cp": 2, "ranks": (0, 1)}, "cp_index"),
    ({"cp": 2, "ranks": (0, 1), "cp_kind": "ulysses"}, "cp_kind"),
])
def test_the_walk_refuses_what_the_runtime_accounting_does_not_model(fields, named):
    import dataclasses

    _, group = _group("naive", [64, 32, 100, 20])
    accounting = ActivationAccounting(saved="runtime", bytes_per_element=4)
    with pytest.raises(ValueError, match=named):
        group_memory(dataclasses.replace(group, **fields), model=TINY, dp=1,
                     accounting=accounting)


@pytest.mark.parametrize("method", ["megatron-dcp", "slimpack"])
def test_the_table_plans_what_slimpack_plan_writes(tmp_path, method):
    from slimpack.cli.main import main as cli
    from slimpack.plan import Plan
    from slimpack.validation.activation_memory import SETTING

    path = tmp_path / "plan.json"
    assert cli(SETTING.plan_args(method, str(path))) == 0
    written, planned = (json.loads(plan.to_json()) for plan in (Plan.load(path),
                                                                SETTING.plan(method)))
    written.pop("metadata"), planned.pop("metadata")  # planner timings
    assert written == planned
