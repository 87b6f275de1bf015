"""Every method is searched over one layout space (issue 24, "equal terms"): the union of
the papers' layouts, narrowed per method only by what it cannot run."""

from __future__ import annotations

from slimpack.compare import method_candidates
from slimpack.methods import get_method, method_names
from slimpack.planning.method import SEARCH_SPACE
from slimpack.specs import hardware_preset, model_preset


def test_the_search_space_is_the_union_of_the_papers_layouts():
    # SlimPipe's artifact: pp 8 with vpp 5 (llama-13b, 256K); Megatron-LM: cp up to 32.
    assert SEARCH_SPACE.max_pp == 32 and max(SEARCH_SPACE.vpp_options) == 5
    assert SEARCH_SPACE.max_cp == 32 and SEARCH_SPACE.vpp_options == (1, 2, 3, 4, 5)


def test_slimpack_may_use_every_layout_slimpipe_may():
    """SlimPack's slices, MicroPacks and DP-aware solver must never lose to SlimPipe for lack
    of a layout: before, SlimPipe searched pp <= 32 and vpp <= 5, SlimPack pp <= 16, vpp <= 2,
    and SlimPipe won llama-70b Common Crawl at pp16 vpp5 (1.31x)."""
    model, hw = model_preset("llama-70b"), hardware_preset("h800")
    slimpipe = {c.parallel for c in method_candidates("slimpipe", model, hw, 128, 65536)}
    slimpack = {c.parallel for c in method_candidates("slimpack", model, hw, 128, 65536)}
    assert slimpipe <= slimpack
    assert any(p.vpp == 5 and p.pp == 16 for p in slimpack)


def test_methods_differ_only_in_layouts_they_cannot_run():
    model, hw = model_preset("llama-13b"), hardware_preset("h800")
    widest = {c.parallel for c in method_candidates("megatron", model, hw, 64, 32768)}
    for name in method_names():
        spec = get_method(name)
        if spec.schedule_family != "1f1b" or spec.reshape is not get_method("megatron").reshape:
            continue  # other memory families or FlexSP's SP pool: compared among themselves
        own = {c.parallel for c in method_candidates(name, model, hw, 64, 32768)}
        assert own == {p for p in widest if spec.allows(p)}, name


def test_a_method_that_narrows_the_space_says_how_and_its_records_print_it():
    import dataclasses

    import pytest

    from slimpack.compare import best_parallel
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.data import sample_batch

    shared = SEARCH_SPACE.describe()
    for name in method_names():
        spec = get_method(name)
        if spec.layout_rule:
            assert spec.search_space() == f"{shared}; {spec.layout_rule}", name
        else:
            assert spec.search_space() == shared, name
    assert "pp = 1" in get_method("megatron-dcp").search_space()
    assert "pp > 1" in get_method("slimpipe").search_space()
    with pytest.raises(ValueError, match="layout_rule must say how"):
        dataclasses.replace(get_method("slimpipe"), layout_rule="")
    # The search's answer carries the method's own space into its record.
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    batch = sample_batch("wikipedia", num_sequences=16, context=16384, seed=0)
    found = best_parallel("megatron-dcp", batch, model, hw, 8,
                          default_cost_model(model, hw), context=16384, top_k=2)
    assert found.space == get_method("megatron-dcp").search_space()
    assert found.parallel.pp == 1
