"""Simulate the published Megatron-LM runs of ``datasets/validation/`` and compare.

Every record with a *measured* number is expressed, where the suite can, as a model
(:class:`ModelSpec`, GeLU MLP for GPT-3 style), a parallel layout, a
:class:`~slimpack.specs.training.TrainingSpec` (fp16/bf16, sequence parallelism, ZeRO stage,
Megatron's unfused attention of 2021-22 with dropout) and a recompute mode; a batch of ``gbs``
sequences of ``seq_len`` tokens is planned with the ``megatron`` planner (``mbs`` sequences per
micro-batch) and simulated with the :class:`~slimpack.cost.kernel_model.KernelCostModel`,
whose constants come from kernel benchmarks only: these runs are never fitted.

The predicted number is converted with the source's own FLOP convention:
Narayanan et al. 2021 count ``96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h))`` FLOPs (recompute
included), Korthikanti et al. 2022 report MFU as ``72*B*s*L*h^2*(1 + s/(6h) + V/(12*h*L))``
over 312 TFLOP/s. The error of a record is its *speed bias*: published time / predicted time
- 1 (positive: the model is too fast); for throughput metrics that is predicted / published
throughput - 1, for a recompute overhead ``(1 + published) / (1 + predicted) - 1``.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slimpack.batch import Batch
from slimpack.cost.kernel_model import KernelCostModel
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec, hardware_preset
from slimpack.specs.training import TrainingSpec

VALIDATION_DIR = Path(__file__).resolve().parents[2] / "datasets" / "validation"
DEFAULT_FILE = VALIDATION_DIR / "megatron_published_a100.json"
METRICS = ("iteration_time", "achieved_tflops_per_gpu", "mfu", "layer_fwd_plus_bwd_time",
           "per_layer_fwd_bwd_overhead_vs_baseline", "model_tflops_per_gpu",
           "tokens_per_sec_per_gpu")
"""Metrics a record is compared on, first measured one wins."""
A100_PEAK = 312e12


def load_records(path: str | Path | None = None) -> list[dict[str, Any]]:
    path = Path(path) if path is not None else DEFAULT_FILE
    if not path.is_file():
        raise ValueError(f"validation records {str(path)!r} do not exist")
    data = json.loads(path.read_text())
    if "records" not in data:
        raise ValueError(f"{str(path)!r} has no 'records' list")
    return list(data["records"])


@dataclass(frozen=True, kw_only=True)
class Case:
    """One expressible record: what to simulate and what to compare."""

    record_id: str
    source: str
    params_b: float
    model: ModelSpec
    hardware: HardwareSpec
    parallel: ParallelSpec
    training: TrainingSpec
    recompute: str
    seq_len: int
    mbs: int
    gbs: int
    metric: str
    published: float
    unit: str
    recompute_layers: int | None = None
    """With ``recompute="full"``: only the first this many layers of each virtual stage
    (Megatron-Core ``recompute_method="block"``, ``recompute_num_layers``)."""


@dataclass(frozen=True, kw_only=True)
class Skipped:
    record_id: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class ValidationRow:
    case: Case
    predicted: float
    bias: float
    """Published time / predicted time - 1 (positive: the model is too fast)."""
    step_time_s: float | None = None
    fits: bool | None = None
    """Whether the simulator's memory walk fits the run in the GPU's usable memory (every
    published run ran, so False is a memory-model error); None for per-layer metrics."""

    def as_dict(self) -> dict[str, Any]:
        c = self.case
        recompute = (c.recompute if c.recompute_layers is None
                     else f"{c.recompute}, {c.recompute_layers} layers per stage")
        return {"record": c.record_id, "source": c.source, "params_b": c.params_b,
                "metric": c.metric, "unit": c.unit, "published": c.published,
                "predicted": self.predicted, "bias_pct": 100 * self.bias,
                "abs_error_pct": 100 * abs(self.bias), "recompute": recompute,
                "sequence_parallel": c.training.sequence_parallel,
                "zero_stage": c.training.zero_stage, "num_gpus": c.parallel.world,
                "hardware": c.hardware.name, "precision": c.training.dtype, "cp": c.parallel.cp,
                "step_time_s": self.step_time_s, "fits": self.fits}


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    rows: list[ValidationRow]
    skipped: list[Skipped]
    measured_records: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_abs_error_pct(self) -> float:
        return 100 * statistics.median(abs(r.bias) for r in self.rows) if self.rows else float("nan")

    def median_bias_pct(self, *, below_b: float | None = None, above_b: float | None = None) -> float:
        sel = [r.bias for r in self.rows
               if (below_b is None or r.case.params_b < below_b)
               and (above_b is None or r.case.params_b > above_b)]
        return 100 * statistics.median(sel) if sel else float("nan")

    @property
    def size_bias_spread_pts(self) -> float:
        return abs(self.median_bias_pct(below_b=10) - self.median_bias_pct(above_b=100))

    @property
    def predicted_not_to_fit(self) -> list[str]:
        """Records that ran but that the simulator's memory walk says do not fit."""
        return [r.case.record_id for r in self.rows if r.fits is False]

    def summary(self) -> dict[str, float]:
        return {"expressible": len(self.rows), "measured_records": self.measured_records,
                "simulated": sum(r.fits is not None for r in self.rows),
                "predicted_not_to_fit": len(self.predicted_not_to_fit),
                "median_abs_error_pct": self.median_abs_error_pct,
                "median_bias_small_pct": self.median_bias_pct(below_b=10),
                "median_bias_large_pct": self.median_bias_pct(above_b=100),
                "size_bias_spread_pts": self.size_bias_spread_pts}


