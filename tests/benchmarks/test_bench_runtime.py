"""The runtime's step for a fixed 4-rank plan at tp2 x cp2 against the same batch at
tp1 cp1 dp4 (issue 23): ``make bench`` reports both measured step times and their ratio in
``extra_info`` (and prints them); with --benchmark-disable it runs once as a plain test of
the same path.

Both plans run in one spawned job of 4 gloo processes (:func:`run_plans`), so process start
and group setup are outside the step times: the layouts alternate ``ROUNDS`` times, each
time ``WARMUP`` untimed steps then ``MEASURED`` timed ones, and a step's time is its slowest
rank's. The ratio is of the two medians (``ROUNDS * MEASURED`` steps each), measured in the
same run. pytest-benchmark's own time is the whole job (spawn
included) and is not the number to compare.

On 2 CPU cores the ratio measures collective overhead on a tiny model, not a GPU's: 4
processes share 2 cores, and every tp/cp collective is a blocking gloo round trip (the
runtime overlaps no tp or cp collective with compute; docs/harness.md, "make bench").
"""

from __future__ import annotations

import statistics

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Plan
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.many import run_plans
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")
# A fixed variable-length batch: two long sequences and many short ones (1,673 tokens).
LENGTHS = (600, 300, 40, 17, 90, 5, 120, 60, 8, 33, 150, 250)
LAYOUTS = {"tp2_cp2": dict(tp=2, cp=2), "dp4": dict(dp=4)}
ROUNDS, WARMUP, MEASURED = 3, 1, 3
CONTEXT = 424


def _plans() -> dict[str, Plan]:
    """Megatron-LM's planner plans the same batch for both layouts, so the layout is the
    only difference. Its 424-token micro-batches cut the batch into four (424, 424, 424 and
    401 tokens): one per rank at dp4, all four in turn at tp2 cp2."""
    cost = default_cost_model(TINY, H100)
    batch = Batch.from_lengths(LENGTHS)
    return {name: plan_method("megatron", batch, TINY, H100, ParallelSpec(**layout), cost,
                              context=CONTEXT)
            for name, layout in LAYOUTS.items()}


def test_bench_runtime_plans_are_what_they_say():
    """Fast, in the normal suite: the benchmark cannot silently measure other layouts or a
    different batch."""
    plans = _plans()
    for name, degrees in (("tp2_cp2", (2, 2, 1)), ("dp4", (1, 1, 4))):
        plan = plans[name]
        assert plan.world_size == 4
        assert plan.method == "megatron"
        assert (plan.parallel.tp, plan.parallel.cp, plan.parallel.dp, plan.parallel.pp) == \
            (*degrees, 1)
        groups = list(plan.groups())
        assert {(g.tp, g.cp) for g in groups} == {degrees[:2]}
        assert sorted(r for g in groups for r in g.ranks) == [0, 1, 2, 3]
        # The batch's documents (Megatron-LM's planner cuts those over its micro-batch
        # budget into pieces; document_lengths folds them back).
        assert sorted(plan.document_lengths().values()) == sorted(LENGTHS)
    # Cut the same way for both layouts: the same sequences, token for token.
    assert plans["tp2_cp2"].sequence_lengths == plans["dp4"].sequence_lengths
    assert {g.cp_kind for g in plans["tp2_cp2"].groups()} == {"ring"}
    assert len(list(plans["tp2_cp2"].groups())) == 1
    assert [g.num_tokens for g in plans["dp4"].groups()] == [424, 424, 424, 401]


def test_bench_runtime_tp2_cp2_vs_dp4(benchmark):
    plans = _plans()
    config = RuntimeConfig(seed=1, warmup_steps=WARMUP, measured_steps=MEASURED)
    # The layouts alternate, ROUNDS times, so a change in the machine's load during the job
    # falls on both rather than on whichever ran second.
    order = [name for _ in range(ROUNDS) for name in plans]
    results = benchmark.pedantic(run_plans, args=([plans[n] for n in order], TINY, config),
                                 rounds=1, iterations=1)
    steps: dict[str, list[float]] = {name: [] for name in plans}
    for name, r in zip(order, results, strict=True):
        times = r.record.extra["measured_step_times_s"]
        assert len(times) == MEASURED and min(times) > 0
        steps[name].extend(times)
    medians = {name: statistics.median(times) for name, times in steps.items()}
    # The same batch and weights: both layouts train to the same loss, every round.
    losses = [r.loss for r in results]
    assert max(losses) - min(losses) <= 1e-6 * abs(losses[0])
    ratio = medians["tp2_cp2"] / medians["dp4"]
    benchmark.extra_info.update(
        steps_per_layout=ROUNDS * MEASURED, rounds=ROUNDS, warmup_steps_per_round=WARMUP,
        tokens=sum(LENGTHS), step_tp2_cp2_s=medians["tp2_cp2"], step_dp4_s=medians["dp4"],
        ratio_tp2_cp2_over_dp4=ratio,
        step_times_tp2_cp2_s=sorted(steps["tp2_cp2"]), step_times_dp4_s=sorted(steps["dp4"]))
    print(f"\nruntime step, median of {ROUNDS * MEASURED} per layout: tp2 cp2 "
          f"{medians['tp2_cp2'] * 1e3:.1f} ms, dp4 {medians['dp4'] * 1e3:.1f} ms, "
          f"ratio {ratio:.2f}")
