"""Does a configuration fit in GPU memory? (the cost model's memory estimate, rank 0 and last)

Used by every baseline to choose recompute "when memory forces it" (Megatron-LM), the static
CP size, SlimPipe's slice count and the auto-parallel search.
"""

from __future__ import annotations

import dataclasses

from slimpack.cost.memory import estimate_memory
from slimpack.specs import HardwareSpec, ModelSpec, ParallelSpec
from slimpack.specs.recompute import AUTO, RECOMPUTE_MODES


def memory_schedule(schedule: str) -> str:
    """The memory model knows 1f1b, interleaved and slimpipe; gpipe/asymmetric are priced as
    1f1b (their in-flight bound is the planner's responsibility)."""
    return schedule if schedule in ("1f1b", "interleaved", "slimpipe") else "1f1b"


def peak_memory_bytes(model: ModelSpec, *, tokens: int, schedule: str, tp: int = 1, cp: int = 1,
                      pp: int = 1, vpp: int = 1, dp: int = 1, slices: int = 1,
                      recompute: str = "none", vocab_parallel_pp: bool | None = None,
                      ep: int = 1) -> float:
    """Peak bytes over pipeline ranks 0 (most activations) and pp-1 (logits) for micro-batches
    of ``tokens`` tokens."""
    schedule = memory_schedule(schedule)
    if schedule == "slimpipe":
        tokens = -(-tokens // slices) * slices  # the estimate needs slices | tokens
    if schedule == "1f1b":
        vpp = 1
    kwargs = dict(seq_len=max(int(tokens), 1), schedule=schedule, tp=tp, cp=cp, pp=pp, vpp=vpp,
                  slices=slices, dp=dp, recompute=recompute, vocab_parallel_pp=vocab_parallel_pp,
                  ep=ep)
    peak = estimate_memory(model, rank=0, **kwargs).peak_bytes
    if pp > 1:
        peak = max(peak, estimate_memory(model, rank=pp - 1, **kwargs).peak_bytes)
    return peak


def fits_memory(model: ModelSpec, hardware: HardwareSpec, *, tokens: int, schedule: str,
                **degrees) -> bool:
    """True when micro-batches of ``tokens`` tokens fit the device's usable memory."""
    return peak_memory_bytes(model, tokens=tokens, schedule=schedule, **degrees) <= (
        hardware.usable_memory_bytes)


def choose_recompute(model: ModelSpec, hardware: HardwareSpec, *, tokens: int, schedule: str,
                     **degrees) -> str | None:
    """The cheapest recompute mode that fits, or None when even full recompute does not."""
    for mode in RECOMPUTE_MODES:
        if fits_memory(model, hardware, tokens=tokens, schedule=schedule, recompute=mode,
                       **degrees):
            return mode
    return None


def max_tokens_that_fit(model: ModelSpec, hardware: HardwareSpec, *, schedule: str,
                        recompute: str = "none", upper: int = 1 << 24, **degrees) -> int:
    """Largest micro-batch (tokens, multiple of 128) that fits; 0 when even 128 does not."""
    lo, hi = 0, upper // 128
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits_memory(model, hardware, tokens=mid * 128, schedule=schedule,
                       recompute=recompute, **degrees):
            lo = mid
        else:
            hi = mid - 1
    return lo * 128


def resolve_recompute(requested: str, model: ModelSpec, hardware: HardwareSpec,
                      parallel: ParallelSpec, tokens: int, schedule: str) -> tuple[str, bool]:
    """(mode, fits) for micro-batches of ``tokens`` tokens: ``auto`` walks the modes cheapest
    first; ``full`` is the fallback when nothing fits (the simulator then reports the OOM)."""
    if requested != AUTO:
        return requested, True
    if parallel.pipeline_split != "even":
        # The closed-form estimate splits layers evenly: price every virtual stage at the
        # largest one's layers (an upper bound; the simulator's walk has the last word).
        largest = max(parallel.virtual_stage_layers(model.num_layers))
        model = dataclasses.replace(model, num_layers=largest * parallel.pp * parallel.vpp)
    mode = choose_recompute(model, hardware, tokens=tokens, schedule=schedule, tp=parallel.tp,
                            cp=parallel.cp, pp=parallel.pp, vpp=parallel.vpp, dp=parallel.dp,
                            ep=parallel.ep)
    return (mode, True) if mode is not None else ("full", False)