# -- expressing a record ------------------------------------------------------------------------
def _measured(record: dict[str, Any]) -> dict[str, Any] | None:
    by_metric = {m["metric"]: m for m in record.get("measurements", []) if m.get("kind") == "measured"}
    for metric in METRICS:
        if metric in by_metric:
            return by_metric[metric]
    return None


def _recompute(text: str) -> str | None:
    text = text.lower()
    if "microbatch-level" in text:
        return None
    for mode in ("selective", "full", "none"):
        if text.startswith(mode):
            return mode
    return None


def _zero_stage(text: str) -> int | None:
    text = text.lower()
    if "zero-3" in text or "fsdp" in text:
        return 3
    if "zero-1" in text or "distributed optimizer" in text:
        return 1
    if "none" in text or "ddp" in text:
        return 0
    return None


def _dp_overlaps(record: dict[str, Any]) -> bool:
    """Whether the run's data-parallel gradient all-reduce overlapped backward. Megatron-LM
    2021-22 defaults to its ``local`` DDP, which all-reduces after the pipeline flush
    (Korthikanti et al. section 6.3: "no overlap of gradient all-reduce with backprop"); the
    Table 1 script of Narayanan et al. ran PyTorch DDP (bucketed, overlapping the last
    backward) up to the size its record's notes give. DeepSpeed runs keep the default."""
    found = re.search(r"torch for <=\s*([\d.]+)B", record.get("notes", ""))
    if found:
        return float(record["model"].get("params_b", 0.0)) <= float(found.group(1))
    return "deepspeed" in record["parallel"].get("dp_sharding", "").lower()


