"""Plans in Megatron-core's PackedSeqParams (THD) contract."""

import warnings

import pytest

from slimpack.integrations.megatron import packed_micro_batches, to_packed_seq_params
from slimpack.plan import Group, Phase, Plan, Segment, Slice, Unit
from slimpack.runtime.layout import GroupLayout
from slimpack.specs import ParallelSpec


def slimpack_style_plan() -> Plan:
    # seq 0 (12 tokens) in three slices, the last two packed with whole documents 1 and 2.
    slices = (
        Slice(slice_id=0, segments=(Segment(seq_id=0, start=0, end=4),)),
        Slice(slice_id=1, segments=(Segment(seq_id=0, start=4, end=8),
                                    Segment(seq_id=1, start=0, end=3))),
        Slice(slice_id=2, segments=(Segment(seq_id=0, start=8, end=12),
                                    Segment(seq_id=2, start=0, end=2))),
    )
    group = Group(group_id=0, ranks=(0, 1), pp=2, slices=slices,
                  forward_units=(Unit(slice_ids=(0, 1)), Unit(slice_ids=(2,))),
                  backward_units=(Unit(slice_ids=(2, 1)), Unit(slice_ids=(0,))),
                  schedule="asymmetric")
    return Plan(method="t", parallel=ParallelSpec(pp=2), sequence_lengths={0: 12, 1: 3, 2: 2},
                phases=(Phase(groups=(group,)),)).validate()


def test_thd_metadata_of_sliced_and_packed_units():
    fwd = packed_micro_batches(slimpack_style_plan())
    first, second = fwd
    # Unit 0: seq 0 [0,4) then seq 0 [4,8) (prefix 4) then doc 1 [0,3).
    assert first.cu_seqlens_q.tolist() == [0, 4, 8, 11]
    assert first.cu_seqlens_kv.tolist() == [0, 4, 12, 15]  # key lengths 4, 8 (4 + 4), 3
    assert (first.max_seqlen_q, first.max_seqlen_kv) == (4, 8)
    assert first.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2]
    assert first.has_kv_prefix
    # Unit 1: seq 0 [8,12) attends to 12 keys; doc 2 is whole.
    assert second.cu_seqlens_kv.tolist() == [0, 12, 14]
    assert second.num_tokens == 6
    back = packed_micro_batches(slimpack_style_plan(), backward=True)
    assert [b.seq_ids for b in back] == [(0, 2, 0, 1), (0,)]


def test_agrees_with_the_runtimes_own_varlen_layout():
    plan = slimpack_style_plan()
    group = next(plan.groups())
    layout = GroupLayout(group)
    for batch, unit in zip(packed_micro_batches(plan), group.forward_units, strict=True):
        q, k = [], []
        for sid in unit.slice_ids:
            q += layout[sid].varlen.q_lens
            k += layout[sid].varlen.k_lens
        lens_q = (batch.cu_seqlens_q[1:] - batch.cu_seqlens_q[:-1]).tolist()
        lens_k = (batch.cu_seqlens_kv[1:] - batch.cu_seqlens_kv[:-1]).tolist()
        assert (lens_q, lens_k) == (list(q), list(k))


def test_builds_megatron_cores_packed_seq_params():
    pytest.importorskip("megatron.core", reason="megatron-core not installed (extra: dev/gpu)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        params = to_packed_seq_params(packed_micro_batches(slimpack_style_plan())[0])
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_kv.tolist() == [0, 4, 12, 15]
    assert params.max_seqlen_kv == 8


def test_unknown_group_is_a_clear_error():
    with pytest.raises(ValueError, match="no group with id 7"):
        packed_micro_batches(slimpack_style_plan(), group_id=7)
