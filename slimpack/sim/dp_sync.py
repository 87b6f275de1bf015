"""Data-parallel gradient synchronisation at the end of the step.

Megatron-LM's distributed optimizer reduce-scatters the fp32 gradients and all-gathers the
bf16 parameters over the data-parallel-with-context group (dp*cp ranks of the base layout).
Each base pipeline stage synchronises its own layers once every group stage holding one of
those layers is done. With ``overlap`` the buckets start as the last backward produces them,
so a stage's sync may begin at its last backward's start (but cannot end before it does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slimpack.cost.comm import CommModel
from slimpack.plan import Group, Plan
from slimpack.records import OpTiming
from slimpack.sim.costs import layers_per_virtual_stage
from slimpack.sim.engine import GroupTimeline
from slimpack.sim.expert_dispatch import expert_data_parallel_intra_node
from slimpack.specs.model import ModelSpec

FP32 = 4
BF16 = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class DpSync:
    stage_end_s: tuple[float, ...]
    """Per base pipeline stage: when its synchronisation ends."""
    duration_s: float
    """Longest single stage synchronisation (seconds of communication)."""
    optimizer_s: float = 0.0
    """Longest per-stage optimizer step (0 for cost models that do not price it)."""
    ops: tuple[OpTiming, ...] = ()

    @property
    def end_s(self) -> float:
        return max(self.stage_end_s, default=0.0)


def stage_layers(pp: int, vpp: int, num_layers: int,
                 counts: Sequence[int] | None = None) -> list[set[int]]:
    """Layer indices held by each pipeline stage (chunk c of stage s = block c*pp + s);
    ``counts``: the layers of each virtual stage (default: the even split)."""
    if counts is None:
        counts = layers_per_virtual_stage(num_layers, pp, vpp)
    out: list[set[int]] = [set() for _ in range(pp)]
    first = 0
    for vs, n in enumerate(counts):
        out[vs % pp].update(range(first, first + n))
        first += n
    return out


def dp_sync(plan: Plan, groups: list[tuple[Group, GroupTimeline]], *, model: ModelSpec,
            comm: CommModel, overlap: bool, zero_stage: int = 1,
            optimizer_step: Callable[[float], float] | None = None) -> DpSync:
    """``zero_stage`` 0: all-reduce of fp32 gradients; 1 (default): reduce-scatter + all-gather
    as above; 3: ZeRO-3 gathers the bf16 parameters for forward and again for backward and
    reduce-scatters bf16 gradients, charged here after compute without overlap
    (*reconstructed*: a lower bound on prefetching's benefit is not modelled).
    ``optimizer_step(local_params)`` (a cost model's) adds the optimizer step after the sync."""
    base = plan.parallel
    if zero_stage == 3:
        overlap = False
    sync_size = base.dp * base.cp
    base_layers = stage_layers(base.pp, base.vpp, model.num_layers, None
                               if base.pipeline_split == "even"
                               else base.virtual_stage_layers(model.num_layers))
    ready = [0.0] * base.pp
    done = [0.0] * base.pp
    for group, tl in groups:
        same_layout = group.pp == base.pp and group.vpp == base.vpp
        g_layers = None if same_layout else stage_layers(group.pp, group.vpp, model.num_layers)
        for s in range(group.pp):
            targets = [s] if same_layout else [
                b for b in range(base.pp) if base_layers[b] & g_layers[s]]  # type: ignore[index]
            start = tl.last_backward_start[s] if overlap else tl.compute_end[s]
            for b in targets:
                ready[b] = max(ready[b], start)
                done[b] = max(done[b], tl.compute_end[s])
    ends = []
    ops = []
    longest = 0.0
    longest_step = 0.0
    expert_per_layer = model.expert_params_per_layer
    for b in range(base.pp):
        experts = len(base_layers[b]) * expert_per_layer / base.ep / base.tp
        params = len(base_layers[b]) * (model.params_per_layer - expert_per_layer) / base.tp
        if b == 0:
            params += model.embedding_params / base.tp
        if b == base.pp - 1 and not model.tied_embeddings:
            params += model.embedding_params / base.tp
        # MoE: the experts' gradients reduce over the expert-data-parallel group (dp*cp/ep
        # ranks), the other parameters' over dp*cp.
        intra = base.same_node(base.dp_group(base.rank(pp=b)))
        buckets = [(params, sync_size, intra)]
        if experts:
            buckets.append((experts, sync_size // base.ep,
                            intra if base.ep == 1
                            else expert_data_parallel_intra_node(base, b)))
        step = 0.0
        if optimizer_step is not None:
            step = optimizer_step(sum(n / (size if zero_stage else 1) for n, size, _ in buckets))
        longest_step = max(longest_step, step)
        if sync_size == 1:
            ends.append(done[b] + step)
            if step > 0:
                ops.append(OpTiming(stage=b, kind="optimizer", unit=-1, chunk=-1,
                                    start_s=done[b], end_s=done[b] + step, lane="optimizer",
                                    group=-1))
            continue
        seconds = 0.0
        for n, size, intra in buckets:
            if zero_stage == 3:
                seconds += (comm.reduce_scatter(n * BF16, size, intra_node=intra)
                            + 2 * comm.all_gather(n * BF16, size, intra_node=intra))
            elif zero_stage == 0:
                seconds += comm.all_reduce(n * FP32, size, intra_node=intra)
            else:
                seconds += (comm.reduce_scatter(n * FP32, size, intra_node=intra)
                            + comm.all_gather(n * BF16, size, intra_node=intra))
        longest = max(longest, seconds)
        end = max(done[b], ready[b] + seconds) + step
        ends.append(end)
        ops.append(OpTiming(stage=b, kind="dp-sync", unit=-1, chunk=-1,
                            start_s=end - step - seconds, end_s=end - step, lane="dp-sync",
                            group=-1))
        if step > 0:
            ops.append(OpTiming(stage=b, kind="optimizer", unit=-1, chunk=-1,
                                start_s=end - step, end_s=end, lane="optimizer", group=-1))
    return DpSync(stage_end_s=tuple(ends), duration_s=longest, optimizer_s=longest_step,
                  ops=tuple(ops))

