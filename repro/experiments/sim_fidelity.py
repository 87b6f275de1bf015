"""Simulator fidelity: simulated vs measured step time and peak memory of the same plans.

Runs only on the runtime backend (``python -m repro run sim-fidelity --backend runtime``, or
``make reproduce-gpu``): each point plans a small batch, executes the plan with the PyTorch
runtime (CUDA when visible, else CPU/gloo) and simulates the same plan; the records hold both.
The SlimPack paper reports a 1.6% peak-memory MAPE for its simulator. On CPU the hardware
presets do not describe the machine, so only CUDA rows enter the claims. The simulator prices
the plan as the runtime runs it (``slimpack.runtime.capabilities.as_run_training("bf16")``: the
runtime keeps bf16 gradients and takes no optimizer step), so both sides hold the same model
states; the kernels it prices are still Megatron-LM's (docs/architecture.md, the GPU check).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.analysis import scalar, select
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.experiments.common import (
    SLIMPACK_SOURCE,
    TIMING_COLUMNS,
    draw_batch,
    flatten,
    with_harness_options,
)
from repro.figures import new_figure, placeholder, save

HARDWARE = "h200-141g"
DATASET, CONTEXT = "commoncrawl", 4096
MODEL_BY_DEVICE = {"cuda": "llama3.2-1b", "cpu": "small"}
"""On a GPU, Llama 3.2 1B shapes: with the hidden size of 256 of ``small`` an H200 step is
kernel-launch-bound (measured: 0.25-4.2 s against 12-86 ms simulated), which says nothing
about the simulator; at 1.2B parameters the GEMMs and attention kernels are the step. On a
CPU, ``small``, so that the sweep finishes."""
METHODS = ("megatron", "wlb-llm", "slimpack")
RUNTIME_OPTIONS = {"slimpack": {"attention_redistribution": False}}
"""Chosen when the runtime refused ``attention_redistribution`` at pp > 1 (it now executes it
on every layout but Ulysses CP, docs/architecture.md, the runtime), kept so the records stay
comparable: SlimPack keeps its attention where its slice is here, and the simulator prices the
same plan. Its LM head is spread over the pipeline ranks as SlimPack plans it by default
(``vocab_parallel_pp``, executed by the runtime)."""
BATCHES, QUICK_BATCHES = (16, 32, 64), (16,)
MEASURED = ("step_time_s", "peak_memory_gib")


def points(quick: bool) -> list[Point]:
    import torch

    model = MODEL_BY_DEVICE["cuda" if torch.cuda.is_available() else "cpu"]
    return [{"model": model, "dataset": DATASET, "context": CONTEXT, "global_batch": gb,
             "seed": 0, "hardware": HARDWARE, "method": method}
            for gb in (QUICK_BATCHES if quick else BATCHES) for method in METHODS]


def run_point(point: Point) -> list[Row]:
    import torch

    from slimpack import compare as cmp
    from slimpack import sim
    from slimpack.cost.kernel_model import default_cost_model
    from slimpack.runtime import config as config_mod
    from slimpack.runtime import launch
    from slimpack.runtime.capabilities import as_run_training
    from slimpack.specs import ParallelSpec, hardware_preset, model_preset

    cuda = torch.cuda.is_available()
    # Under torchrun the plan spans every rank of every node; otherwise this node's devices.
    gpus = int(os.environ.get("WORLD_SIZE", torch.cuda.device_count() if cuda else 2))
    model, hardware = model_preset(point["model"]), hardware_preset(point["hardware"])
    parallel = ParallelSpec(pp=2 if gpus >= 2 else 1, dp=max(1, gpus // 2) if gpus >= 2 else 1)
    cost = default_cost_model(model, hardware)
    batch = draw_batch(point, "sim-fidelity")
    options = with_harness_options((point["method"],), RUNTIME_OPTIONS)[point["method"]]
    plan = cmp.plan_method(point["method"], batch, model, hardware, parallel, cost,
                           context=point["context"], **options)
    # Simulated as the runtime executes it: no optimizer state or step, gradients in the
    # parameters' dtype (the plan itself is the one the default recipe chose).
    as_run = default_cost_model(model, hardware, as_run_training("bf16"))
    simulated = sim.simulate(plan, model=model, hardware=hardware, cost=as_run).record
    config = config_mod.RuntimeConfig(device="cuda" if cuda else "cpu",
                                      dtype="bf16" if cuda else "fp32",
                                      dist_backend="nccl" if cuda else "gloo", warmup_steps=1,
                                      record_ops=False)
    result = launch.run_plan(plan, model, config, hardware=hardware if cuda else None)
    if result is None:  # a non-zero torchrun rank: rank 0 holds the measurement
        return []
    measured = result.record
    row = {"device": "cuda" if cuda else "cpu", "num_gpus": parallel.world,
           "parallel": flatten({"p": parallel.to_dict()})["p"]}
    for name in MEASURED:
        sim_value, real_value = getattr(simulated, name), getattr(measured, name)
        row[f"sim_{name}"] = sim_value
        row[f"measured_{name}"] = real_value
        row[f"error_pct_{name}"] = 100 * abs(sim_value - real_value) / real_value if real_value else None
    return [row]


def plot(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "fidelity.png", "no runtime records yet:\n"
                            "python -m repro run sim-fidelity --backend runtime")]
    fig, axes = new_figure(2, width=4.6)
    for ax, name in zip(axes[0], MEASURED, strict=True):
        sns.scatterplot(records, x=f"measured_{name}", y=f"sim_{name}", hue="method",
                        style="device", ax=ax)
        lo = min(records[f"measured_{name}"].min(), records[f"sim_{name}"].min())
        hi = max(records[f"measured_{name}"].max(), records[f"sim_{name}"].max())
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
        ax.set_title(name, fontsize=9)
    return [save(fig, out_dir, "fidelity.png")]


def memory_analysis(cuda: pd.DataFrame) -> str:
    """Per method, how the measured peak departs from the simulated one over the batch sizes:
    a constant the simulator does not count (the measured peak does not move with the batch),
    or a different growth with the batch (measured over simulated slope, smallest to largest
    batch)."""
    needed = {"method", "global_batch", "measured_peak_memory_gib", "sim_peak_memory_gib"}
    if cuda.empty or not needed <= set(cuda.columns):
        return ""

    def span(values: pd.Series) -> str:
        low, high = f"{values.min():.1f}", f"{values.max():.1f}"
        return low if low == high else f"{low}-{high}"

    parts = []
    for method, rows in cuda.groupby("method", sort=False):
        rows = rows.sort_values("global_batch")
        measured, simulated = rows["measured_peak_memory_gib"], rows["sim_peak_memory_gib"]
        batches = f"{int(rows['global_batch'].iloc[0])}-{int(rows['global_batch'].iloc[-1])}"
        if len(rows) > 1 and measured.max() - measured.min() <= 0.02 * measured.max():
            parts.append(f"{method} measures {span(measured)} GiB at every batch ({batches} "
                         f"samples) against {span(simulated)} simulated: "
                         f"{(measured - simulated).mean():.1f} "
                         "GiB that do not grow with the batch, which the simulator does not "
                         "count")
        elif len(rows) > 1 and simulated.iloc[-1] != simulated.iloc[0]:
            growth = ((measured.iloc[-1] - measured.iloc[0])
                      / (simulated.iloc[-1] - simulated.iloc[0]))
            parts.append(f"{method} grows {measured.iloc[0]:.1f} -> {measured.iloc[-1]:.1f} GiB "
                         f"over {batches} samples against {simulated.iloc[0]:.1f} -> "
                         f"{simulated.iloc[-1]:.1f} simulated: the measured peak grows "
                         f"{growth:.2f}x as fast with the batch as the simulated one")
        else:
            parts.append(f"{method} measures {measured.mean():.1f} GiB against "
                         f"{simulated.mean():.1f} simulated")
    return "Over the CUDA records: " + "; ".join(parts) + "."


def claims(records: pd.DataFrame) -> list[Claim]:
    cuda = select(records, device="cuda")
    return [
        Claim(claim_id="memory-mape", text="Simulator peak-memory error (MAPE), CUDA runs",
              source=SLIMPACK_SOURCE, paper_value="1.6%",
              reproduced=scalar(cuda, "error_pct_peak_memory_gib"), unit="%",
              check=Check(kind="at_most", target=5.0, reason=(
                  "the paper's 1.6% is on its own GPUs and allocator; ours are on one H200, "
                  "so 5% is allowed")), hardware=HARDWARE, golden_rel_tol=None,
              analysis=memory_analysis(cuda)),
        Claim(claim_id="step-time-mape", text="Simulator step-time error (MAPE), CUDA runs",
              source=SLIMPACK_SOURCE, paper_value="(not stated; ours for reference)",
              reproduced=scalar(cuda, "error_pct_step_time_s"), unit="%",
              check=Check(kind="at_most", target=20.0, reason=(
                  "no published number: 20% is the suite's own bar for a simulator that ranks "
                  "methods")), hardware=HARDWARE, golden_rel_tol=None, kind="consistency"),
    ]


EXPERIMENT = Experiment(
    name="sim-fidelity",
    description=("Simulated vs measured step time and peak memory of the same small plans, "
                 "from runtime-backend records (`--backend runtime`); empty until a runtime "
                 "sweep has run."),
    points=points, run_point=run_point, plot=plot, claims=claims, backends=("runtime",),
    needs=("slimpack.runtime", "slimpack.sim", "slimpack.compare"), timing_columns=TIMING_COLUMNS,
)