def express(record: dict[str, Any]) -> Case | Skipped:
    """The record as a :class:`Case`, or why it cannot be expressed."""
    rid = record["id"]
    measured = _measured(record)
    if measured is None:
        return Skipped(record_id=rid, reason="no measured metric the suite predicts")
    recompute = _recompute(record.get("recompute", ""))
    if recompute is None:
        return Skipped(record_id=rid, reason="micro-batch-level checkpointing (some in-flight "
                                             "micro-batches skip recompute) is not modelled")
    m, p = record["model"], record["parallel"]
    if p.get("cp", 1) != 1 or p.get("ep", 1) != 1:
        return Skipped(record_id=rid, reason="context/expert parallelism not in this file's scope")
    if p.get("mbs") is None:
        return Skipped(record_id=rid, reason="micro-batch size not published")
    zero = _zero_stage(p.get("dp_sharding", "none"))
    if zero is None:
        return Skipped(record_id=rid, reason=f"dp sharding {p.get('dp_sharding')!r} unknown")
    arch = m.get("arch", "")
    gpu = record.get("hardware", {}).get("gpu", "")
    hardware = hardware_preset("a100-40g" if "40GB" in gpu and "80GB" not in gpu else "a100-80g")
    model = ModelSpec(name=m.get("name", rid), num_layers=m["layers"], hidden=m["hidden"],
                      ffn_hidden=m["ffn"], num_heads=m["heads"], num_kv_heads=m["kv_heads"],
                      vocab_size=m["vocab"], tied_embeddings="tied" in arch,
                      mlp="gelu" if "gelu" in arch.lower() else "swiglu",
                      rope="rope" in arch.lower())  # GPT-3: learned absolute positions
    parallel = ParallelSpec(tp=p["tp"], pp=p["pp"], dp=p["dp"], vpp=p.get("vpp", 1),
                            gpus_per_node=8)
    if parallel.world != p["num_gpus"]:
        return Skipped(record_id=rid, reason=f"tp*pp*dp = {parallel.world} != num_gpus {p['num_gpus']}")
    training = TrainingSpec(dtype="bf16", sequence_parallel=bool(p.get("sequence_parallel")),
                            zero_stage=zero, attention_kernel="unfused", dropout=True,
                            p2p_blocking=True,  # Megatron-LM 2021-22 / DeepSpeed pipeline p2p
                            dp_overlap=_dp_overlaps(record))
    return Case(record_id=rid, source=record["source"]["work"].split(",")[0],
                params_b=float(m.get("params_b", 0.0)), model=model, hardware=hardware,
                parallel=parallel, training=training, recompute=recompute,
                seq_len=m["seq_len"], mbs=p["mbs"], gbs=p["gbs"], metric=measured["metric"],
                published=float(measured["value"]), unit=measured.get("unit", ""))


# -- predicting --------------------------------------------------------------------------------
def narayanan_flops(case: Case) -> float:
    """Narayanan et al. 2021 Eq. 3 (recompute counted): FLOPs of one iteration."""
    m, s, b = case.model, case.seq_len, case.gbs
    h, L, V = m.hidden, m.num_layers, m.vocab_size
    return 96 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def korthikanti_flops(case: Case) -> float:
    """Korthikanti et al. 2022 model FLOPs (no recompute): used for their MFU."""
    m, s, b = case.model, case.seq_len, case.gbs
    h, L, V = m.hidden, m.num_layers, m.vocab_size
    return 72 * b * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def nemo_model_flops(case: Case) -> float:
    """NeMo's model FLOPs of one iteration for the Llama family as its tables of 2024 counted
    them (``nemo/utils/flops_formulas.py``, ``llama2``, before the causal discount of NVIDIA/NeMo
    commit 6251117f4c, 2025-08-09): ``gbs*s*L*h^2*(12 + 12*g/a + 18*f/h + 12*s/h + 6*V/(L*h))``.
    It reproduces the NeMo 24.07 summary's 780 TFLOP/s for Llama2-7B from its 16,934 tokens/s/GPU."""
    m, s = case.model, case.seq_len
    h, L = m.hidden, m.num_layers
    return case.gbs * s * L * h * h * (12 + 12 * m.num_kv_heads / m.num_heads
                                       + 18 * m.ffn_hidden / h + 12 * s / h
                                       + 6 * m.vocab_size / (L * h))


def _cost(case: Case, **scales: float) -> KernelCostModel:
    return KernelCostModel(model=case.model, hardware=case.hardware, training=case.training,
                           **scales)


