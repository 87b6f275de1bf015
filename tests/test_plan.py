"""Plan IR: JSON round trip and every rule Plan.validate enforces."""

import dataclasses

import pytest

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.methods import get_planner, method_names
from slimpack.plan import Group, Phase, Plan, PlanError, Segment, Slice, Unit
from slimpack.specs import ParallelSpec, hardware_preset, model_preset


def seg(seq, start, end):
    return Segment(seq_id=seq, start=start, end=end)


def make_plan(*, slices, fwd, bwd, lengths, pp=2, ranks=(0, 1), parallel=None):
    group = Group(group_id=0, ranks=ranks, pp=pp, slices=tuple(slices),
                  forward_units=tuple(Unit(slice_ids=u) for u in fwd),
                  backward_units=tuple(Unit(slice_ids=u) for u in bwd), schedule="asymmetric")
    return Plan(method="test", parallel=parallel or ParallelSpec(pp=pp),
                sequence_lengths=lengths, phases=(Phase(groups=(group,)),))


def slimpack_style_slices():
    # seq 0 (12 tokens) in three slices; the last two packed with short docs 1 and 2.
    return [
        Slice(slice_id=0, segments=(seg(0, 0, 4),)),
        Slice(slice_id=1, segments=(seg(0, 4, 8), seg(1, 0, 3))),
        Slice(slice_id=2, segments=(seg(0, 8, 12), seg(2, 0, 2))),
    ]


def test_asymmetric_plan_validates_and_round_trips(tmp_path):
    plan = make_plan(slices=slimpack_style_slices(), fwd=[(0, 1), (2,)], bwd=[(2, 1), (0,)],
                     lengths={0: 12, 1: 3, 2: 2})
    plan.validate()
    assert next(plan.groups()).is_asymmetric
    mirrored = make_plan(slices=slimpack_style_slices(), fwd=[(0, 1), (2,)], bwd=[(2,), (1, 0)],
                         lengths={0: 12, 1: 3, 2: 2})
    assert not next(mirrored.groups()).is_asymmetric
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again == plan
    assert not list(tmp_path.glob("*.tmp"))


def test_token_covered_twice_or_never():
    slices = slimpack_style_slices()
    with pytest.raises(PlanError, match=r"seq 0 tokens \[10, 12\) are covered twice"):
        bad = slices[:2] + [Slice(slice_id=2, segments=(seg(0, 8, 12), seg(2, 0, 2))),
                            Slice(slice_id=3, segments=(seg(0, 10, 12),))]
        make_plan(slices=bad, fwd=[(0, 1), (2, 3)], bwd=[(3, 2), (1, 0)],
                  lengths={0: 12, 1: 3, 2: 2}).validate()
    with pytest.raises(PlanError, match=r"seq 0 tokens \[8, 12\) are never covered"):
        make_plan(slices=slices[:2] + [Slice(slice_id=2, segments=(seg(2, 0, 2),))],
                  fwd=[(0, 1), (2,)], bwd=[(2,), (1, 0)], lengths={0: 12, 1: 3, 2: 2}).validate()
    with pytest.raises(PlanError, match="seq 3 .5 tokens. is never covered"):
        make_plan(slices=slices, fwd=[(0, 1), (2,)], bwd=[(2,), (1, 0)],
                  lengths={0: 12, 1: 3, 2: 2, 3: 5}).validate()


def test_forward_out_of_order_and_backward_in_wrong_order():
    slices = slimpack_style_slices()
    lengths = {0: 12, 1: 3, 2: 2}
    with pytest.raises(PlanError, match="seq 0 is forwarded out of order at slice 0"):
        make_plan(slices=slices, fwd=[(1,), (0, 2)], bwd=[(2,), (1, 0)], lengths=lengths).validate()
    with pytest.raises(PlanError, match="seq 0 is backwarded out of order at slice 2"):
        make_plan(slices=slices, fwd=[(0, 1), (2,)], bwd=[(0,), (2, 1)], lengths=lengths).validate()


def test_units_must_partition_the_same_slices():
    slices = slimpack_style_slices()
    lengths = {0: 12, 1: 3, 2: 2}
    with pytest.raises(PlanError, match="backward units miss slices \\[0\\]"):
        make_plan(slices=slices, fwd=[(0, 1), (2,)], bwd=[(2,), (1,)], lengths=lengths).validate()
    with pytest.raises(PlanError, match="forward units run slices \\[1\\] more than once"):
        make_plan(slices=slices, fwd=[(0, 1), (1, 2)], bwd=[(2, 1, 0)], lengths=lengths).validate()
    with pytest.raises(PlanError, match="refer to missing slices \\[7\\]"):
        make_plan(slices=slices, fwd=[(0, 1), (2, 7)], bwd=[(2, 1, 0)], lengths=lengths).validate()


