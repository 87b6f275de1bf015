"""Options of the SlimPack planner; each ``no_*`` switch turns one component off for ablation."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

RECOMPUTE_CHOICES = ("auto", "none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class SlimPackOptions:
    context: int | None = None
    """Accepted for a uniform interface: SlimPack cuts sequences into cost-balanced slices,
    so no fixed sample length applies (sequences arrive already split at the context)."""
    slice_tokens: int | None = None
    """Slice length S (a multiple of 128 and of 2*cp). None: searched with the simulator."""
    slice_candidates: tuple[int, ...] = (2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768)
    """Values of S tried by the search (those above the context are dropped)."""
    search: bool = True
    """Simulate candidates and keep the fastest that fits; False = heuristic mode."""
    search_candidates: int = 6
    """Slice lengths the search simulates: the heuristic S and its nearest neighbours. Bounding
    the search by count, not time, keeps plans identical from run to run."""
    milp: bool = False
    """Refine phase 1 with a HiGHS MILP (warm-started from the heuristic)."""
    time_limit_s: float | None = 30.0
    """Wall-clock safety net for the whole planner; a search that hits it returns the best plan
    so far (and is then no longer deterministic)."""
    milp_time_limit_s: float | None = 1.0
    no_slicing: bool = False
    """Ablation: whole sequences only (no cutting long sequences into slices)."""
    no_asymmetric: bool = False
    """Ablation: backward MicroPacks mirror the forward ones."""
    search_mirrored: bool = True
    """The search also simulates each slice length with mirrored backward MicroPacks (the
    forward ones in reverse, SlimPipe's order) and keeps whichever is faster: where a replica
    has few MicroPacks per pipeline stage the asymmetric re-deal's backward steps wait on
    later forwards (docs/slimpack-planner.md, "SlimPack vs SlimPipe on the same layout"). One
    more candidate per slice length whose asymmetric plan fits memory; no effect with
    ``no_asymmetric`` (every candidate is mirrored). The ablation turns it off, so its
    asymmetric step measures asymmetric MicroPacks."""
    uniform_candidate: bool = True
    """The search also builds SlimPipe's plan shape with SlimPack's data path (whole
    sequences in context-length bins, bins dealt by phase 1, uniform slices; ``uniform.py``)
    at pp > 1 and keeps it when the simulator finds it fastest, so SlimPack's search holds
    every plan shape SlimPipe's does (issue 24). One more candidate per recompute mode
    searched. False: the ablation's MicroPack-only search."""
    steady_state_floor: bool = False
    """Pack each replica into at least 2*pp*vpp MicroPacks (a steady state to hide the
    pipeline's fill and drain in) instead of at least pp (SlimPipe's fewest slices per
    sample). The search sets it on its own candidates (``search_step_floor``)."""
    search_step_floor: bool = True
    """The search also builds each slice length with ``steady_state_floor`` where that floor
    binds (fewer than 2*pp*vpp slices of the batch per replica) and keeps the faster: small
    batches gain from fewer, larger MicroPacks, deep pipelines (pp*vpp of 80) from more
    (docs/slimpack-planner.md, "SlimPack vs SlimPipe on the same layout")."""
    short_reserve: float = 0.0
    """Asymmetric partitioning: share of each long-sequence round (its tokens and its
    MicroPacks' forward target) kept for short documents, so forward and backward groupings
    can differ where the long work is (*reconstructed*). 0 by default: measured, it does not
    pay (docs/slimpack-planner.md, "Asymmetric partitioning, measured")."""
    regroup_long: bool = False
    """Asymmetric partitioning: backward MicroPacks also regroup long-sequence sub-slices on
    backward cost (backward.py, *reconstructed*). Off by default: measured, it moves the step
    by -1% to +0.03% (docs/slimpack-planner.md, "Asymmetric partitioning, measured")."""
    round_warmup: bool = False
    """Asymmetric partitioning: a round's first backward MicroPack takes an atom of the round's
    last forward one, so the schedule's warm-up (sized by what the first backward needs) spans
    the round, as when mirrored. Off by default: measured +1.9% on the issue's attention-heavy
    mix (vpp 1; without it the re-deal's bursts cost 6% at S = 12288) but -8% on the e2e
    llama-7b Common Crawl 256K point (vpp 2), where the short warm-up the re-deal gives
    short-document rounds is faster (docs/slimpack-planner.md)."""
    no_dp_aware: bool = False
    """Ablation: phase 1 deals sequences to replicas by token count, blind to their cost."""
    no_dp_merge: bool = False
    """Ablation: outliers stay on one replica instead of a temporary CP merge."""
    cp_sharding: str = "per-sequence"
    """How a MicroPack is split over CP ranks: "per-sequence" (the packed buffer in 2*cp
    zigzag chunks, so short documents stay whole) or "per-document" (every document in 2*cp
    chunks: balanced attention, but short documents shatter into part-empty attention tiles)."""
    vocab_parallel_pp: bool = True
    """With pp > 1, spread the LM head and loss over the pipeline ranks (SlimPipe's vocabulary
    parallelism) instead of running them on the last stage. The runtime executes either
    (``slimpack.runtime.vocab_parallel``; with untied embeddings, as the simulator prices it)."""
    memory_headroom: float = 0.9
    """Fraction of usable device memory the planner lets activations and states take."""
    offload: float | None = None
    """Share of every group's activations offloaded to host memory (SlimPipe's mechanism).
    None: only when the search's best plan still overflows memory, the smallest share that
    fits (``mechanisms.OFFLOAD_SHARES``); 0: never; a share in (0, 1]: always that share."""
    sync_tail: bool = True
    """Where the data-parallel gradient sync is exposed after compute, also simulate the plan
    whose last backward MicroPacks run as one long enough to hide it, and keep the faster
    (``sync_tail.py``). False: never (ablation)."""
    recompute: str = "auto"
    """Activation recompute of every group: ``none``, ``selective`` (attention core and SwiGLU
    intermediates), ``full`` (each layer from its input), or ``auto``: the search runs without
    recompute and, where that plan is memory-bound (it merges replicas for outliers or
    overflows memory), again with ``selective`` and ``full``, keeping the fastest by
    simulation, as SlimPipe tries its memory mechanisms (issue 24: SlimPack's search holds
    every mechanism SlimPipe's does). Heuristic mode (``search=False``) takes ``auto`` as
    ``none``."""
    attention_redistribution: bool | None = None
    """SlimPipe's attention redistribution between pipeline ranks (pp > 1). None: simulated
    on the chosen plan and kept when faster; True: always; False: never (the CPU runtime
    refuses it at pp > 1)."""

    def __post_init__(self) -> None:
        if self.slice_tokens is not None and (self.slice_tokens <= 0 or self.slice_tokens % 128):
            raise ValueError(
                f"SlimPackOptions.slice_tokens must be a positive multiple of 128, got {self.slice_tokens}"
            )
        if not self.slice_candidates or any(s <= 0 or s % 128 for s in self.slice_candidates):
            raise ValueError("SlimPackOptions.slice_candidates must be positive multiples of 128")
        if self.search_candidates < 1:
            raise ValueError(f"SlimPackOptions.search_candidates must be >= 1, got {self.search_candidates}")
        for name in ("time_limit_s", "milp_time_limit_s"):
            limit = getattr(self, name)
            if limit is not None and not limit > 0:
                raise ValueError(f"SlimPackOptions.{name} must be None (no wall-clock limit) "
                                 f"or > 0 seconds, got {limit!r}")
        if self.cp_sharding not in ("per-sequence", "per-document"):
            raise ValueError(
                f"SlimPackOptions.cp_sharding must be per-sequence or per-document, got {self.cp_sharding!r}"
            )
        if isinstance(self.short_reserve, bool) or not isinstance(self.short_reserve, int | float) \
                or not 0.0 <= self.short_reserve < 1.0:
            raise ValueError(f"SlimPackOptions.short_reserve must be a number in [0, 1), "
                             f"got {self.short_reserve!r}")
        if self.offload is not None and (isinstance(self.offload, bool) or not isinstance(
                self.offload, int | float) or not 0.0 <= self.offload <= 1.0):
            raise ValueError(f"SlimPackOptions.offload must be None (when memory needs it) or "
                             f"a share in [0, 1], got {self.offload!r}")
        if not isinstance(self.sync_tail, bool):
            raise ValueError(f"SlimPackOptions.sync_tail must be true or false, got "
                             f"{self.sync_tail!r}")
        if self.recompute not in RECOMPUTE_CHOICES:
            raise ValueError(f"SlimPackOptions.recompute must be one of {RECOMPUTE_CHOICES}, "
                             f"got {self.recompute!r}")
        if self.attention_redistribution not in (None, True, False):
            raise ValueError(f"SlimPackOptions.attention_redistribution must be None (try "
                             f"it), true or false, got {self.attention_redistribution!r}")
        if not 0 < self.memory_headroom <= 1:
            raise ValueError(f"SlimPackOptions.memory_headroom must be in (0, 1], got {self.memory_headroom}")

    @classmethod
    def from_kwargs(cls, options: dict[str, Any]) -> SlimPackOptions:
        """Build from planner ``**options`` (dashes allowed); unknown names are an error."""
        names = {f.name for f in fields(cls)}
        clean = {k.replace("-", "_"): v for k, v in options.items()}
        unknown = sorted(set(clean) - names)
        if unknown:
            raise ValueError(f"slimpack planner: unknown options {unknown}; allowed: {sorted(names)}")
        if "slice_candidates" in clean:
            clean["slice_candidates"] = tuple(clean["slice_candidates"])
        return cls(**clean)

    @property
    def recompute_mode(self) -> str:
        """The recompute mode a build uses: ``auto`` builds without recompute (the search
        tries the others itself)."""
        return "none" if self.recompute == "auto" else self.recompute
