"""The LM head spread over the pipeline ranks (``Group.vocab_parallel_pp`` at pp > 1,
:mod:`slimpack.runtime.vocab_parallel`): where each stage joins a unit's head for every schedule
kind, and gloo runs that train exactly like the unsliced single-process model (fp32: loss within
1e-6 relative, every gradient within 1e-5 norm-relative) with each rank holding its block, and
whose tracked activation peak per rank the simulator's runtime accounting predicts.
"""

from __future__ import annotations

import dataclasses

import pytest

from slimpack.plan import Phase, Plan, PlanError
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.examples import packed_plan, slimpack_plan, slimpipe_plan
from slimpack.runtime.many import run_plans
from slimpack.runtime.parity import parity
from slimpack.runtime.reference import reference_step
from slimpack.runtime.validate import _dry_run, _eager_joins, check_runtime_plan, check_schedule
from slimpack.schedules import Op
from slimpack.specs import model_preset
from slimpack.validation.activation_memory import compare_ranks

TINY = model_preset("tiny")


def _vocab_over_pp(plan: Plan, flag: bool = True) -> Plan:
    phases = tuple(Phase(groups=tuple(dataclasses.replace(g, vocab_parallel_pp=flag)
                                      for g in ph.groups)) for ph in plan.phases)
    return dataclasses.replace(plan, phases=phases)


# -- where the stages join the head (dry run, no processes) ------------------------------------
SHAPES = {
    "1f1b": lambda pp, vpp: packed_plan(pp=pp, dp=1),
    "interleaved": lambda pp, vpp: packed_plan(pp=pp, dp=1, vpp=vpp),
    "slimpipe": lambda pp, vpp: slimpipe_plan(pp=pp, dp=1, vpp=vpp, num_slices=6),
    "asymmetric": lambda pp, vpp: slimpack_plan(pp=pp, dp=1, vpp=vpp),
}


SHAPE_CASES = [(kind, pp, vpp) for kind in [*SHAPES, "gpipe"]
               for pp, vpp in [(2, 1), (2, 2), (3, 2), (4, 1), (4, 3)]
               if not (kind == "1f1b" and vpp > 1 or kind == "interleaved" and vpp == 1)]


@pytest.mark.parametrize(("kind", "pp", "vpp"), SHAPE_CASES)
def test_every_stage_joins_each_head_once_in_the_last_stages_order(kind, pp, vpp):
    plan = SHAPES.get(kind, SHAPES["asymmetric"])(pp, vpp)
    if kind == "gpipe":
        plan = dataclasses.replace(plan, phases=tuple(Phase(groups=tuple(
            dataclasses.replace(g, schedule="gpipe") for g in ph.groups)) for ph in plan.phases))
    # Every pp*vpp here divides the layers and every pp the vocabulary.
    deep = dataclasses.replace(TINY, num_layers=24, vocab_size=768)
    rplan = check_runtime_plan(_vocab_over_pp(plan), deep)
    group = next(plan.groups())
    ops = rplan.schedules[group.group_id]
    joins = rplan.head_joins[group.group_id]
    heads = [op.unit for op in ops[pp - 1] if op.kind == "F" and op.chunk == vpp - 1]
    assert joins[pp - 1] == []  # the last stage runs the head inside its last-block forward
    for s in range(pp - 1):
        assert [u for _, u in joins[s]] == heads
        positions = [i for i, _ in joins[s]]
        assert positions == sorted(positions)
        for index, unit in joins[s]:
            # After this stage's own forward of the unit on its last chunk (the hidden states
            # come from the last stage, but only once this stage has passed them on) ...
            f_at = next(i for i, op in enumerate(ops[s])
                        if op.kind == "F" and op.unit == unit and op.chunk == vpp - 1)
            assert f_at < index
            # Every schedule here takes the simulator's placement: right after that forward.
            assert index == f_at + 1
            # ... and before any backward that needs the head's gradient.
            slices = set(group.forward_units[unit].slice_ids)
            needs = [i for i, op in enumerate(ops[s]) if op.kind == "B"
                     and slices & set(group.backward_units[op.unit].slice_ids)]
            assert index <= min(needs)


