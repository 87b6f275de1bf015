"""The simulator's runtime activation accounting (``ActivationAccounting(saved="runtime")``)
against the bytes the runtime's autograd really keeps, slice by slice, in one process: a
whole sequence, packed documents, a sequence cut into slices that read a KV prefix, and the
last block of an LM head spread over the pipeline ranks (``vocab_parallel_pp``)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist

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
    runtime_head_logits_bytes,
    runtime_slice_bytes_per_layer,
    runtime_spread_head_bytes,
)
from slimpack.plan import Phase
from slimpack.runtime.data import make_tokens
from slimpack.runtime.examples import packed_plan, slimpack_plan
from slimpack.runtime.launch import free_port
from slimpack.runtime.layout import GroupLayout, slice_inputs
from slimpack.runtime.slice_autograd import SliceRunner
from slimpack.runtime.stage import build_chunks
from slimpack.runtime.validate import check_runtime_plan, check_schedule
from slimpack.runtime.vocab_parallel import HeadComm, PipelineLMHead
from slimpack.schedules import Op, build_schedule
from slimpack.sim.costs import layers_per_virtual_stage
from slimpack.sim.memory import group_memory, peak_bytes_by_stage
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")
RUNTIME_FP32 = ActivationAccounting(saved="runtime", bytes_per_element=4)


def _group(method: str, lengths: list[int], **options):
    cost = default_cost_model(TINY, H100)
    plan = plan_method(method, Batch.from_lengths(lengths), TINY, H100, ParallelSpec(), cost,
                       context=max(lengths), **options)
    (group,) = plan.groups()
    return plan, group


def _formula_bytes(group, sl, *, layers: int = TINY.num_layers, e: int = 4,
                   first: bool = True, spread: bool = False) -> float:
    """Everything the runtime accounting charges one slice on a chunk of ``layers`` layers
    holding the model's last block (and its first, with ``first``); ``spread``: the LM head
    spread over the pipeline ranks."""
    last_start = {}
    for other in group.slices:
        for seg in other.segments:
            last_start[seg.seq_id] = max(last_start.get(seg.seq_id, 0), seg.start)
    segs = sl.segments
    shape = SliceShape(tokens=sl.num_tokens, key_tokens=sum(s.end for s in segs),
                       pieces=len(segs),
                       caches_kv=any(last_start[s.seq_id] > s.start for s in segs),
                       masked_scores=sum(s.num_tokens * s.end for s in segs if s.start > 0))
    head = runtime_spread_head_bytes if spread else runtime_head_bytes
    return (layers * runtime_slice_bytes_per_layer(TINY, shape, bytes_per_element=e)
            + runtime_chunk_bytes(TINY, sl.num_tokens, bytes_per_element=e)
            + head(TINY, sl.num_tokens, bytes_per_element=e)
            + (runtime_first_block_bytes(sl.num_tokens, bytes_per_element=e) if first else 0))


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


@pytest.mark.parametrize("spread", [False, True])
def test_the_count_walk_and_the_op_walk_agree_under_the_runtime_accounting(spread):
    """Without virtual stages the walk runs on forward counts (vectorised); the per-slice
    head, RoPE and token-id bytes (and a spread head's transient logits) must land on the
    same stages as in the op-list walk."""
    from slimpack.sim.memory import schedule_peak_bytes

    cost = default_cost_model(TINY, H100)
    plan = plan_method("slimpack", Batch.from_lengths([300, 40, 17, 90, 5, 120, 60, 8, 33, 150]),
                       TINY, H100, ParallelSpec(pp=2, dp=2), cost, context=320,
                       vocab_parallel_pp=spread, attention_redistribution=False,
                       slice_tokens=128)
    layers = layers_per_virtual_stage(TINY.num_layers, 2, 1)
    for group in plan.groups():
        assert group.vocab_parallel_pp == spread
        memory = group_memory(group, model=TINY, dp=2, accounting=RUNTIME_FP32)
        by_ops = peak_bytes_by_stage(build_schedule(group), memory, layers)
        by_counts = schedule_peak_bytes(group, TINY, 2, accounting=RUNTIME_FP32)
        assert by_counts == pytest.approx(by_ops, rel=1e-12)
        assert memory.block_extras.head_blocks == {1}  # the head's saved rows: last stage
        assert memory.block_extras.logits_blocks == ({0, 1} if spread else set())


def _vocab_over_pp(plan):
    return dataclasses.replace(plan, phases=tuple(Phase(groups=tuple(
        dataclasses.replace(g, vocab_parallel_pp=True) for g in ph.groups))
        for ph in plan.phases))


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_spread_head_accounting_equals_the_bytes_autograd_keeps(one_rank_group, dtype):
    """The model's last block at pp = 2 (stage 1), holding vocabulary block 1 of 2. In a
    one-rank group the head's broadcast, all-reduces and reduce return what they are given
    (the loss covers this block only), but every tensor the head step makes and the slice
    saves has the shape it has at pp = 2: the final norm's rows and the reduced d(hidden),
    no logits, softmax or labels."""
    plan, group = _group("slimpipe", [512], num_slices=4, min_slice_tokens=128)
    cpu, e = torch.device("cpu"), torch.empty((), dtype=dtype).element_size()
    comm = HeadComm(lane=one_rank_group, last=0, shards=one_rank_group, loss_scale=1.0)
    (chunk,) = build_chunks(
        TINY, pp=2, vpp=1, stage=1, seed=0, device=cpu, dtype=dtype,
        make_head=lambda last: PipelineLMHead(TINY, shard=1, num_shards=2, last=last, tp=None,
                                              device=cpu, dtype=dtype))
    assert chunk.is_last and chunk.head.final_norm is not None
    runner = SliceRunner(chunk, GroupLayout(group), attention_backend="sdpa",
                         head_dim=TINY.head_dim, loss_scale=1.0, head_comm=comm)
    tokens = make_tokens(plan.sequence_lengths, vocab_size=TINY.vocab_size, seed=0)
    gen = torch.Generator().manual_seed(0)
    expected = 0.0
    for unit in group.forward_units:
        for sl in group.unit_slices(unit):
            _, labels, positions = slice_inputs(sl, tokens, cpu)
            hidden = torch.randn(sl.num_tokens, TINY.hidden, generator=gen).to(dtype)
            runner.forward(sl, hidden, positions=positions, labels=labels)
            expected += _formula_bytes(group, sl, layers=TINY.num_layers // 2, e=e,
                                       first=False, spread=True)
            assert runner.live_bytes() == expected
            # What the runtime charges while the head step runs, the walk's transient.
            assert chunk.head.logits_bytes(sl.num_tokens) == runtime_head_logits_bytes(
                TINY, sl.num_tokens, pp=2)
    # 128-token slices: per slice 128 * (4h + 4 + 2eh) bytes instead of the last-stage
    # head's 128 * (4h + 4 + 2eh + 4*vocab + 8) + 4.
    assert runtime_spread_head_bytes(TINY, 128, bytes_per_element=e) == 128 * (
        4 * TINY.hidden + 4 + 2 * e * TINY.hidden)


def test_a_spread_head_keeps_its_rows_on_the_last_block_and_its_logits_pass_every_stage():
    plan = _vocab_over_pp(slimpack_plan(pp=2, dp=1, vpp=2, tp=2, scale=5))
    (group,) = plan.groups()
    extras = group_memory(group, model=TINY, dp=1, accounting=RUNTIME_FP32).block_extras
    assert extras.head_blocks == {3} and extras.logits_blocks == {2, 3}  # chunk 1 of each
    for u, unit in enumerate(group.forward_units):
        slices = group.unit_slices(unit)
        assert extras.fwd_head[u] == sum(runtime_spread_head_bytes(
            TINY, sl.num_tokens, bytes_per_element=4, tp=2) for sl in slices)
        # tp2: every padded row of the slice, times the rank's vocab/(pp*tp) block, fp32.
        padded = max(-(-sl.num_tokens // 2) * 2 for sl in slices)
        assert extras.head_logits[u] == padded * (TINY.vocab_size // 4) * 4
        assert extras.fwd(u, 2) == extras.fwd_every[u]  # stage 0 keeps no head rows
        assert extras.logits(u, 1) == 0.0  # nor any logits on its first chunk


def _ops(*spec: str) -> list[Op]:
    return [Op(kind=k, unit=int(u), chunk=int(c)) for k, u, c in spec]


def test_the_walk_holds_a_spread_heads_logits_where_each_stage_joins_it():
    plan = _vocab_over_pp(slimpack_plan(pp=2, dp=1, scale=8))
    rplan = check_runtime_plan(plan, TINY)
    (group,) = plan.groups()
    memory = group_memory(group, model=TINY, dp=1, accounting=RUNTIME_FP32)
    layers = layers_per_virtual_stage(TINY.num_layers, 2, 1)
    ops = rplan.schedules[group.group_id]
    # The runtime's joins here are the walk's default placement: the same peaks.
    assert (peak_bytes_by_stage(ops, memory, layers, head_joins=rplan.head_joins[group.group_id])
            == peak_bytes_by_stage(ops, memory, layers))

    # tests/test_runtime_vocab_parallel.py's schedule whose default placement deadlocks: stage 0
    # joins head 0 before op 3 instead of op 2, so with its F(1) on chunk 0 held as well.
    group = dataclasses.replace(list(packed_plan(pp=2, dp=2, vpp=2, scale=8).groups())[1],
                                vocab_parallel_pp=True)
    lists = [_ops("F00", "F01", "F10", "F11", "B01", "B00", "B11", "B10"),
             _ops("F00", "F01", "B01", "F10", "B00", "F11", "B11", "B10")]
    joins = check_schedule(group, lists)
    assert joins == [[(3, 0), (6, 1)], []]
    memory = group_memory(group, model=TINY, dp=1, accounting=RUNTIME_FP32)
    big = 1e12  # head 0's logits dominate stage 0's peak wherever it joins
    marked = dataclasses.replace(memory, block_extras=dataclasses.replace(
        memory.block_extras, head_logits=[big, 0.0]))
    layers = layers_per_virtual_stage(TINY.num_layers, 2, 2)
    at_join = peak_bytes_by_stage(lists, marked, layers, head_joins=joins)[0] - big
    after_forward = peak_bytes_by_stage(lists, marked, layers)[0] - big
    assert at_join - after_forward == pytest.approx(
        memory.fwd_alloc[1] * layers[0] + memory.block_extras.fwd(1, 0), rel=1e-9)
    assert at_join > after_forward


@pytest.mark.parametrize(("fields", "named"), [
    ({"recompute": "full"}, "recompute"), ({"offload": 0.5}, "offload"),
    ({"cp": 2, "ranks": (0, 1)}, "cp_index"),
    ({"cp": 2, "ranks": (0, 1), "cp_kind": "ulysses"}, "cp_kind"),
])
def test_the_walk_refuses_what_the_runtime_accounting_does_not_model(fields, named):
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
