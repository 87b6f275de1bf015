"""The Hopper development set: published H100 training runs (``hopper_published.json``).

Each record cites the file, table, column and row its number was read from (NVIDIA's DGX Cloud
Benchmarking recipes, release v24.11.1, the NeMo long-sequence performance page and the
Megatron-Bridge 25.11 performance summary), with the
configuration the run used (model shape and recipe from the recipe's own YAML). Like the A100
set, these runs only validate: no constant anywhere is fitted to them.

A record is expressed as a :class:`~slimpack.validation.megatron.Case` on the ``h100-80g``
preset with FlashAttention, bf16 or fp8 GEMMs (Transformer Engine recipe), context parallelism,
sequence parallelism and tensor-parallel communication overlap as the recipe ran them.
Squared-ReLU MLPs (Nemotron) have GPT-3's two-matrix shape and are priced as one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from slimpack.specs import ModelSpec, ParallelSpec, hardware_preset
from slimpack.specs.training import TrainingSpec
from slimpack.validation.megatron import Case, Skipped

HOPPER_FILE = Path(__file__).resolve().parent / "hopper_published.json"
HOPPER_METRICS = ("iteration_time", "model_tflops_per_gpu", "tokens_per_sec_per_gpu")
PRECISIONS = ("bf16", "fp8")
_GPU_PRESETS = {"H100": "h100-80g", "H800": "h800-80g", "H200": "h200-141g"}


def load_hopper_records(path: str | Path | None = None) -> list[dict[str, Any]]:
    path = Path(path) if path is not None else HOPPER_FILE
    if not path.is_file():
        raise ValueError(f"validation records {str(path)!r} do not exist")
    data = json.loads(path.read_text())
    if "records" not in data:
        raise ValueError(f"{str(path)!r} has no 'records' list")
    return list(data["records"])


def _measured(record: dict[str, Any]) -> dict[str, Any] | None:
    for m in record.get("measurements", []):
        if m.get("kind") == "measured" and m.get("metric") in HOPPER_METRICS:
            return m
    return None


def _mlp(arch: str) -> str | None:
    arch = arch.lower()
    if "swiglu" in arch:
        return "swiglu"
    if "squared-relu" in arch or "gelu" in arch:
        return "gelu"  # two matrices, h x ffn and ffn x h
    return None


def _hardware(record: dict[str, Any]):
    gpu = record.get("hardware", {}).get("gpu", "")
    for key, preset in _GPU_PRESETS.items():
        if gpu.startswith(key):
            return hardware_preset(preset)
    return None


def _recompute(text: str) -> tuple[str, int | None] | None:
    """(mode, layers per virtual stage or None) of a record's ``recompute``: a mode, or
    ``partial: recompute_num_layers=N`` (Megatron-Bridge's performance scripts set
    ``recompute_granularity="full"``, ``recompute_method="block"``,
    ``recompute_num_layers=N``: ``scripts/performance/utils/overrides.py``
    ``_set_recompute_overrides``); None when neither."""
    if text in ("none", "selective", "full"):
        return text, None
    found = re.fullmatch(r"partial: recompute_num_layers=(\d+)", text)
    if found and int(found.group(1)) >= 1:
        return "full", int(found.group(1))
    return None


def express_hopper(record: dict[str, Any]) -> Case | Skipped:
    """The record as a :class:`Case`, or why the suite cannot express it."""
    rid = record["id"]
    measured = _measured(record)
    if measured is None:
        return Skipped(record_id=rid, reason="no measured metric the suite predicts")
    precision = record.get("precision", "")
    if precision not in PRECISIONS:
        return Skipped(record_id=rid, reason=f"precision {precision!r} is not one of {PRECISIONS}")
    hardware = _hardware(record)
    if hardware is None:
        return Skipped(record_id=rid, reason=f"GPU {record.get('hardware', {}).get('gpu')!r} "
                                             f"has no preset")
    m, p = record["model"], record["parallel"]
    if "sliding-window" in m.get("arch", ""):
        return Skipped(record_id=rid, reason="sliding-window attention not modelled "
                                             "(every layer is priced with full causal attention)")
    recompute = _recompute(record.get("recompute", ""))
    if recompute is None:
        return Skipped(record_id=rid, reason=f"recompute {record.get('recompute')!r} not modelled")
    mlp = _mlp(m.get("arch", ""))
    if mlp is None:
        return Skipped(record_id=rid, reason=f"MLP of {m.get('arch')!r} not modelled")
    model = ModelSpec(name=m["name"], num_layers=m["layers"], hidden=m["hidden"],
                      ffn_hidden=m["ffn"], num_heads=m["heads"], num_kv_heads=m["kv_heads"],
                      vocab_size=m["vocab"], tied_embeddings="untied" not in m.get("arch", ""),
                      mlp=mlp, rope="rope" in m.get("arch", "").lower(),
                      head_dim=m.get("head_dim", 0), num_experts=m.get("experts", 1),
                      moe_top_k=m.get("top_k", 1))
    try:
        parallel = ParallelSpec(tp=p["tp"], pp=p["pp"], cp=p.get("cp", 1), dp=p["dp"],
                                ep=p.get("ep", 1), vpp=p.get("vpp", 1),
                                pipeline_split=p.get("pipeline_split", "even"),
                                gpus_per_node=record["hardware"].get("gpus_per_node", 8))
    except ValueError as exc:
        return Skipped(record_id=rid, reason=str(exc))
    if parallel.world != p["num_gpus"]:
        return Skipped(record_id=rid, reason=f"tp*cp*pp*dp = {parallel.world} != num_gpus "
                                             f"{p['num_gpus']}")
    try:
        parallel.validate_for_model(model)
    except ValueError as exc:
        return Skipped(record_id=rid, reason=str(exc))
    recipe = record.get("training", {})
    try:
        training = TrainingSpec(dtype=precision,
                                sequence_parallel=bool(p.get("sequence_parallel")),
                                tp_comm_overlap=bool(recipe.get("tp_comm_overlap")),
                                zero_stage=3 if "fsdp" in p.get("dp_sharding", "").lower() else 1,
                                grad_dtype=recipe.get("grad_dtype", "fp32"),
                                attention_kernel="flash", dropout=False,
                                hopper_attention=recipe.get("hopper_attention", "fa3"),
                                fp8_params=bool(recipe.get("fp8_params", False)),
                                optimizer=recipe.get("optimizer", "megatron"),
                                optimizer_dtype=recipe.get("optimizer_dtype", "fp32"))
    except ValueError as exc:
        return Skipped(record_id=rid, reason=str(exc))
    return Case(record_id=rid, source=record["source"]["work"], params_b=float(m["params_b"]),
                model=model, hardware=hardware, parallel=parallel, training=training,
                recompute=recompute[0], recompute_layers=recompute[1], seq_len=m["seq_len"],
                mbs=p["mbs"], gbs=p["gbs"], metric=measured["metric"],
                published=float(measured["value"]), unit=measured.get("unit", ""))

