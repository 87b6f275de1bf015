"""Every plan field the runtime cannot execute is refused before any process starts, with a
ValueError naming the group, the field and what is allowed (never silently ignored)."""

from __future__ import annotations

import dataclasses

import pytest

from slimpack.plan import Phase, Plan
from slimpack.runtime.examples import packed_plan, slimpipe_plan
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs import ParallelSpec, model_preset

TINY = model_preset("tiny")


def _with_group_fields(plan: Plan, **fields) -> Plan:
    phases = tuple(Phase(groups=tuple(dataclasses.replace(g, **fields) for g in ph.groups))
                   for ph in plan.phases)
    return dataclasses.replace(plan, phases=phases)


def _refused(plan: Plan, match: str, model=TINY) -> None:
    with pytest.raises(ValueError, match=match):
        check_runtime_plan(plan, model)


def test_ulysses_heads_per_tensor_parallel_rank_must_split_over_cp():
    # tiny has 4 heads: tp2 leaves 2 per rank, which Ulysses over cp=4 cannot split.
    base = packed_plan(pp=1, dp=1)
    parallel = ParallelSpec(tp=2, cp=4)
    group = dataclasses.replace(next(base.groups()), tp=2, cp=4, cp_kind="ulysses",
                                ranks=parallel.replica_ranks(0))
    plan = dataclasses.replace(base, parallel=parallel, phases=(Phase(groups=(group,)),))
    _refused(plan, r"group 0: cp_kind='ulysses' needs cp=4 to divide num_heads=4 / tp=2 = 2 "
                   r"heads per tp rank")
    ok = dataclasses.replace(group, cp=2, ranks=ParallelSpec(tp=2, cp=2).replica_ranks(0))
    check_runtime_plan(dataclasses.replace(plan, parallel=ParallelSpec(tp=2, cp=2),
                                           phases=(Phase(groups=(ok,)),)), TINY)


def test_vocab_parallel_pp_with_tied_embeddings_is_refused():
    # The simulator spreads only an untied head; a tied one is not executed spread either.
    plan = _with_group_fields(slimpipe_plan(pp=2, dp=1), vocab_parallel_pp=True)
    check_runtime_plan(plan, TINY)
    _refused(plan, r"group 0: vocab_parallel_pp=True is not executed .* allowed: false for "
                   r"tiny-mha \(tied embeddings\) when pp > 1", model=model_preset("tiny-mha"))


def test_vocab_parallel_pp_needs_pp_times_tp_to_split_the_vocabulary():
    plan = _with_group_fields(slimpipe_plan(pp=2, dp=1), vocab_parallel_pp=True)
    odd = dataclasses.replace(TINY, vocab_size=255)
    _refused(plan, r"group 0: vocab_parallel_pp=True .* allowed: false when pp\*tp = 2 does not "
                   r"divide vocab_size=255", model=odd)


def test_vocab_parallel_pp_must_be_the_same_for_every_group():
    plan = slimpipe_plan(pp=2, dp=2)
    g0, g1 = plan.groups()
    mixed = dataclasses.replace(plan, phases=(Phase(groups=(
        dataclasses.replace(g0, vocab_parallel_pp=True), g1)),))
    _refused(mixed, r"plan: vocab_parallel_pp=\[False, True\] is not executed .* one value for "
                    r"all groups at pp > 1")


def test_vocab_parallel_pp_on_one_stage_is_the_same_computation_and_runs():
    # pp = 1: the LM head is on the only stage either way.
    check_runtime_plan(_with_group_fields(packed_plan(pp=1, dp=1), vocab_parallel_pp=True),
                       TINY)


