"""Start the runtime: under torchrun (RANK/WORLD_SIZE set) or by spawning local processes.

The plan is checked (:func:`check_runtime_plan`) in the launching process before any worker
starts, so a bad plan fails with one message instead of N hung processes.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slimpack.plan import Plan
from slimpack.records import StepRecord
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.executor import RankResult, execute_rank
from slimpack.runtime.measure import step_record
from slimpack.runtime.validate import check_runtime_plan
from slimpack.specs.hardware import HardwareSpec
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class RunResult:
    record: StepRecord
    ranks: list[RankResult]
    """Every rank's result; ``grads`` filled when asked for."""

    @property
    def loss(self) -> float:
        return self.ranks[0].loss

    def grads(self) -> dict[str, torch.Tensor]:
        """Global parameter name -> gradient, from the first rank holding each parameter."""
        out: dict[str, torch.Tensor] = {}
        for r in self.ranks:
            for name, g in (r.grads or {}).items():
                out.setdefault(name, g)
        return out


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_plan(plan: Plan, spec: ModelSpec, config: RuntimeConfig, *, nproc: int | None = None,
             return_grads: bool = False, hardware: HardwareSpec | None = None,
             timeout_s: float = 300.0) -> RunResult | None:
    """Execute ``plan`` once; return the result (None on non-zero ranks under torchrun)."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        check_runtime_plan(plan, spec, world_size=world)
        return _torchrun_rank(plan, spec, config, return_grads=return_grads, hardware=hardware,
                              timeout_s=timeout_s)
    world = plan.world_size if nproc is None else nproc
    check_runtime_plan(plan, spec, world_size=world)
    if config.device == "cuda" and torch.cuda.device_count() < world:
        raise ValueError(f"plan needs {world} GPUs, {torch.cuda.device_count()} visible; "
                         f"launch with torchrun across nodes")
    with tempfile.TemporaryDirectory(prefix="slimpack-run-") as tmp:
        out = Path(tmp) / "result.pt"
        init = f"tcp://127.0.0.1:{free_port()}"
        mp.spawn(_spawned_rank, nprocs=world, join=True,
                 args=(world, init, plan.to_json(), spec, config, return_grads, hardware,
                       timeout_s, str(out)))
        return torch.load(out, weights_only=False)


def _spawned_rank(rank: int, world: int, init: str, plan_json: str, spec: ModelSpec,
                  config: RuntimeConfig, return_grads: bool, hardware: HardwareSpec | None,
                  timeout_s: float, out: str) -> None:
    if config.device == "cpu":
        # Share the cores between the ranks instead of oversubscribing them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(config.dist_backend, init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        result = run_in_process_group(Plan.from_json(plan_json), spec, config, rank=rank,
                                      local_rank=rank, return_grads=return_grads,
                                      hardware=hardware)
        if result is not None:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def _torchrun_rank(plan: Plan, spec: ModelSpec, config: RuntimeConfig, *, return_grads: bool,
                   hardware: HardwareSpec | None, timeout_s: float) -> RunResult | None:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    dist.init_process_group(config.dist_backend, timeout=timedelta(seconds=timeout_s))
    try:
        return run_in_process_group(plan, spec, config, rank=rank, local_rank=local_rank,
                                    return_grads=return_grads, hardware=hardware)
    finally:
        dist.destroy_process_group()


def run_in_process_group(plan: Plan, spec: ModelSpec, config: RuntimeConfig, *, rank: int,
                         local_rank: int, return_grads: bool = False,
                         hardware: HardwareSpec | None = None) -> RunResult | None:
    """Run ``plan`` in an already initialised default process group (rank 0 gets the
    result). For callers that run many plans in one job, such as the GPU check."""
    rplan = check_runtime_plan(plan, spec, world_size=dist.get_world_size())
    if config.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    per_step = execute_rank(rplan, spec, config, rank=rank, device=device,
                            return_grads=return_grads)
    gathered: list[list[RankResult]] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(per_step, gathered, dst=0)
    if rank != 0:
        return None
    # Keep the measured step with the median step time (slowest rank), all ranks of it.
    steps = [[ranks[i] for ranks in gathered] for i in range(len(per_step))]
    steps.sort(key=lambda ranks: max(r.elapsed_s for r in ranks))
    chosen = steps[len(steps) // 2]
    if return_grads:
        chosen = [r if r.grads is not None else _with_grads(r, ranks[-1])
                  for r, ranks in zip(chosen, gathered, strict=True)]
    record = step_record(rplan, spec, chosen, config, hardware=hardware)
    record.extra["measured_step_times_s"] = sorted(max(r.elapsed_s for r in ranks)
                                                   for ranks in steps)
    return RunResult(record=record, ranks=chosen)


def _with_grads(result: RankResult, last: RankResult) -> RankResult:
    """Gradients are identical every step (reset in between); they travel with the last."""
    return dataclasses.replace(result, grads=last.grads)
