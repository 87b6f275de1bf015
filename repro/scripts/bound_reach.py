"""How far the layout search's lower bound reaches (issue 24, equal search budgets).

For each e2e-throughput point of the committed records (best-layout protocol, the 512-sample
batch), counts the memory-feasible layouts of a method whose step lower bound
(``slimpack.compare.step_lower_bound`` over ``bound_lengths``) is below the method's recorded
best step: the layouts an exhaustive, bound-pruned search would have to plan and simulate at
the least (it prunes against the best found so far, which is never better than the final
best). Beside it: the candidates, the layouts the record simulated and its planning seconds.

    python -m repro.scripts.bound_reach --methods slimpack megatron
"""

from __future__ import annotations

import argparse

from repro.scripts.search_points import EXPERIMENTS, method_row
from slimpack.compare import bound_lengths, method_candidates, step_lower_bound
from slimpack.cost.kernel_model import default_cost_model
from slimpack.methods import DEFAULT_METHODS
from slimpack.specs import hardware_preset, model_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="e2e-throughput",
                        help="whose best-layout records to read (default e2e-throughput)")
    parser.add_argument("--records", default=None,
                        help="records CSV (default: the experiment's committed records)")
    parser.add_argument("--methods", nargs="+", default=["slimpack", "megatron"])
    args = parser.parse_args()
    experiment = EXPERIMENTS[args.experiment]
    hardware = hardware_preset(experiment.hardware)
    print("model, dataset, workload, method: layouts the bound leaves / candidates "
          "(simulated in the record, its plan seconds)")
    for (model_name, dataset, workload), rows in experiment.points(args.records):
        model = model_preset(model_name)
        cost = default_cost_model(model, hardware)
        batch = experiment.batch(model_name, dataset, workload)
        for method in args.methods:
            row = method_row(rows, method)
            if row is None:
                continue
            best = float(row["step_time_s"])
            candidates = method_candidates(method, model, hardware, experiment.gpus,
                                           experiment.context)
            spec = DEFAULT_METHODS.get(method)
            lengths = bound_lengths(spec, batch, experiment.context)
            bounds: dict[tuple, float] = {}
            left = 0
            for cand in candidates:
                key = (cand.parallel.tp, cand.parallel.cp, cand.parallel.pp, cand.parallel.dp)
                if key not in bounds:
                    bounds[key] = step_lower_bound(cost, lengths, cand.parallel,
                                                   ring_cp=spec.ring_cp_at_layout_degree)
                left += bounds[key] < best
            print(f"{model_name}, {dataset}, {workload}, {method}: {left} / {len(candidates)} "
                  f"({int(row['layouts_simulated'])} simulated, {row['plan_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
