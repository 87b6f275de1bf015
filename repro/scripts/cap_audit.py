"""Whether a capped layout search missed its method's best layout (issue 24, equal search budgets).

The harness searches every method exhaustively but SlimPack on the 512-sample batches
(e2e-throughput, paper-scale, batch-size's largest point), which gets its best-estimated
layouts only (``MethodSpec.search_layouts``) and the winners', and says in
``search_gain_bound`` how much faster a layout it did not simulate could be at most: a
certificate that is loose, because the step lower bound ignores bubbles, communication and
kernel fragmentation. This audit runs the search the
capped record skipped: for each point of the committed records of ``--experiment``
(e2e-throughput or paper-scale; best-layout protocol, the 512-sample batch), the method's
exhaustive, bound-pruned search (``slimpack.compare.best_parallel`` with no cap, harness
options: no wall clock) and the record's step beside its answer. A ratio below 1 is a layout
the harness's cap missed.

    python -m repro.scripts.cap_audit --methods slimpack slimpipe [--out audit.csv]
    python -m repro.scripts.cap_audit --experiment paper-scale --methods slimpipe

Each point plans and simulates every layout the bound does not prune (SlimPack: ~50 per point
at 128 GPUs), minutes per point on a 2-core machine (paper-scale: SlimPipe's 60 layouts about
7 minutes, SlimPack's an hour); ``--points`` picks a subset by index.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
from tqdm import tqdm

from repro.experiments.common import with_harness_options
from repro.scripts.search_points import EXPERIMENTS, method_row
from slimpack.compare import best_parallel, paper_recipe_costs
from slimpack.cost.kernel_model import default_cost_model
from slimpack.specs import hardware_preset, model_preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="e2e-throughput",
                        help="whose best-layout records to re-search (default e2e-throughput)")
    parser.add_argument("--records", default=None,
                        help="records CSV (default: the experiment's committed records)")
    parser.add_argument("--methods", nargs="+", default=["slimpack", "slimpipe"])
    parser.add_argument("--points", nargs="*", type=int, default=None,
                        help="indices of the (model, dataset, workload) points to audit")
    parser.add_argument("--out", default=None, help="also write the table as CSV here")
    args = parser.parse_args()
    experiment = EXPERIMENTS[args.experiment]
    hardware = hardware_preset(experiment.hardware)
    points = experiment.points(args.records)
    chosen = range(len(points)) if args.points is None else args.points
    rows = []
    for index in tqdm(chosen, desc="points", unit="point"):
        (model_name, dataset, workload), frame = points[index]
        model = model_preset(model_name)
        batch = experiment.batch(model_name, dataset, workload)
        recipe = paper_recipe_costs(args.methods, model, hardware)
        for method in args.methods:
            row = method_row(frame, method)
            if row is None:
                continue
            cost = recipe.get(method, default_cost_model(model, hardware))
            options = with_harness_options((method,), None)[method]
            started = time.perf_counter()
            found = best_parallel(method, batch, model, hardware, experiment.gpus, cost,
                                  context=experiment.context, top_k=None, **options)
            recorded = float(row["step_time_s"])
            rows.append({
                "experiment": experiment.name, "point": index, "model": model_name,
                "dataset": dataset, "workload": workload,
                "method": method, "record_layout": row["parallel"],
                "record_step_s": recorded,
                "record_layouts_simulated": int(row["layouts_simulated"]),
                "record_gain_bound": float(row["search_gain_bound"]),
                "exhaustive_layout": found.parallel.describe(),
                "exhaustive_step_s": found.record.step_time_s,
                "exhaustive_simulated": found.simulated, "exhaustive_pruned": found.pruned,
                "exhaustive_over_record": found.record.step_time_s / recorded,
                "seconds": time.perf_counter() - started})
            tqdm.write(f"{model_name}, {dataset}, {workload}, {method}: record {recorded:.3f} s "
                       f"({rows[-1]['record_layouts_simulated']} layouts), exhaustive "
                       f"{found.record.step_time_s:.3f} s at {found.parallel.describe()} "
                       f"({found.simulated} simulated, {found.pruned} pruned), "
                       f"{rows[-1]['seconds']:.0f} s")
    table = pd.DataFrame(rows)
    if args.out:
        table.to_csv(args.out, index=False)
    if not table.empty:
        missed = table[table["exhaustive_over_record"] < 1.0]
        print(f"{len(missed)} of {len(table)} capped searches missed a faster layout"
              + (f"; at most {1 / missed['exhaustive_over_record'].min():.4f}x faster"
                 if len(missed) else ""))


if __name__ == "__main__":
    main()
