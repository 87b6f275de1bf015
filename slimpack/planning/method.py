"""What a training method is, to the rest of the suite: one :class:`MethodSpec` per method.

Each planner module declares ``METHOD = MethodSpec(...)`` beside its ``plan`` function:
the options dataclass it accepts, the schedule family its memory follows, which parallel
layouts it runs on and how it reshapes a layout (FlexSP's SP pool), how many layouts the
harness's search tries for it, whether the all-method comparisons include it, and the ZeRO
stage of its paper. The registry in
:mod:`slimpack.methods` only maps names to these declarations, and the configuration search
in :mod:`slimpack.compare` reads them, so nothing about a method is written twice.

The spec lives in the planning layer (below the planners) so planner modules can declare
themselves without importing anything above them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from slimpack.batch import Batch
from slimpack.plan import Plan
from slimpack.planning.auto_parallel import Candidate
from slimpack.planning.options import build_options, describe_options
from slimpack.planning.setup import PlanSetup
from slimpack.specs import ParallelSpec
from slimpack.specs.training import ZERO_STAGES

SCHEDULE_FAMILIES = ("1f1b", "slimpipe")
"""How a method's activation memory grows: whole micro-batches in 1F1B (interleaved when
vpp > 1), or slices of a sequence in flight (SlimPipe, SlimPack)."""


class Planner(Protocol):
    """``plan(batch, setup, options) -> Plan``: ``options`` is the method's own options
    dataclass, built and checked by ``slimpack.compare.plan_method``, which also checks the
    layout, times the call and gives the plan a memory verdict when the planner gives none."""

    def __call__(self, batch: Batch, setup: PlanSetup, options: Any) -> Plan: ...


@dataclass(frozen=True, kw_only=True)
class LayoutSpace:
    """The (tp, cp, pp, vpp) layouts a configuration search may try; dp is what is left."""

    max_cp: int = 32
    max_pp: int = 32
    vpp_options: tuple[int, ...] = (1, 2, 3, 4, 5)
    """tp is a power of two up to a node's GPUs (Megatron-LM practice)."""

    def __post_init__(self) -> None:
        if self.max_cp < 1 or self.max_pp < 1 or not self.vpp_options or \
                min(self.vpp_options) < 1:
            raise ValueError(f"LayoutSpace: max_cp, max_pp and vpp_options must be >= 1, got "
                             f"{self.max_cp}, {self.max_pp}, {self.vpp_options}")

    def describe(self) -> str:
        return (f"tp<=gpus/node cp<={self.max_cp} pp<={self.max_pp} "
                f"vpp in {{{','.join(map(str, self.vpp_options))}}}")


SEARCH_SPACE = LayoutSpace()
"""The one layout space every method is searched over (issue 24, "equal terms"): the union of
what the papers run, pp up to 32 and vpp up to 5 (SlimPipe's artifact: pp 8 with vpp 5 for
llama-13b at 256K), cp up to 32 (Megatron-LM at 256K+). A method narrows it only by what it
cannot run (``MethodSpec.allows``: SlimPipe needs pp > 1, megatron-dcp and the Ulysses
baselines pp = 1), never by a smaller search."""


HARNESS_SEARCH_LAYOUTS = 3
"""SlimPack's ``MethodSpec.search_layouts``: its 3 best-estimated layouts (then the layouts
every faster method won with, ``slimpack.planning.winners``)."""


def any_layout(parallel: ParallelSpec) -> bool:
    """The default ``allows``: the method runs on every (tp, cp, pp, vpp, dp) layout."""
    return True


