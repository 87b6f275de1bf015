"""The runtime's step for a fixed 4-rank plan at tp2 x cp2 against the same batch at
tp1 cp1 dp4 (issue 23): ``make bench`` reports both measured step times (medians of the
runtime's own steps, on CPU gloo) and their ratio in ``extra_info``; with --benchmark-disable
it runs once as a plain test of the same path.

On 2 CPU cores the ratio measures collective overhead on a tiny model, not a GPU's: 4
processes share 2 cores, and every tp/cp collective is a gloo round trip.
"""

from __future__ import annotations

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.many import run_plans
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

TINY = model_preset("tiny")
H100 = hardware_preset("h100-80g")
LENGTHS = (600, 300, 40, 17, 90, 5, 120, 60, 8, 33, 150, 250)


def _plans():
    cost = default_cost_model(TINY, H100)
    batch = Batch.from_lengths(LENGTHS)
    return [plan_method("megatron", batch, TINY, H100, ParallelSpec(**layout), cost,
                        context=640)
            for layout in (dict(tp=2, cp=2), dict(dp=4))]


def test_bench_runtime_tp2_cp2_vs_dp4(benchmark):
    plans = _plans()
    assert [(p.parallel.tp, p.parallel.cp, p.parallel.dp) for p in plans] == [(2, 2, 1),
                                                                              (1, 1, 4)]
    config = RuntimeConfig(seed=1, warmup_steps=1, measured_steps=3)
    results = benchmark.pedantic(run_plans, args=(plans, TINY, config), rounds=1,
                                 iterations=1)
    steps = [r.record.step_time_s for r in results]
    assert all(s > 0 for s in steps)
    # The same batch and weights: both layouts train to the same loss.
    assert abs(results[0].loss - results[1].loss) <= 1e-6 * abs(results[1].loss)
    benchmark.extra_info.update(step_tp2_cp2_s=steps[0], step_dp4_s=steps[1],
                                ratio_tp2_cp2_over_dp4=steps[0] / steps[1])