def test_zero3_with_tied_embedding_copies_on_two_stages_is_refused():
    plan = dataclasses.replace(packed_plan(pp=2, dp=2), zero_stage=3)
    tied = model_preset("tiny-mha")
    with pytest.raises(ValueError) as err:
        check_runtime_plan(plan, tied)
    assert str(err.value) == ("plan: zero_stage=3 is not executed by the runtime; allowed: 0 or "
                              "1 for tiny-mha (tied embeddings) at pp > 1; 3 with untied "
                              "embeddings or pp = 1")
    # Every stage the IR allows runs otherwise: ZeRO-1 shards optimizer states, and the
    # runtime takes no optimizer step, so it is ZeRO-0's all-reduce; 3 shards parameters.
    for stage in (None, 0, 1, 3):
        check_runtime_plan(dataclasses.replace(plan, zero_stage=stage), TINY)
    check_runtime_plan(dataclasses.replace(packed_plan(pp=1, dp=2), zero_stage=3), tied)


def test_old_plan_with_zero_stage_in_metadata_reaches_the_runtime_as_the_field():
    old = {**packed_plan(pp=2, dp=2).to_dict(), "format": "slimpack-plan/2",
           "metadata": {"zero_stage": 3}}
    old.pop("zero_stage")
    plan = Plan.from_dict(old)
    assert plan.zero_stage == 3
    _refused(plan, r"^plan: zero_stage=3 is not executed by the runtime; allowed: 0 or 1 for "
                   r"tiny-mha", model=model_preset("tiny-mha"))


def test_attention_redistribution_is_refused_only_with_ulysses_cp_at_pp_above_one():
    """Executed at pp > 1 lane by lane with tp > 1, ring CP and every recompute mode (and at
    pp = 1, where there is no pair); Ulysses CP at pp > 1 is refused by name."""
    def on(plan):  # noqa: ANN001, ANN202
        """Redistribution on, with moves chosen (none: which pairs is tests/test_plan_moves'
        matter, the refusal here is by field)."""
        return _with_group_fields(plan.with_attention_redistribution(True),
                                  attention_moves=() if plan.parallel.pp > 1 else None)

    for plan in (slimpipe_plan(pp=2, dp=1), slimpipe_plan(pp=1, dp=1),
                 slimpipe_plan(pp=2, dp=1, tp=2), slimpipe_plan(pp=2, dp=1, cp=2),
                 _with_group_fields(slimpipe_plan(pp=2, dp=1, cp=2), cp_sharding="per-document"),
                 _with_group_fields(slimpipe_plan(pp=2, dp=1), recompute="selective"),
                 _with_group_fields(slimpipe_plan(pp=2, dp=1, tp=2), recompute="full")):
        check_runtime_plan(on(plan), TINY)
    ulysses = _with_group_fields(slimpipe_plan(pp=2, dp=1, cp=2), cp_kind="ulysses")
    _refused(on(ulysses),
             r"^plan: attention_redistribution=True is not executed by the runtime; allowed: "
             r"false when a group at pp > 1 has cp > 1 with cp_kind other than 'ring' "
             r"\(group 0: cp=2, cp_kind='ulysses'\); true otherwise")


def test_moe_gelu_and_learned_position_models_are_refused_naming_the_field():
    plan = packed_plan(pp=1, dp=1)
    _refused(plan, r"num_experts=4 is not executed .* allowed: 1",
             model=dataclasses.replace(TINY, num_experts=4, moe_top_k=2))
    _refused(plan, r"mlp='gelu' is not executed .* allowed: 'swiglu'",
             model=dataclasses.replace(TINY, mlp="gelu"))
    _refused(plan, r"rope=False is not executed .* allowed: True",
             model=dataclasses.replace(TINY, rope=False))
    spread = packed_plan(pp=1, dp=2)
    _refused(dataclasses.replace(spread, parallel=dataclasses.replace(spread.parallel, ep=2)),
             r"^plan: parallel.ep=2 is not executed by the runtime; allowed: 1")


def test_recompute_modes_and_offload_shares_are_accepted():
    for mode in ("none", "selective", "full"):
        for share in (0.0, 0.5, 1.0):
            check_runtime_plan(_with_group_fields(slimpipe_plan(pp=2, dp=1), recompute=mode,
                                                  offload=share), TINY)
