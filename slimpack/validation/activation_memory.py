"""Simulated against executed activation memory, per rank: the runtime's tracked peak of
activations (saved tensors, K/V caches, dK/dV accumulators, and the logits block of an LM
head spread over the pipeline ranks while it runs; model state excluded,
``extra["rank_peak_activation_bytes"]``) beside the simulator's memory walk of the same plan
told the runtime's dtype and attention path (:class:`ActivationAccounting` ``runtime``), its
model states subtracted likewise.

    python -m slimpack.validation.activation_memory      # regenerates the table in
                                                         # docs/architecture.md (runtime)

It plans every registered method at a CPU-sized setting (:data:`SETTING`; the same calls
as ``slimpack plan`` with :meth:`Setting.plan_args`) and runs the plans the runtime accepts
in 8 local gloo processes (one spawned job), so it sits in the validation layer, above the
planners, the simulator and the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slimpack.cost.memory import GPU_BF16, ActivationAccounting
from slimpack.plan import Plan
from slimpack.records import StepRecord
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.validate import check_runtime_plan
from slimpack.schedules import build_schedule
from slimpack.sim.costs import group_layers
from slimpack.sim.memory import group_memory, peak_bytes_by_stage
from slimpack.specs.model import ModelSpec

MIB = 2**20
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True, kw_only=True)
class Setting:
    """The CPU-sized workload every method is planned and run at."""

    model: str = "tiny"
    hardware: str = "h100-80g"
    gpus: int = 8
    dataset: str = "wikipedia"
    context: int = 512
    token_budget: int = 4096
    seed: int = 0
    layouts: dict[str, dict[str, int]] = field(default_factory=lambda: {
        "reference": {"dp": 8}, "naive": {"pp": 2}, "megatron": {"tp": 2, "pp": 2},
        "megatron-causal": {"pp": 4}, "megatron-dcp": {"cp": 4}, "wlb-llm": {"cp": 2, "pp": 2},
        "flexsp": {"dp": 8}, "ulysses-static": {"dp": 8}, "ulysses-adaptive": {"dp": 8},
        "slimpipe": {"pp": 2}, "slimpack": {"pp": 2}})
    """Explicit degrees per method (each accepts its own); dp is what the world leaves."""
    options: dict[str, dict[str, object]] = field(default_factory=lambda: {
        # Without SlimPipe's redistribution, as when the runtime refused it at pp > 1 (the
        # table's plans stay the same; at this setting it would keep no move anyway);
        # 128-token slices so the batch is sliced at all.
        "slimpack": {"attention_redistribution": False, "slice_tokens": 128}})

    def plan_args(self, method: str, output: str) -> list[str]:
        """The ``slimpack plan`` command line that writes ``method``'s plan to ``output``."""
        degrees = [x for k, v in self.layouts[method].items() if k != "dp"
                   for x in (f"--{k}", str(v))] or ["--dp", str(self.gpus)]
        options = [x for k, v in self.options.get(method, {}).items()
                   for x in ("--option", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]
        return ["plan", "--method", method, "--model", self.model, "--hardware", self.hardware,
                "--gpus", str(self.gpus), *degrees, *options, "--dataset", self.dataset,
                "--context", str(self.context), "--token-budget", str(self.token_budget),
                "--seed", str(self.seed), "-o", output]

    def plan(self, method: str) -> Plan:
        """What ``slimpack plan`` with :meth:`plan_args` writes (the same calls)."""
        from slimpack.compare import plan_method
        from slimpack.cost.kernel_model import default_cost_model
        from slimpack.data import sample_batch
        from slimpack.specs import ParallelSpec, hardware_preset, model_preset

        model, hardware = model_preset(self.model), hardware_preset(self.hardware)
        degrees = {k: v for k, v in self.layouts[method].items() if k != "dp"}
        parallel = ParallelSpec.for_world(self.gpus, **degrees)
        batch = sample_batch(self.dataset, token_budget=self.token_budget,
                             context=self.context, seed=self.seed, truncation="split")
        return plan_method(method, batch, model, hardware, parallel,
                           default_cost_model(model, hardware), context=self.context,
                           **self.options.get(method, {}))


SETTING = Setting()


@dataclass(frozen=True, kw_only=True)
class RankActivation:
    rank: int
    stage: int
    simulated_bytes: float
    executed_bytes: float

    @property
    def error(self) -> float:
        """(simulated - executed) / executed."""
        return (self.simulated_bytes - self.executed_bytes) / self.executed_bytes


def accounting_for(config: RuntimeConfig, attention_backend: str) -> ActivationAccounting:
    """The simulator's accounting for a run under ``config`` with ``attention_backend``
    (the record's ``extra["attention_backend"]``); only per-document SDPA is modelled."""
    if attention_backend != "sdpa":
        raise ValueError(f"activation comparison models the runtime's 'sdpa' attention "
                         f"backend, the run used {attention_backend!r}")
    return ActivationAccounting(saved="runtime", bytes_per_element=DTYPE_BYTES[config.dtype])


def simulated_rank_activation_bytes(plan: Plan, spec: ModelSpec,
                                    accounting: ActivationAccounting,
                                    head_joins: Mapping[int, list[list[tuple[int, int]]]]
                                    | None = None) -> dict[int, float]:
    """Per rank, the memory walk's peak minus its model states, the largest over the plan's
    phases (a rank keeps its stage in every group it joins). ``head_joins``: by group id,
    where each stage joins a spread LM head (``RuntimePlan.head_joins``); absent: the
    simulator's placement (:func:`~slimpack.sim.memory.peak_bytes_by_stage`)."""
    out: dict[int, float] = {}
    for group in plan.groups():
        layers = group_layers(group, spec.num_layers)
        ops = build_schedule(group)
        per_stage = len(group.ranks) // group.pp
        for cp_index in range(group.cp):  # ring CP ranks hold different rows
            memory = group_memory(group, model=spec, dp=plan.parallel.dp, accounting=accounting,
                                  cp_index=cp_index if group.cp > 1 else None)
            peaks = peak_bytes_by_stage(ops, memory, layers,
                                        head_joins=(head_joins or {}).get(group.group_id))
            for i, rank in enumerate(group.ranks):
                stage, lane = divmod(i, per_stage)  # ranks ordered (pp, cp, tp)
                if lane // group.tp != cp_index:
                    continue
                activations = peaks[stage] - memory.model_state_bytes[stage]
                out[rank] = max(out.get(rank, 0.0), activations)
    return out


def compare_ranks(plan: Plan, spec: ModelSpec, record: StepRecord,
                  config: RuntimeConfig) -> list[RankActivation]:
    """Every rank holding a stage: simulated beside executed activation peak bytes."""
    rplan = check_runtime_plan(plan, spec, world_size=plan.world_size)
    accounting = accounting_for(config, record.extra["attention_backend"])
    simulated = simulated_rank_activation_bytes(plan, spec, accounting, rplan.head_joins)
    executed = record.extra["rank_peak_activation_bytes"]
    return [RankActivation(rank=r, stage=rplan.stage_of_rank[r], simulated_bytes=simulated[r],
                           executed_bytes=executed[r])
            for r in sorted(simulated) if executed[r] > 0]


def layout_text(plan: Plan) -> str:
    """e.g. ``tp2 pp2 dp2``, plus the cp degrees the groups use where they differ and
    whether the LM head is spread over the pipeline ranks."""
    par = plan.parallel
    parts = [f"{k}{v}" for k, v in (("tp", par.tp), ("cp", par.cp), ("pp", par.pp),
                                    ("vpp", par.vpp), ("dp", par.dp)) if v > 1]
    cps = sorted({g.cp for g in plan.groups()})
    kinds = sorted({g.cp_kind for g in plan.groups() if g.cp > 1})
    if cps != [par.cp]:
        parts.append("group cp " + "/".join(map(str, cps)))
    if kinds:
        parts.append(",".join(kinds))
    if any(g.vocab_parallel_pp and g.pp > 1 for g in plan.groups()):
        parts.append("head over pp")
    return " ".join(parts) or "1"


def default_accounting_error(plan: Plan, spec: ModelSpec, record: StepRecord) -> float:
    """The largest per-rank relative error of the simulator's default (bf16 GPU) accounting
    against the same executed activation peaks: what telling it the runtime's dtype and
    attention path changes."""
    simulated = simulated_rank_activation_bytes(plan, spec, GPU_BF16)
    executed = record.extra["rank_peak_activation_bytes"]
    errors = [(simulated[r] - executed[r]) / executed[r] for r in simulated if executed[r] > 0]
    return max(errors, key=abs)


def table_rows(method: str, plan: Plan, rows: list[RankActivation],
               default_error: float) -> str:
    sim = " ".join(f"{r.simulated_bytes / MIB:.2f}" for r in rows)
    exe = " ".join(f"{r.executed_bytes / MIB:.2f}" for r in rows)
    worst = max(rows, key=lambda r: abs(r.error))
    options = SETTING.options.get(method, {})
    note = f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""
    return (f"| {method}{note} | {layout_text(plan)} | {sim} | {exe} | "
            f"{worst.error:+.1e} (rank {worst.rank}) | {default_error * 100:+.0f}% |")


TABLE_HEADER = ("| method | layout | simulated MiB per rank | executed MiB per rank | "
                "max rel. error | default accounting's max error |\n|---|---|---|---|---|---|")


def main() -> int:
    """Print the table (its parts: tests/test_runtime_all_methods.py)."""
    from slimpack.methods import method_names
    from slimpack.runtime.many import run_plans
    from slimpack.specs import model_preset

    spec = model_preset(SETTING.model)
    config = RuntimeConfig(seed=0)
    plans, refused = {}, {}
    for method in method_names():
        plan = SETTING.plan(method)
        try:
            check_runtime_plan(plan, spec, world_size=SETTING.gpus)
            plans[method] = plan
        except ValueError as err:
            refused[method] = str(err)
    results = run_plans(list(plans.values()), spec, config, timeout_s=600)
    print(TABLE_HEADER)
    for (method, plan), result in zip(plans.items(), results, strict=True):
        print(table_rows(method, plan, compare_ranks(plan, spec, result.record, config),
                         default_accounting_error(plan, spec, result.record)))
    for method, reason in refused.items():
        print(f"| {method} | refused | | | {reason} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
