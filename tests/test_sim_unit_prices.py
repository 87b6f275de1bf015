"""Pricing all units of a group in one numpy pass (``sim.costs.unit_prices``) gives exactly
what pricing them one by one gives: the same floats to the last bit, the same token counts."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.cost import AnalyticCostModel
from slimpack.cost.cp_sharding import shard_piece_arrays
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Group, Segment, Slice, Unit
from slimpack.sim.costs import group_costs, unit_layer_seconds, unit_prices
from slimpack.specs import hardware_preset, model_preset
from slimpack.specs.training import TrainingSpec

MODEL, HW = model_preset("llama-7b"), hardware_preset("h800")
COSTS = {"kernel": default_cost_model(MODEL, HW),
         "analytic": AnalyticCostModel(model=MODEL, hardware=HW)}


class PiecesOnly:
    """A real cost model seen through the bare CostModel protocol (no batched methods), as a
    user's or calibrated.py's model is: the simulator must price it unit by unit."""

    def __init__(self, inner):
        self.inner, self.model, self.hardware, self.comm = inner, inner.model, inner.hardware, \
            inner.comm

    def layer_times(self, pieces, *, tp=1, recompute="none"):
        return self.inner.layer_times(pieces, tp=tp, recompute=recompute)

    def head_times(self, tokens, *, tp=1, vocab_shards=1):
        return self.inner.head_times(tokens, tp=tp, vocab_shards=vocab_shards)

    def __getattr__(self, name):
        # Ulysses pricing where the inner model has it, but none of the batched methods.
        if name == "ulysses_layer_times" and hasattr(self.inner, name):
            return self.inner.ulysses_layer_times
        raise AttributeError(name)


@st.composite
def groups(draw):
    cp = draw(st.sampled_from([1, 2, 4, 8, 32]))
    tp = draw(st.sampled_from([1, 2, 8]))
    pp = draw(st.sampled_from([1, 2]))
    slices = []
    for sid in range(draw(st.integers(1, 12))):
        # Short segments leave some CP ranks of a unit without tokens.
        segs = draw(st.lists(st.tuples(st.integers(1, 9_000), st.integers(0, 200_000)),
                             min_size=1, max_size=6))
        slices.append(Slice(slice_id=sid, segments=tuple(
            Segment(seq_id=i, start=prefix, end=prefix + tokens)
            for i, (tokens, prefix) in enumerate(segs))))

    def partition():
        order = draw(st.permutations(range(len(slices))))
        cuts = sorted(draw(st.sets(st.integers(1, max(len(order) - 1, 1)), max_size=4)))
        bounds = [0] + [c for c in cuts if c < len(order)] + [len(order)]
        return tuple(Unit(slice_ids=tuple(order[a:b]))
                     for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a)

    forward = partition()
    backward = forward if draw(st.booleans()) else partition()
    return Group(group_id=0, ranks=tuple(range(tp * cp * pp)), tp=tp, cp=cp, pp=pp,
                 slices=tuple(slices), forward_units=forward, backward_units=backward,
                 cp_sharding=draw(st.sampled_from(["per-sequence", "per-document"])),
                 cp_kind=draw(st.sampled_from(["ring", "ulysses"])),
                 recompute=draw(st.sampled_from(["none", "selective", "full"])))


def one_by_one(group, unit, cost, cp_intra):
    """Today's reference: each slice sharded on its own, a unit's rank pieces concatenated."""
    shards = [shard_piece_arrays([(s.num_tokens, s.start) for s in group.slice(sid).segments],
                                 group.cp, group.cp_sharding) for sid in unit.slice_ids]
    per_rank = [np.concatenate([sh[r] for sh in shards]) for r in range(group.cp)]
    return unit_layer_seconds(per_rank, model=MODEL, cost=cost, tp=group.tp, cp=group.cp,
                              cp_kind=group.cp_kind, recompute=group.recompute,
                              cp_intra=cp_intra)


@settings(max_examples=150, deadline=None)
@given(group=groups(), kind=st.sampled_from(sorted(COSTS)), cp_intra=st.booleans())
def test_unit_prices_equal_pricing_unit_by_unit(group, kind, cp_intra):
    cost = COSTS[kind]
    units = list(group.forward_units) + list(group.backward_units)
    batched = unit_prices(group, units, model=MODEL, cost=cost, cp_intra=cp_intra)
    assert batched == [one_by_one(group, u, cost, cp_intra) for u in units]


@settings(max_examples=60, deadline=None)
@given(group=groups(), kind=st.sampled_from(sorted(COSTS)),
       gpus_per_node=st.sampled_from([4, 8]))
def test_group_costs_are_the_same_through_the_per_unit_path(group, kind, gpus_per_node):
    cost = COSTS[kind]
    fast = group_costs(group, model=MODEL, cost=cost, gpus_per_node=gpus_per_node)
    slow = group_costs(group, model=MODEL, cost=PiecesOnly(cost), gpus_per_node=gpus_per_node)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    # The cross-layout cache: a cold and a warm call price the same.
    cache: dict = {}
    cold = group_costs(group, model=MODEL, cost=cost, gpus_per_node=gpus_per_node,
                       price_cache=cache)
    assert cache
    warm = group_costs(group, model=MODEL, cost=cost, gpus_per_node=gpus_per_node,
                       price_cache=cache)
    assert dataclasses.asdict(cold) == dataclasses.asdict(warm) == dataclasses.asdict(fast)


def test_pieces_only_models_and_unfused_attention_take_the_per_unit_path():
    seg = Segment(seq_id=0, start=0, end=8192)
    group = Group(group_id=0, ranks=tuple(range(4)), cp=4, slices=(Slice(slice_id=0,
                  segments=(seg,)),), forward_units=(Unit(slice_ids=(0,)),),
                  backward_units=(Unit(slice_ids=(0,)),))
    units = list(group.forward_units)
    cost = COSTS["kernel"]
    unfused = default_cost_model(MODEL, HW, TrainingSpec(attention_kernel="unfused"))
    for kind in ("ring", "ulysses"):
        shaped = dataclasses.replace(group, cp_kind=kind)
        assert unit_prices(shaped, units, model=MODEL, cost=PiecesOnly(cost)) is None
        assert unit_prices(shaped, units, model=MODEL, cost=unfused) is None
        assert unit_prices(shaped, [], model=MODEL, cost=cost) is None
        # Through group_costs the per-unit path gives what unit_layer_seconds gives.
        costs = group_costs(shaped, model=MODEL, cost=unfused, gpus_per_node=8)
        expected = one_by_one(shaped, units[0], unfused, True)
        assert costs.fwd_s == [[expected[0] * MODEL.num_layers
                                + unfused.head_times(2048, tp=1).forward_s]]
    (priced,) = unit_prices(group, units, model=MODEL, cost=cost)
    assert priced == one_by_one(group, units[0], cost, True)
    assert priced[4] == 8192
