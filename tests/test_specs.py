"""Specs: presets, validation errors, and every rank/group question of ParallelSpec."""

import pytest

from slimpack.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    ModelSpec,
    ParallelSpec,
    hardware_preset,
    model_preset,
)


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_every_model_preset_builds(name):
    model = model_preset(name)
    assert model.name == name
    assert model.num_heads % model.num_kv_heads == 0


def test_model_shapes_from_design_section_4():
    m = model_preset("llama-70b")
    assert (m.num_layers, m.hidden, m.ffn_hidden, m.num_heads, m.num_kv_heads) == (
        80, 8192, 28672, 64, 8)
    assert m.kv_dim == 8 * 128
    # Public parameter counts: Llama-2-7B is 6.74B with a 32K vocab; our 128,256 vocab adds
    # 2 * (128256 - 32000) * 4096 = 0.79B untied -> about 7.5B.
    assert model_preset("llama-7b").num_params == pytest.approx(7.53e9, rel=0.01)
    # Llama-3-70B: 70.6B parameters (vocab 128,256), within 0.5%.
    assert m.num_params == pytest.approx(70.6e9, rel=0.005)
    mix = model_preset("mixtral-8x7b")
    assert mix.is_moe and mix.moe_top_k == 2
    # Mixtral 8x7B has 46.7B parameters with a 32K vocab; our vocab adds ~0.79B.
    assert mix.num_params == pytest.approx(46.7e9 + 0.79e9, rel=0.01)


@pytest.mark.parametrize(("name", "published"), [
    ("llama3.1-8b", 8.03e9),     # meta-llama/Llama-3.1-8B: 8.03B
    ("llama3.1-70b", 70.6e9),    # meta-llama/Llama-3.1-70B: 70.6B
    ("nemotron4-15b", 15.7e9),   # arXiv 2402.16819: 3.2B embedding + 12.5B non-embedding
    ("nemotron4-340b", 341e9),   # arXiv 2406.11704: 9.4B embedding + 331.6B non-embedding
    ("gpt3-175b", 174.6e9),      # Narayanan et al. 2021, Table 1
])
def test_public_model_presets_have_their_published_parameter_counts(name, published):
    """Within 1% of the count each model's publication gives."""
    assert model_preset(name).num_params == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("name", sorted(HARDWARE_PRESETS))
def test_every_hardware_preset_builds(name):
    hw = hardware_preset(name)
    assert hw.peak_flops > 1e14 and hw.memory_gib >= 40


def test_hardware_alias_and_unknown_preset():
    assert hardware_preset("H800").name == "h800-80g"
    with pytest.raises(ValueError, match="unknown hardware preset 'tpu'.*allowed: .*h100"):
        hardware_preset("tpu")
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'.*llama-7b"):
        model_preset("gpt-5")


def test_model_validation_names_the_field():
    with pytest.raises(ValueError, match="ModelSpec.num_layers must be > 0"):
        ModelSpec(name="x", num_layers=0, hidden=64, ffn_hidden=64, num_heads=4, num_kv_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads .3. must divide num_heads .4."):
        ModelSpec(name="x", num_layers=1, hidden=64, ffn_hidden=64, num_heads=4, num_kv_heads=3)


def test_parallel_validation_errors():
    with pytest.raises(ValueError, match="ParallelSpec.tp must be > 0"):
        ParallelSpec(tp=0)
    with pytest.raises(ValueError, match="world_size=64 but tp.cp.pp.dp"):
        ParallelSpec(tp=3, pp=2, dp=10, world_size=64)
    with pytest.raises(ValueError, match="tp.cp.pp = 3.1.1 = 3 must divide world_size 64"):
        ParallelSpec.for_world(64, tp=3)
    with pytest.raises(ValueError, match="ParallelSpec.tp=3 must divide num_heads=32"):
        ParallelSpec(tp=3).validate_for_model(model_preset("llama-7b"))
    with pytest.raises(ValueError, match="pp.vpp = 3.1 must divide num_layers=32"):
        ParallelSpec(pp=3).validate_for_model(model_preset("llama-7b"))
    # tp beyond the KV heads replicates them (llama-70b has 8 KV heads): allowed.
    ParallelSpec(tp=16).validate_for_model(model_preset("llama-70b"))


def test_rank_coordinates_round_trip_and_megatron_order():
    p = ParallelSpec(tp=4, cp=2, pp=3, dp=2)
    assert p.world == 48
    for rank in range(p.world):
        c = p.coords(rank)
        assert p.rank(dp=c.dp, pp=c.pp, cp=c.cp, tp=c.tp) == rank
    # tp fastest, then cp, then dp, then pp (Megatron-LM's default "tp-cp-ep-dp-pp").
    assert p.tp_group(5) == (4, 5, 6, 7)
    assert p.cp_group(5) == (1, 5)
    assert p.dp_group(5) == (5, 13)
    assert p.pp_group(5) == (5, 21, 37)
    assert p.replica_ranks(1)[:4] == (8, 9, 10, 11)
    assert len(p.all_groups("dp")) == p.world // p.dp
    with pytest.raises(ValueError, match=r"rank must be in \[0, 48\)"):
        p.coords(48)


def test_node_placement():
    p = ParallelSpec(tp=8, pp=4, gpus_per_node=8)
    assert p.same_node(p.tp_group(9))
    assert not p.same_node(p.pp_group(0))
    assert p.node_of(17) == 2