def simulate_case(case: Case, **scales: float):  # noqa: ANN201 (a StepRecord)
    """The simulator's record of the case's whole global batch (step time, peak memory)."""
    from slimpack.compare import plan_method
    from slimpack.sim import simulate

    cost = _cost(case, **scales)
    batch = Batch.from_lengths([case.seq_len] * case.gbs, source=case.record_id)
    plan = plan_method("megatron", batch, case.model, case.hardware, case.parallel, cost,
                       context=case.mbs * case.seq_len, recompute=case.recompute,
                       recompute_layers=case.recompute_layers)
    return simulate(plan, model=case.model, hardware=case.hardware, cost=cost).record


def simulate_step(case: Case, **scales: float) -> float:
    """Simulated iteration time (s) of the case's whole global batch."""
    return simulate_case(case, **scales).step_time_s


def _layer_seconds(case: Case, cost: KernelCostModel, recompute: str) -> float:
    t = cost.layer_times([(case.seq_len, 0)] * case.mbs, tp=case.parallel.tp, recompute=recompute)
    return t.forward_s + t.backward_s


def predict(case: Case, **scales: float) -> ValidationRow:
    if case.metric == "layer_fwd_plus_bwd_time":
        pred = _layer_seconds(case, _cost(case, **scales), case.recompute) * 1e3  # ms
        return ValidationRow(case=case, predicted=pred, bias=case.published / pred - 1)
    if case.metric == "per_layer_fwd_bwd_overhead_vs_baseline":
        base_training = TrainingSpec(**{**case.training.__dict__, "sequence_parallel": False})
        base = KernelCostModel(model=case.model, hardware=case.hardware, training=base_training,
                               **scales)
        ratio = _layer_seconds(case, _cost(case, **scales), case.recompute) / _layer_seconds(
            case, base, "none")
        pred = 100 * (ratio - 1)
        return ValidationRow(case=case, predicted=pred,
                             bias=(1 + case.published / 100) / ratio - 1)
    record = simulate_case(case, **scales)
    step, fits = record.step_time_s, not record.oom
    world = case.parallel.world
    if case.metric == "iteration_time":
        return ValidationRow(case=case, predicted=step, bias=case.published / step - 1,
                             step_time_s=step, fits=fits)
    if case.metric == "achieved_tflops_per_gpu":
        pred = narayanan_flops(case) / (step * world) / 1e12
        return ValidationRow(case=case, predicted=pred, bias=pred / case.published - 1,
                             step_time_s=step, fits=fits)
    if case.metric == "tokens_per_sec_per_gpu":
        pred = case.gbs * case.seq_len / (step * world)
        return ValidationRow(case=case, predicted=pred, bias=pred / case.published - 1,
                             step_time_s=step, fits=fits)
    if case.metric == "model_tflops_per_gpu":
        pred = nemo_model_flops(case) / (step * world) / 1e12
        return ValidationRow(case=case, predicted=pred, bias=pred / case.published - 1,
                             step_time_s=step, fits=fits)
    if case.metric == "mfu":
        pred = 100 * korthikanti_flops(case) / (step * world * A100_PEAK)
        return ValidationRow(case=case, predicted=pred, bias=pred / case.published - 1,
                             step_time_s=step, fits=fits)
    raise ValueError(f"metric must be one of {METRICS}, got {case.metric!r}")


def validate(records: list[dict[str, Any]] | None = None, *,
             express_fn: Callable[[dict[str, Any]], Case | Skipped] | None = None,
             jobs: int = 1, **scales: float) -> ValidationReport:
    """Express (with ``express_fn``, default :func:`express`), simulate and compare every
    record with a measured number. ``jobs`` > 1 simulates the cases in that many worker
    processes (each case is independent; rows keep the records' order, results identical)."""
    records = load_records() if records is None else records
    express_fn = express if express_fn is None else express_fn
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    cases: list[Case] = []
    skipped: list[Skipped] = []
    measured = 0
    for record in records:
        if not any(m.get("kind") == "measured" for m in record.get("measurements", [])):
            continue
        measured += 1
        case = express_fn(record)
        if isinstance(case, Skipped):
            skipped.append(case)
        else:
            cases.append(case)
    one = functools.partial(predict, **scales)
    if jobs > 1 and len(cases) > 1:
        from concurrent.futures import ProcessPoolExecutor

        # map keeps the input order: rows come back in the records' order.
        with ProcessPoolExecutor(max_workers=min(jobs, len(cases))) as pool:
            rows = list(pool.map(one, cases, chunksize=1))
    else:
        rows = [one(c) for c in cases]
    return ValidationReport(rows=rows, skipped=skipped, measured_records=measured)


