"""Run several plans of one world size in one job of local processes.

Starting ``N`` processes (importing torch, joining a gloo group) costs seconds, far more than
a tiny plan's step; a parity matrix of many small plans pays it once per world size here.
Every plan is checked before anything starts, as :func:`launch.run_plan` does.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slimpack.plan import Plan
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.launch import RunResult, free_port, run_in_process_group
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs.model import ModelSpec


def run_plans(plans: list[Plan], spec: ModelSpec, config: RuntimeConfig, *,
              return_grads: bool = False, timeout_s: float = 300.0) -> list[RunResult]:
    """Execute every plan (all for the same world size) in one spawned job, in order."""
    if not plans:
        return []
    worlds = {p.world_size for p in plans}
    if len(worlds) != 1:
        raise ValueError(f"run_plans: plans must share one world size, got {sorted(worlds)}")
    world = worlds.pop()
    for plan in plans:
        check_runtime_plan(plan, spec, world_size=world)
    if config.device == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(f"plans need {world} GPUs, {torch.cuda.device_count()} visible")
    with tempfile.TemporaryDirectory(prefix="slimpack-runs-") as tmp:
        out = Path(tmp) / "results.pt"
        mp.spawn(_rank, nprocs=world, join=True,
                 args=(world, f"tcp://127.0.0.1:{free_port()}", [p.to_json() for p in plans],
                       spec, config, return_grads, timeout_s, str(out)))
        return torch.load(out, weights_only=False)


def _rank(rank: int, world: int, init: str, plan_jsons: list[str], spec: ModelSpec,
          config: RuntimeConfig, return_grads: bool, timeout_s: float, out: str) -> None:
    if config.device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(config.dist_backend, init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        results = [run_in_process_group(Plan.from_json(text), spec, config, rank=rank,
                                        local_rank=rank, return_grads=return_grads)
                   for text in plan_jsons]
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()
