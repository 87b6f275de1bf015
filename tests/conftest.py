"""Shared test fixtures: where the real length samples live, and every registered planner's
plans of real length samples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_dir() -> Path:
    """``../shared`` beside the checkout (or $SLIMPACK_SHARED_DIR)."""
    env = os.environ.get("SLIMPACK_SHARED_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def length_samples_dir() -> Path:
    path = shared_dir() / "length_distributions"
    if not path.is_dir():
        pytest.skip(f"real length samples not found at {path} (set SLIMPACK_SHARED_DIR)")
    return path


@pytest.fixture(scope="session")
def registered_planner_plans() -> list:
    """Every registered planner's plan (llama-7b on H800, the analytic cost model, tp2 cp2
    pp4 dp2; the Ulysses methods and Megatron-Core hybrid CP without a pipeline) of two real
    length samples, and the pipeline planners' with virtual stages (vpp 2): the groups the
    compiled walks are checked on (a few seconds)."""
    import dataclasses

    from slimpack import data
    from slimpack.compare import plan_method
    from slimpack.cost import AnalyticCostModel
    from slimpack.methods import method_names
    from slimpack.specs import ParallelSpec, hardware_preset, model_preset

    model, hardware = model_preset("llama-7b"), hardware_preset("h800")
    cost = AnalyticCostModel(model=model, hardware=hardware)
    parallel = ParallelSpec(tp=2, cp=2, pp=4, dp=2)
    no_pipeline = ParallelSpec(tp=2, cp=4, pp=1, dp=2)
    def unpipelined(method: str) -> bool:
        return method.startswith("ulysses") or method == "megatron-dcp"

    out = []
    for seed, dataset in enumerate(("commoncrawl", "github")):
        batch = data.sample_batch(dataset, num_sequences=96, context=65536, seed=seed)
        out.extend(plan_method(m, batch, model, hardware,
                               no_pipeline if unpipelined(m) else parallel, cost, context=65536)
                   for m in method_names())
    batch = data.sample_batch("wikipedia", num_sequences=96, context=65536, seed=3)
    out.extend(plan_method(m, batch, model, hardware, dataclasses.replace(parallel, vpp=2),
                           cost, context=65536) for m in ("megatron", "slimpack", "slimpipe"))
    return out
