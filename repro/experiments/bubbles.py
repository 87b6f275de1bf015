"""Pipeline bubble fraction per schedule: the simulator against the closed forms.

Under uniform unit costs and free communication, the bubble fraction of a pipeline of p
stages is (p-1)/(m+p-1) for 1F1B with m micro-batches, (p-1)/(v*m+p-1) for interleaved 1F1B
with v model chunks (Narayanan et al., SC'21), and (p-1)/(v*n*m+p-1) for SlimPipe's slice-level
1F1B with n slices per micro-batch (SlimPipe arXiv 2504.14519). The simulator prices these
hand-checkable plans (``slimpack.sim.uniform_plan`` + ``UniformCostModel``) and must reproduce
the formulas exactly (docs/cost-model.md); the figure shows how slicing shrinks the bubble.
Interleaved points need m to be a multiple of p (Megatron-LM's own requirement; for m < p the
interleaved schedule degenerates and its formula does not apply).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns

from repro.analysis import scalar
from repro.experiment import Check, Claim, Experiment, Point, Row
from repro.figures import new_figure, placeholder, save

MODEL = "llama-7b"  # 32 layers: every (pp, vpp) below divides it
SCHEDULES = (  # (label, schedule, vpp, slices)
    ("1f1b", "1f1b", 1, 1),
    ("interleaved-v2", "interleaved", 2, 1),
    ("slimpipe-n4", "slimpipe", 1, 4),
    ("slimpipe-n8-v2", "slimpipe", 2, 8),
)
PP_SIZES = (4, 8)
MICROBATCHES = (1, 2, 4, 8, 16)
QUICK_MICROBATCHES = (1, 4, 8)
SOURCE = "Narayanan et al. SC'21; SlimPipe arXiv 2504.14519"


def closed_form(*, pp: int, microbatches: int, vpp: int, slices: int) -> float:
    return (pp - 1) / (vpp * slices * microbatches + pp - 1)


def points(quick: bool) -> list[Point]:
    ms = QUICK_MICROBATCHES if quick else MICROBATCHES
    return [{"model": MODEL, "label": label, "schedule": schedule, "vpp": vpp, "slices": slices,
             "pp": pp, "microbatches": m}
            for label, schedule, vpp, slices in SCHEDULES for pp in PP_SIZES for m in ms
            if schedule != "interleaved" or m % pp == 0]


def run_point(point: Point) -> list[Row]:
    from slimpack import sim
    from slimpack.specs import hardware_preset, model_preset

    model = model_preset(point["model"])
    plan = sim.uniform_plan(schedule=point["schedule"], pp=point["pp"],
                            microbatches=point["microbatches"], vpp=point["vpp"],
                            slices=point["slices"], model=model.name)
    hardware = hardware_preset("h100-80g")
    record = sim.simulate(plan, model=model, hardware=hardware,
                          cost=sim.UniformCostModel(model=model, hardware=hardware)).record
    formula = closed_form(pp=point["pp"], microbatches=point["microbatches"], vpp=point["vpp"],
                          slices=point["slices"])
    return [{"bubble_fraction": record.bubble_fraction, "bubble_formula": formula,
             "abs_error": abs(record.bubble_fraction - formula),
             "step_time_s": record.step_time_s}]


def plot(records: pd.DataFrame, out_dir: Path) -> list[Path]:
    if records.empty:
        return [placeholder(out_dir, "bubbles.png", "no records: run bubbles")]
    pps = sorted(records["pp"].unique())
    fig, axes = new_figure(len(pps), width=4.8, sharey=True)
    for ax, pp in zip(axes[0], pps, strict=True):
        frame = records[records["pp"] == pp]
        labels = [label for label, *_ in SCHEDULES]
        sns.lineplot(frame, x="microbatches", y="bubble_formula", hue="label", hue_order=labels,
                     ax=ax, legend=pp == pps[0], linestyle="--", alpha=0.6)
        sns.scatterplot(frame, x="microbatches", y="bubble_fraction", hue="label",
                        hue_order=labels, ax=ax, legend=False, s=40)
        ax.set_xscale("log", base=2)
        ax.set_title(f"pp = {pp} (markers: simulated, dashes: formula)", fontsize=9)
        ax.set_xlabel("micro-batches m")
        ax.set_ylabel("bubble fraction")
    return [save(fig, out_dir, "bubbles.png")]


def claims(records: pd.DataFrame) -> list[Claim]:
    def at(label: str) -> float:
        if records.empty:
            return float("nan")
        frame = records[(records["label"] == label) & (records["pp"] == 8)
                        & (records["microbatches"] == 8)]
        return scalar(frame, "bubble_fraction")

    return [
        Claim(claim_id="closed-form-exact", text="Simulated bubble fraction vs closed forms, "
              "largest absolute error over the sweep", source=SOURCE,
              paper_value="(p-1)/(v*n*m+p-1), exact", reproduced=scalar(records, "abs_error", "max"),
              unit="", check=Check(kind="at_most", target=1e-9, reason=(
                  "the simulator against closed forms on uniform costs: only float rounding")),
              hardware="uniform-cost", kind="consistency"),
        Claim(claim_id="1f1b-p8-m8", text="1F1B bubble fraction, p 8, m 8", source=SOURCE,
              paper_value="7/15 = 0.467", reproduced=at("1f1b"), unit="",
              check=Check(kind="within", target=7 / 15, rel_tol=1e-6, reason=(
                  "a closed form on uniform costs: only float rounding")),
              hardware="uniform-cost", kind="consistency"),
        Claim(claim_id="slimpipe-p8-m8", text="SlimPipe bubble fraction, p 8, m 8, 8 slices, v 2",
              source=SOURCE, paper_value="7/135 = 0.052", reproduced=at("slimpipe-n8-v2"), unit="",
              check=Check(kind="within", target=7 / 135, rel_tol=1e-6, reason=(
                  "a closed form on uniform costs: only float rounding")),
              hardware="uniform-cost", kind="consistency"),
    ]


EXPERIMENT = Experiment(
    name="bubbles",
    description=("Bubble fraction of 1F1B, interleaved 1F1B and SlimPipe's slice-level 1F1B on "
                 "uniform workloads: the simulator (markers) against the closed forms (dashes)."),
    points=points, run_point=run_point, plot=plot, claims=claims, needs=("slimpack.sim",),
)