def keep_layouts(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The default ``reshape``: the candidates as they are."""
    return list(candidates)


@dataclass(frozen=True, kw_only=True)
class MethodSpec:
    """One training method as the registry, the search and the CLI see it."""

    name: str
    summary: str
    """One line for ``--help`` and reports."""
    source: str
    """Citation of the method (paper, section) or "this suite" for our own helpers."""
    planner: Planner
    options: type
    """Frozen keyword-only dataclass of the planner's options. Every method's options have
    ``context`` and ``time_limit_s``, so shared settings reach every planner unchanged."""
    schedule_family: str = "1f1b"
    allows: Callable[[ParallelSpec], bool] = any_layout
    """Which parallel layouts the method runs on (e.g. SlimPipe needs pp > 1)."""
    reshape: Callable[[Sequence[Candidate]], list[Candidate]] = keep_layouts
    """Turns the memory-feasible layouts into the method's own (e.g. FlexSP's SP pool)."""
    layout_rule: str = ""
    """``allows`` and ``reshape`` in words (e.g. "pp > 1"), for records and tables
    (:meth:`search_space`); empty for a method that runs on every layout. A registry entry that
    narrows the layouts must say how (tests/test_search_space.py)."""
    compared: bool = True
    """Whether the suite's method comparisons (``MethodRegistry.compared_names``: the
    harness's all-method experiments) include the method. False for the
    suite's unsliced reference and for baselines that only one paper's protocol runs
    (FlexSP's Ulysses baselines)."""
    cuts_at_sample_boundaries: bool = False
    """Whether the method's data path packs documents into fixed-length samples of the
    training context (Megatron-LM's GPTDataset) and so may cut a document at a sample
    boundary. Under document masks a cut tail no longer attends to its head, and a full-causal
    sample attends to at least its pieces: either way the method's attention work can be below
    the whole documents', so the configuration search's step lower bound prices its batch as
    those pieces (``slimpack.compare.bound_lengths``) to stay a bound (tests/test_search.py
    shows the whole-document bound above a Megatron-LM step)."""
    ring_cp_at_layout_degree: bool = False
    """Whether every group of the method's plans runs ring attention over at least the
    layout's cp ranks (Megatron-LM's CP, a DP-Merge group's larger ring): then every token's K
    and V go round a ring of the layout's degree, and the configuration search's step lower
    bound also holds that traffic (``slimpack.compare.ring_cp_bound``), which prunes layouts
    whose CP ring crosses nodes. Attention moved between stages (SlimPipe's redistribution)
    does not break it: the simulator never takes an op below its ring steps
    (``slimpack.sim.redistribution``). False for methods whose CP degree varies below the
    layout's (Megatron dynamic CP, FlexSP's Ulysses groups); tests/test_search.py checks the
    plans of every method that sets it."""
    pipeline_splits: tuple[str, ...] = ("even",)
    """The ``ParallelSpec.pipeline_split`` values the planner honours; ``plan_method``
    refuses the others rather than plan an even split under another name."""
    paper_zero_stage: int | None = None
    """The ZeRO stage the method's paper ran it with, where that differs from the suite's
    default (1, Megatron-LM's distributed optimizer): ``slimpack compare`` prices the method
    under it unless ``--zero-stage`` says otherwise (FlexSP and its Ulysses baselines: 3)."""

    simulates_to_plan: bool = False
    """Whether the planner simulates candidate plans of one layout to choose among them
    (SlimPipe's slice-count trials, SlimPack's search): each layout then costs several
    simulations, so ``slimpack.compare`` with ``jobs > 1`` starts these methods first and
    the processes finish closer together (wall time only, never a record)."""

    search_layouts: int | None = None
    """The method's deterministic search budget where the harness caps searches (the papers'
    batches of 512 context-length samples, where an exhaustive SlimPack search costs 5 to 65
    minutes a point: ``repro.experiments.common.harness_caps(..., capped=True)``): how many
    layouts its configuration search (``slimpack.compare.best_parallel``, best-estimated
    first) plans and simulates, a count so every machine gets the same records; None (the
    default): every layout the step lower bound does not prune. Only SlimPack, the method
    every ratio is taken *for*, sets one (:data:`HARNESS_SEARCH_LAYOUTS`): a capped SlimPack
    can only understate its ratios, and its capped answers are audited against its
    exhaustive search (``repro.scripts.cap_audit``); a capped baseline could only inflate
    them (with vpp up to 5, Megatron-LM's 3 best-estimated layouts in flexsp-headline were
    interleaved ones 1.45x slower than its best, and FlexSP's ratio rose from 1.31x to
    1.89x). Everywhere else the harness searches every method exhaustively."""

    def __post_init__(self) -> None:
        if self.search_layouts is not None and (
                isinstance(self.search_layouts, bool) or not isinstance(self.search_layouts, int)
                or self.search_layouts < 1):
            raise ValueError(f"MethodSpec {self.name}: search_layouts must be an int >= 1 or "
                             f"None (every layout not pruned), got {self.search_layouts!r}")
        if self.schedule_family not in SCHEDULE_FAMILIES:
            raise ValueError(f"MethodSpec {self.name}: schedule_family must be one of "
                             f"{SCHEDULE_FAMILIES}, got {self.schedule_family!r}")
        if not dataclasses.is_dataclass(self.options):
            raise ValueError(f"MethodSpec {self.name}: options must be a dataclass type")
        if self.paper_zero_stage is not None and self.paper_zero_stage not in ZERO_STAGES:
            raise ValueError(f"MethodSpec {self.name}: paper_zero_stage must be None or one of "
                             f"{ZERO_STAGES}, got {self.paper_zero_stage!r}")
        narrows = self.allows is not any_layout or self.reshape is not keep_layouts
        if narrows and not self.layout_rule:
            raise ValueError(f"MethodSpec {self.name}: allows/reshape narrow the layout space, "
                             "so layout_rule must say how in words (records and tables print "
                             "it as the method's search space)")
        names = {f.name for f in dataclasses.fields(self.options)}
        missing = {"context", "time_limit_s"} - names
        if missing:
            raise ValueError(f"MethodSpec {self.name}: options {self.options.__name__} lack "
                             f"the shared fields {sorted(missing)}")

    def make_options(self, options: dict[str, Any]) -> Any:
        """The options dataclass from keyword values; unknown names list the allowed ones."""
        return build_options(self.options, self.name, options)

    def search_space(self) -> str:
        """The layout space the configuration search gives this method: the shared
        :data:`SEARCH_SPACE`, narrowed by :attr:`layout_rule`."""
        shared = SEARCH_SPACE.describe()
        return f"{shared}; {self.layout_rule}" if self.layout_rule else shared

    def describe_options(self) -> list[tuple[str, str, str]]:
        """(name, type, default) of every option, for ``--list-options``."""
        return describe_options(self.options)

    def candidates(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The method's own layouts among memory-feasible ``candidates``."""
        return [c for c in self.reshape(candidates) if self.allows(c.parallel)]
