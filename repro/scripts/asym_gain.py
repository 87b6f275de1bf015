"""Same-batch gain of SlimPack's asymmetric MicroPacks, and why (issue 13, item 4).

Runs SlimPack with and without ``no_asymmetric`` (DP-aware phase 1 and DP-Merge off, as in the
ablation's "+asymmetric" step) on the same batches and prints, per batch: throughput gain,
forward and backward unit-time CV (stage 0 of each group, as the simulator prices the units),
and how many forward MicroPacks mix long-sequence and short-document work.

    python -m repro.scripts.asym_gain ablation --seeds 0 1 2 --datasets commoncrawl github
    python -m repro.scripts.asym_gain heavy

``ablation``: the ablation experiment's setting (llama-13b, 256K, 128 H800, tp8 pp4 dp4).
``heavy``: the issue's attention-heavy mix, llama-7b, 8 x 256K documents plus 3,000 short ones
(128-8K tokens, log-uniform; *reconstructed*: the issue does not give their law), 32 H800,
tp8 pp4 dp1. Extra planner options go after ``--opt name=value``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from slimpack import sim
from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.sim.costs import group_costs
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

BASE = {"no_dp_aware": True, "no_dp_merge": True}


def heavy_batch(seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    short = np.exp(rng.uniform(np.log(128), np.log(8192), size=3000)).astype(int)
    return Batch.from_lengths([256 * 1024] * 8 + [int(x) for x in short])


def unit_stats(plan, model, cost, hardware) -> dict[str, float]:
    fcv, bcv, mixed, units, busiest = [], [], 0, 0, 0.0
    for group in plan.groups():
        costs = group_costs(group, model=model, cost=cost, gpus_per_node=hardware.gpus_per_node)
        # The busiest stage's compute: no schedule can end the step before it does.
        # Plus the fill and drain any 1F1B-like schedule pays: (p-1) mean forward+backward.
        fill = (group.pp - 1) * (statistics.fmean(costs.fwd_s[0]) + statistics.fmean(costs.bwd_s[0]))
        busiest = max(busiest, fill + max(sum(f) + sum(b) for f, b in zip(
            costs.fwd_s, costs.bwd_s, strict=True)))
        for times, out in ((costs.fwd_s[0], fcv), (costs.bwd_s[0], bcv)):
            if len(times) > 1:
                out.append(statistics.pstdev(times) / statistics.fmean(times))
        lengths = plan.sequence_lengths
        limit = int(plan.metadata["slimpack"].get("slice_tokens") or 0)
        for unit in group.forward_units:
            units += 1
            segs = [seg for sl in group.unit_slices(unit) for seg in sl.segments]
            long_ = limit and any(lengths[s.seq_id] > limit for s in segs)
            short_ = limit and any(lengths[s.seq_id] <= limit for s in segs)
            mixed += long_ and short_
    return {"busiest_s": busiest, "fwd_cv": statistics.fmean(fcv) if fcv else 0.0,
            "bwd_cv": statistics.fmean(bcv) if bcv else 0.0, "mixed": mixed, "units": units,
            "asym_groups": sum(g.is_asymmetric for g in plan.groups())}


def run(batch: Batch, model_name: str, gpus: int, options: dict) -> list[dict]:
    model, hardware = model_preset(model_name), hardware_preset("h800-80g")
    parallel = ParallelSpec.for_world(gpus, tp=8, pp=4)
    cost = default_cost_model(model, hardware)
    rows = []
    for asym in (False, True):
        opts = {**BASE, **options, "no_asymmetric": not asym}
        t0 = time.perf_counter()
        plan = plan_method("slimpack", batch, model, hardware, parallel, cost, **opts)
        plan_s = time.perf_counter() - t0
        record = sim.simulate(plan, model=model, hardware=hardware, cost=cost).record
        rows.append({"asym": asym, "tokens_per_s": record.tokens_per_s, "plan_s": plan_s,
                     "bubble": record.bubble_fraction, "step_s": record.step_time_s,
                     "over_ideal": record.step_over_ideal,
                     "S": plan.metadata["slimpack"].get("slice_tokens"),
                     **unit_stats(plan, model, cost, hardware)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("setting", choices=("ablation", "heavy"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--datasets", nargs="+", default=["commoncrawl", "github"])
    ap.add_argument("--opt", nargs="*", default=[], help="planner option name=value (json)")
    args = ap.parse_args()
    import json
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.opt)}
    gains = []
    cases = ([(d, s) for d in args.datasets for s in args.seeds] if args.setting == "ablation"
             else [("heavy", s) for s in args.seeds])
    from slimpack import data
    for dataset, seed in cases:
        if args.setting == "ablation":
            batch = data.sample_batch(dataset, num_sequences=512, context=256 * 1024, seed=seed)
            rows = run(batch, "llama-13b", 128, options)
        else:
            rows = run(heavy_batch(seed), "llama-7b", 32, options)
        gain = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
        gains.append(gain)
        for r in rows:
            print(f"{dataset} seed {seed} asym={r['asym']!s:5} S={r['S']} tok/s={r['tokens_per_s']:.0f} "
                  f"fwdCV={r['fwd_cv']:.3f} bwdCV={r['bwd_cv']:.3f} mixed={r['mixed']}/{r['units']} "
                  f"asym_groups={r['asym_groups']} bubble={r['bubble']:.3f} "
                  f"step/ideal={r['over_ideal']:.3f} "
                  f"step/(busiest+fill)={r['step_s'] / r['busiest_s']:.3f} plan={r['plan_s']:.1f}s",
              flush=True)
        print(f"{dataset} seed {seed} gain {gain:.4f}", flush=True)
    print(f"mean gain {statistics.fmean(gains):.4f} over {len(gains)} batches "
          f"(min {min(gains):.4f}, max {max(gains):.4f})")


if __name__ == "__main__":
    main()
