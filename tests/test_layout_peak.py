"""The layout's peak guess against the exact (simulator's) peak, and the repair it saves.

``layout_peak_bytes`` reads a group's memory walk from its layout alone, taking backward
MicroPacks as the mirror of the forward ones (slimpack/slimpack_planner/layout_peak.py). For
a mirrored packing (``no_asymmetric``) that is the packing itself: the guess may only exceed
the exact peak by the logits bound (largest MicroPack for largest slice). With the asymmetric
re-deal it is a guess; the planner acts on it only above the budget by
``GUESS_OVER_SLACK``, so its overshoot must stay under that.
"""

from __future__ import annotations

import random
from functools import partial

import pytest

from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.sim.memory import schedule_peak_bytes
from slimpack.slimpack_planner import assemble
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

plan = partial(plan_method, "slimpack")

data = pytest.importorskip("slimpack.data")

HW = hardware_preset("h800")


def _guess_errors(monkeypatch, *, no_asymmetric: bool, cases: int = 12) -> list[float]:
    """guess / exact - 1 for every group built over random real batches and layouts."""
    errors: list[float] = []
    emit = assemble._emit_group

    def checked_emit(ctx, group_id, replicas, layout, est, deadline):
        group = emit(ctx, group_id, replicas, layout, est, deadline)
        guess = assemble._layout_peak(ctx, layout, len(replicas), None)
        exact = max(schedule_peak_bytes(group, ctx.model, ctx.parallel.dp))
        errors.append(guess / exact - 1)
        return group

    monkeypatch.setattr(assemble, "_emit_group", checked_emit)
    rng = random.Random(3)
    done = 0
    while done < cases:
        model = model_preset(rng.choice(["llama-7b", "llama-13b", "llama-70b"]))
        parallel = ParallelSpec(tp=rng.choice([2, 4, 8]), cp=rng.choice([1, 2, 4]),
                                pp=rng.choice([1, 2, 4, 8]), dp=rng.choice([1, 2]))
        try:
            parallel.validate_for_model(model)
        except ValueError:
            continue
        batch = data.sample_batch(rng.choice(["commoncrawl", "github", "wikipedia"]),
                                  num_sequences=rng.choice([64, 256]) * parallel.dp,
                                  context=rng.choice([16384, 65536, 131072]), seed=done)
        plan(batch, model, HW, parallel, AnalyticCostModel(model=model, hardware=HW),
             search=False, no_asymmetric=no_asymmetric)
        done += 1
    return errors


def test_mirrored_packing_guess_is_the_exact_walk_up_to_the_logits_bound(monkeypatch):
    errors = _guess_errors(monkeypatch, no_asymmetric=True)
    assert len(errors) >= 12
    # Never below (the same walk, the logits bound from above); measured up to +0.17%.
    assert min(errors) >= -1e-12
    assert max(errors) <= 0.003


def test_asymmetric_guess_never_overshoots_past_the_slack(monkeypatch):
    errors = _guess_errors(monkeypatch, no_asymmetric=False)
    assert len(errors) >= 12
    # Measured over 123 groups of 40 random layouts: -1.8% to +0.53% (the largest on a
    # pp-1 group whose logits bound is loose); below is harmless (the exact check repairs).
    assert max(errors) <= assemble.GUESS_OVER_SLACK + 0.001
    assert min(errors) >= -0.03


def test_a_layout_clearly_over_memory_is_repacked_before_any_slice_is_built(monkeypatch):
    """A batch whose first layout peaks over the budget (llama-7b, 1,024 Common Crawl
    sequences at 32K, tp 4 pp 2): the guess sends it back, so the group is laid out twice but
    built once (it was built twice), and the plan fits."""
    model = model_preset("llama-7b")
    batch = data.sample_batch("commoncrawl", num_sequences=1024, context=32768, seed=4)
    calls = {"layout": 0, "emit": 0}
    layout, emit = assemble._layout_group, assemble._emit_group

    def counting_layout(*args, **kwargs):
        calls["layout"] += 1
        return layout(*args, **kwargs)

    def counting_emit(*args, **kwargs):
        calls["emit"] += 1
        return emit(*args, **kwargs)

    monkeypatch.setattr(assemble, "_layout_group", counting_layout)
    monkeypatch.setattr(assemble, "_emit_group", counting_emit)
    result = plan(batch, model, HW, ParallelSpec(tp=4, pp=2),
                  AnalyticCostModel(model=model, hardware=HW), search=False)
    assert calls == {"layout": 2, "emit": 1}
    peak = result.metadata["slimpack"]["peak_bytes"]
    assert peak <= HW.usable_memory_bytes * 0.9  # the planner's budget (memory_headroom)
