"""Equal terms for capped searches (issue 24): a method whose capped search is slower than
another method is also tried on that method's layout (slimpack/planning/winners.py)."""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.compare import compare, method_candidates, plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.data import sample_batch
from slimpack.planning.winners import layout_key, try_winner_layouts
from slimpack.sim import simulate
from slimpack.specs import ParallelSpec, hardware_preset, model_preset


@dataclass(frozen=True)
class _Record:
    step_time_s: float
    oom: bool = False


@dataclass(frozen=True)
class _Answer:
    parallel: ParallelSpec
    record: _Record
    exhaustive: bool
    tried: tuple


def _answer(pp: int, step: float, *, exhaustive: bool = False, oom: bool = False) -> _Answer:
    layout = ParallelSpec.for_world(8, pp=pp)
    return _Answer(layout, _Record(step, oom), exhaustive, ({"parallel": layout.to_dict()},))


def test_slower_capped_methods_get_the_faster_layouts_until_none_is_left():
    calls = []
    # What each method would run in on each layout (pp -> seconds): "c" is fastest on pp4,
    # which "a" and "b" never tried; once "a" takes pp4 it is faster than "b" there too.
    table = {"a": {1: 10.0, 2: 9.0, 4: 5.0}, "b": {2: 8.0, 4: 7.0}, "c": {4: 6.0}}

    def extend(method, answer, layouts):
        calls.append((method, sorted(p.pp for p in layouts)))
        best = min([answer.parallel.pp] + [p.pp for p in layouts if p.pp in table[method]],
                   key=lambda pp: table[method][pp])
        tried = answer.tried + tuple({"parallel": p.to_dict()} for p in layouts)
        return _Answer(ParallelSpec.for_world(8, pp=best), _Record(table[method][best]),
                       False, tried)

    out = try_winner_layouts({"a": _answer(1, 10.0), "b": _answer(2, 8.0),
                              "c": _answer(4, 6.0, exhaustive=True), "d": None}, extend)
    assert {m: (a.parallel.pp, a.record.step_time_s) for m, a in out.items() if a} == {
        "a": (4, 5.0), "b": (4, 7.0), "c": (4, 6.0)}
    assert out["d"] is None
    # "a" first gets pp2 (b's) and pp4 (c's); "b" gets pp4 once; "c" is exhaustive: never
    # extended, although "a" ends faster; no layout is offered twice.
    assert calls == [("a", [2, 4]), ("b", [4])]


def test_an_out_of_memory_answer_wins_nothing_and_tries_the_fitting_layouts():
    offered = []

    def extend(method, answer, layouts):
        offered.append((method, [p.pp for p in layouts]))
        return answer

    out = try_winner_layouts({"a": _answer(1, 10.0), "b": _answer(2, 1.0, oom=True)}, extend)
    assert out["a"].parallel.pp == 1
    # b's 1 s step does not fit memory: a is not sent there; b may still fit on a's layout.
    assert offered == [("b", [1])]


def test_compare_tries_every_capped_method_on_each_faster_layout():
    # Real planners on real Common Crawl lengths, 16 GPUs: megatron exhaustive, the others
    # capped at one layout. Afterwards no capped method is slower than a fitting method whose
    # layout it may use but was not tried on.
    model, hw = model_preset("llama-7b"), hardware_preset("h100")
    batch = sample_batch("commoncrawl", num_sequences=48, context=16384, seed=2)
    methods = ["megatron", "naive", "wlb-llm", "slimpipe"]
    caps = {"megatron": None, "naive": 1, "wlb-llm": 1, "slimpipe": 1}
    cost = default_cost_model(model, hw)
    rows = [r.to_dict() for r in compare(methods, batch, model, hw, 16, auto_parallel=True,
                                         context=16384, auto_parallel_top_k=caps, cost=cost)]
    assert sum(r["layouts_from_winners"] for r in rows) > 0  # the pass did something here
    for row in rows:
        if caps[row["method"]] is None:
            assert row["layouts_from_winners"] == 0
            continue
        space = {layout_key(c.parallel)
                 for c in method_candidates(row["method"], model, hw, 16, 16384)}
        assert row["layouts_simulated"] == 1 + row["layouts_from_winners"]
        for other in rows:
            faster = not other["oom"] and other["step_time_s"] < row["step_time_s"]
            if faster and layout_key(other["parallel"]) in space:
                # The pass tried it: this method on the faster one's layout is no faster
                # than the answer it kept.
                layout = ParallelSpec.for_world(16, **{k: other["parallel"][k]
                                                       for k in ("tp", "cp", "pp", "vpp")})
                plan = plan_method(row["method"], batch, model, hw, layout, cost,
                                   context=16384)
                step = simulate(plan, model=model, hardware=hw, cost=cost).record.step_time_s
                assert step >= row["step_time_s"] * (1 - 1e-12), (row["method"],
                                                                   other["method"])