GPU_BANDS = ((1, 64), (65, 512), (513, 2048), (2049, None))
"""GPU-count bands of the breakdown (inclusive)."""


def _band(world: int) -> str:
    for lo, hi in GPU_BANDS:
        if world >= lo and (hi is None or world <= hi):
            return f"{lo}-{hi} GPUs" if hi is not None else f">{lo - 1} GPUs"
    raise ValueError(f"num_gpus must be >= 1, got {world}")


def _group_order(item: tuple[str, list[float]]) -> tuple[int, str]:
    """GPU bands by their first count (so 65-512 precedes 513-2048), other groups by name."""
    head = item[0].lstrip(">").split("-")[0].split(" ")[0]
    return (int(head), item[0]) if head.isdigit() else (0, item[0])


def breakdown(report: ValidationReport) -> dict[str, dict[str, dict[str, float]]]:
    """Median signed bias and median |error| (percent) and row count per hardware, precision,
    context parallelism (cp = 1 vs cp > 1) and GPU-count band."""
    keys = {"hardware": lambda r: r.case.hardware.name,
            "precision": lambda r: r.case.training.dtype,
            "cp": lambda r: "cp>1" if r.case.parallel.cp > 1 else "cp=1",
            "gpus": lambda r: _band(r.case.parallel.world)}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, key in keys.items():
        groups: dict[str, list[float]] = {}
        for r in report.rows:
            groups.setdefault(key(r), []).append(r.bias)
        out[name] = {g: {"rows": len(b), "median_bias_pct": 100 * statistics.median(b),
                         "median_abs_error_pct": 100 * statistics.median(abs(x) for x in b)}
                     for g, b in sorted(groups.items(), key=_group_order)}
    return out


def format_breakdown(report: ValidationReport) -> list[str]:
    lines = []
    for name, groups in breakdown(report).items():
        parts = [f"{g} n={int(v['rows'])} bias {v['median_bias_pct']:+.1f}% "
                 f"|err| {v['median_abs_error_pct']:.1f}%" for g, v in groups.items()]
        lines.append(f"  by {name}: " + "; ".join(parts))
    return lines


def format_report(report: ValidationReport) -> str:
    lines = [f"{'record':44} {'metric':38} {'published':>10} {'predicted':>10} {'bias':>7}"]
    for r in report.rows:
        c = r.case
        lines.append(f"{c.record_id:44} {c.metric:38} {c.published:10.2f} {r.predicted:10.2f} "
                     f"{100 * r.bias:+6.1f}%")
    for s in report.skipped:
        lines.append(f"{s.record_id:44} skipped: {s.reason}")
    summ = report.summary()
    lines.append(f"expressible {summ['expressible']} of {summ['measured_records']} measured; "
                 f"median |error| {summ['median_abs_error_pct']:.1f}%; median bias <10B "
                 f"{summ['median_bias_small_pct']:+.1f}%, >100B {summ['median_bias_large_pct']:+.1f}% "
                 f"(spread {summ['size_bias_spread_pts']:.1f} pts)")
    if report.rows:
        lines.append(f"  memory: {summ['predicted_not_to_fit']} of {summ['simulated']} simulated "
                     f"runs (all of which ran) predicted not to fit"
                     + (f": {', '.join(report.predicted_not_to_fit)}"
                        if report.predicted_not_to_fit else ""))
        lines.extend(format_breakdown(report))
    return "\n".join(lines)