def test_joins_move_to_where_stages_block_when_joining_right_after_the_forward_deadlocks():
    # pp2 vpp2, two units. Stage 1 runs B(0) on chunk 0 before F(1) on chunk 1 (its head of
    # unit 1); that backward needs stage 0's B(0) on chunk 1, which stage 0 runs right after
    # its F(1) on chunk 1: joining head 1 there waits for stage 1, which waits for stage 0.
    group = dataclasses.replace(list(packed_plan(pp=2, dp=2, vpp=2).groups())[1],
                                vocab_parallel_pp=True)
    assert len(group.forward_units) == 2

    def ops(*spec: str) -> list[Op]:
        return [Op(kind=k, unit=int(u), chunk=int(c)) for k, u, c in spec]

    lists = [ops("F00", "F01", "F10", "F11", "B01", "B00", "B11", "B10"),
             ops("F00", "F01", "B01", "F10", "B00", "F11", "B11", "B10")]
    _dry_run(group, lists, vocab_over_pp=False)  # a valid schedule without the head
    eager = _eager_joins(group, lists)
    assert eager == [[(2, 0), (4, 1)], []]
    with pytest.raises(PlanError, match="deadlocks"):
        _dry_run(group, lists, vocab_over_pp=True, fixed=eager)
    # So stage 0 joins each head where it is blocked while the last stage waits for it:
    # head 0 before its F(1) on chunk 1, head 1 before its B(1) on chunk 1.
    assert check_schedule(group, lists) == [[(3, 0), (6, 1)], []]


# -- gloo runs: gradient parity and memory ----------------------------------------------------
CASES: dict[str, Plan] = {
    "1f1b pp2 dp2, packed documents": packed_plan(pp=2, dp=2),
    "slimpipe pp2 dp2, 4 slices/seq": slimpipe_plan(pp=2, dp=2),
    "asymmetric pp2 dp2, continuation slices": slimpack_plan(pp=2, dp=2),
    "asymmetric pp2 vpp2 dp2": slimpack_plan(pp=2, dp=2, vpp=2),
    "interleaved pp2 vpp2 dp2, packed documents": packed_plan(pp=2, dp=2, vpp=2),
    "slimpipe tp2 pp2": slimpipe_plan(pp=2, dp=1, tp=2),
    "slimpipe cp2 pp2 ring": slimpipe_plan(pp=2, dp=1, cp=2),
    "pp4, packed documents": packed_plan(pp=4, dp=1),
}


@pytest.fixture(scope="module")
def executed():
    """Every case with the head spread over pp, and the SlimPipe shape with it on the last
    stage (for memory), in one job of 4 processes."""
    plans = [_vocab_over_pp(p) for p in CASES.values()]
    plans.append(_vocab_over_pp(CASES["slimpipe pp2 dp2, 4 slices/seq"], False))
    results = run_plans(plans, TINY, RuntimeConfig(seed=3), return_grads=True, timeout_s=180)
    return dict(zip([*CASES, "last-stage head"], zip(plans, results, strict=True), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_head_over_pipeline_ranks_matches_unsliced_model(executed, name):
    plan, result = executed[name]
    assert all(g.vocab_parallel_pp and g.pp > 1 for g in plan.groups())
    ref = reference_step(TINY, plan.sequence_lengths, seed=3)
    check = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert check.ok, check.describe()


@pytest.mark.slow
def test_every_rank_tracks_its_block_of_the_head(executed):
    _, spread = executed["slimpipe pp2 dp2, 4 slices/seq"]
    _, last = executed["last-stage head"]
    head = TINY.vocab_size * TINY.hidden * 4  # fp32 matrix
    block_state = 2 * head // 2  # half the rows, parameters and gradients
    for a, b in zip(spread.ranks, last.ranks, strict=True):
        assert a.rank == b.rank and a.memory_source == "tracked-tensors"
        if a.stage == 0:
            # Its block and gradient, plus the fp32 logits block of its longest slice (16 rows
            # on replica 0, 12 on replica 1) while a head runs.
            rows = 16 if a.rank == 0 else 12
            assert a.peak_memory_bytes - b.peak_memory_bytes == (
                block_state + rows * (TINY.vocab_size // 2) * 4)
        else:  # the last stage gives up half the head and no longer keeps logits to backward
            assert a.peak_memory_bytes < b.peak_memory_bytes - block_state


@pytest.mark.slow
def test_simulated_activation_peak_per_rank_equals_the_tracked_one(executed):
    """The walk under the runtime's accounting (the spread head's rows on the last block, its
    logits block on every stage while it runs its part) against every rank of every case:
    1f1b, SlimPipe, asymmetric, interleaved, tp2, ring cp2, pp4, and the last-stage head."""
    config = RuntimeConfig(seed=3)
    for name, (plan, result) in executed.items():
        rows = compare_ranks(plan, TINY, result.record, config)
        assert len(rows) == plan.world_size, name
        worst = max(abs(r.error) for r in rows)
        assert worst <= 1e-6, f"{name}: max activation error {worst:.2e}"