def test_degrees_must_multiply_to_the_world_size():
    slices = [Slice(slice_id=0, segments=(seg(0, 0, 4),))]
    with pytest.raises(PlanError, match="tp.cp.pp = 1.1.2 = 2 but it lists 3 ranks"):
        make_plan(slices=slices, fwd=[(0,)], bwd=[(0,)], lengths={0: 4},
                  ranks=(0, 1, 2)).validate()
    with pytest.raises(PlanError, match=r"ranks \[2, 3\] outside the world of 2 devices"):
        make_plan(slices=slices, fwd=[(0,)], bwd=[(0,)], lengths={0: 4}, ranks=(2, 3)).validate()
    with pytest.raises(ValueError, match="degrees must multiply to the world size"):
        ParallelSpec(pp=2, dp=2, world_size=8)


def test_sequence_may_not_span_groups_and_ranks_may_not_overlap():
    parallel = ParallelSpec(pp=1, dp=2)
    a = Group(group_id=0, ranks=(0,), slices=(Slice(slice_id=0, segments=(seg(0, 0, 2),)),),
              forward_units=(Unit(slice_ids=(0,)),), backward_units=(Unit(slice_ids=(0,)),))
    b = dataclasses.replace(a, group_id=1, ranks=(1,),
                            slices=(Slice(slice_id=0, segments=(seg(0, 2, 4),)),))
    plan = Plan(method="t", parallel=parallel, sequence_lengths={0: 4},
                phases=(Phase(groups=(a, b)),))
    with pytest.raises(PlanError, match="seq 0 is split across groups 0 and 1"):
        plan.validate()
    c = dataclasses.replace(b, ranks=(0,), slices=(Slice(slice_id=0, segments=(seg(1, 0, 4),)),))
    plan = Plan(method="t", parallel=parallel, sequence_lengths={0: 2, 1: 4},
                phases=(Phase(groups=(a, c)),))
    with pytest.raises(PlanError, match=r"phase 0 runs ranks \[0\] in two groups at once"):
        plan.validate()


def test_bad_json_and_segments_are_clear_errors(tmp_path):
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(tmp_path / "bad.json")
    with pytest.raises(PlanError, match="format must be one of"):
        Plan.from_dict({"format": "other"})
    with pytest.raises(PlanError, match=r"needs 0 <= start < end, got \[5, 5\)"):
        seg(0, 5, 5)
    with pytest.raises(PlanError, match="two segments of seq 0"):
        Slice(slice_id=0, segments=(seg(0, 0, 2), seg(0, 2, 4)))


def test_reference_planner_end_to_end():
    model, hw = model_preset("tiny"), hardware_preset("h100")
    parallel = ParallelSpec(pp=2, dp=2)
    batch = Batch.from_lengths([5, 7, 3, 9, 2])
    plan = plan_method("reference", batch, model, hw, parallel,
                                    AnalyticCostModel(model=model, hardware=hw))
    assert plan.num_tokens == 26
    assert [g.ranks for g in plan.groups()] == [(0, 2), (1, 3)]
    assert "reference" in method_names()
    with pytest.raises(ValueError, match="unknown method 'nope'; allowed: .*reference"):
        get_planner("nope")


def test_batch_rejects_bad_lengths():
    with pytest.raises(ValueError, match="Sequence.length must be a positive token count, got -3"):
        Batch.from_lengths([4, -3])
    with pytest.raises(ValueError, match="at least one sequence"):
        Batch.from_lengths([])


def test_batch_derived_values_are_made_once_and_not_pickled():
    import pickle

    from baselines.common.fixed_length import fixed_length_samples

    batch = Batch.from_lengths([5, 9, 3])
    made = []
    first = batch.derived(("cut", 4), lambda: made.append(1) or [0, 1])
    assert batch.derived(("cut", 4), lambda: made.append(1) or [2]) is first
    assert made == [1]
    # Megatron-LM's samples at one context, built once for every layout of a search.
    assert fixed_length_samples(batch, 4) is fixed_length_samples(batch, 4)
    assert fixed_length_samples(batch, 8) is not fixed_length_samples(batch, 4)
    copy = pickle.loads(pickle.dumps(batch))
    assert copy == batch and copy.lengths == [5, 9, 3]
    assert copy.derived(("cut", 4), lambda: "rebuilt") == "rebuilt"  # travels without it


def test_unknown_sequence_and_segments_past_the_end():
    # Validation checks ownership and coverage on whole groups at once; a broken rule falls
    # back to the slice-by-slice walk, which names the first offender as before.
    slices = slimpack_style_slices()
    with pytest.raises(PlanError, match="Group 0: slice 1 holds unknown seq 1"):
        make_plan(slices=slices, fwd=[(0, 1), (2,)], bwd=[(2,), (1, 0)],
                  lengths={0: 12, 2: 2}).validate()
    with pytest.raises(PlanError, match="seq 2 has 1 tokens but segments reach 2"):
        make_plan(slices=slices, fwd=[(0, 1), (2,)], bwd=[(2,), (1, 0)],
                  lengths={0: 12, 1: 3, 2: 1}).validate()
    with pytest.raises(PlanError, match=r"seq 1 tokens \[0, 1\) are never covered"):
        short = slices[:1] + [Slice(slice_id=1, segments=(seg(0, 4, 8), seg(1, 1, 3))),
                              slices[2]]
        make_plan(slices=short, fwd=[(0, 1), (2,)], bwd=[(2,), (1, 0)],
                  lengths={0: 12, 1: 3, 2: 2}).validate()


def test_order_checked_only_where_a_sequence_has_several_segments():
    # Whole documents cannot be out of order; a cut one is still checked among them.
    slices = [Slice(slice_id=0, segments=(seg(0, 0, 4), seg(1, 0, 3))),
              Slice(slice_id=1, segments=(seg(0, 4, 8), seg(2, 0, 2)))]
    make_plan(slices=slices, fwd=[(0,), (1,)], bwd=[(1,), (0,)],
              lengths={0: 8, 1: 3, 2: 2}).validate()
    with pytest.raises(PlanError, match="seq 0 is backwarded out of order at slice 1"):
        make_plan(slices=slices, fwd=[(0,), (1,)], bwd=[(0,), (1,)],
                  lengths={0: 8, 1: 3, 2: 2}).validate()


def test_result_changing_fields_are_typed_and_round_trip(tmp_path):
    """Document map, memory verdict and attention redistribution are Plan fields (format 2),
    written and read back exactly; bad types are PlanErrors naming the field."""
    from slimpack.plan import DocumentMap

    base = make_plan(slices=slimpack_style_slices(), fwd=[[0], [1, 2], [3]],
                     bwd=[[3], [1, 2], [0]], lengths={0: 300, 1: 100, 2: 50})
    plan = dataclasses.replace(base, documents=DocumentMap(pieces={1: (7, 4096)},
                                                           samples={2: ((8, 20), (9, 30))}),
                               memory_fits=False, attention_redistribution=True)
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json")
    assert back.documents == plan.documents and back.memory_fits is False
    assert back.attention_redistribution is True
    # Piece 1 counts for document 7, sample 2 for documents 8 and 9 (MFU's numerator).
    assert back.document_lengths() == {0: 300, 7: 100, 8: 20, 9: 30}
    data = plan.to_dict()
    with pytest.raises(PlanError, match="memory_fits must be true, false or null"):
        Plan.from_dict({**data, "memory_fits": "yes"})
    with pytest.raises(PlanError, match="attention_redistribution must be true or false"):
        Plan.from_dict({**data, "attention_redistribution": 1})
    with pytest.raises(PlanError, match=r"documents.pieces\['1'\] must be a pair"):
        Plan.from_dict({**data, "documents": {"pieces": {"1": [7]}}})
    with pytest.raises(PlanError, match="unknown keys"):
        Plan.from_dict({**data, "documents": {"piece": {}}})


def test_format_1_plans_read_with_their_metadata_lifted_into_fields():
    base = make_plan(slices=slimpack_style_slices(), fwd=[[0], [1, 2], [3]],
                     bwd=[[3], [1, 2], [0]], lengths={0: 300, 1: 100, 2: 50})
    old = {**base.to_dict(), "format": "slimpack-plan/1",
           "metadata": {"document_pieces": {"1": [7, 4096]}, "memory_fits": True,
                        "attention_redistribution": True, "plan_seconds": 0.1}}
    for key in ("documents", "memory_fits", "attention_redistribution"):
        old.pop(key)
    plan = Plan.from_dict(old)
    assert plan.documents.pieces == {1: (7, 4096)} and plan.memory_fits is True
    assert plan.attention_redistribution is True and plan.metadata == {"plan_seconds": 0.1}
