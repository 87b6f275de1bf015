"""What the runtime executes, field by field: a plan field it cannot honour is refused here,
before any process starts, with a ValueError naming the group, the field, its value and what
is allowed (docs/architecture.md, runtime: "what the runtime executes").

The rule is refuse, never ignore: a plan that asks for something the executor would silently
skip (an offload share, a recompute mode, a sharding) would run a different training step
than the one the simulator priced.
"""

from __future__ import annotations

from collections.abc import Sequence

from slimpack.plan import Group, Plan
from slimpack.runtime.cp_checks import check_cp_group
from slimpack.specs.model import ModelSpec
from slimpack.specs.training import TrainingSpec

EXECUTED_RECOMPUTE = ("none", "selective", "full")
"""selective: core attention recomputed in backward; full: each decoder layer recomputed."""

EXECUTED_ZERO_STAGES = (0, 1, 3)
"""``Plan.zero_stage`` values the runtime executes. 0 and 1 (and None, no stated stage): one
data-parallel gradient all-reduce at the end of the step. The runtime takes no optimizer step,
so it holds no optimizer states: ZeRO-1's sharding of those states (and its reduce-scatter
instead of all-reduce, the same sums) leaves the step it runs unchanged. 3: parameters and
gradients sharded over the data-parallel ranks, all-gathered before each plan phase and the
phase's gradients reduce-scattered after it (:mod:`slimpack.runtime.zero`)."""


def as_run_training(dtype: str) -> TrainingSpec:
    """The recipe the runtime executes, for a simulator that prices a run beside its
    measurement: no optimizer state and no optimizer step (:data:`EXECUTED_ZERO_STAGES`),
    gradients kept in the parameters' ``dtype`` ("bf16" on CUDA, "fp32" on CPU)."""
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be bf16 or fp32 (the runtime's), got {dtype!r}")
    return TrainingSpec(optimizer="none", grad_dtype=dtype)


def refuse(group: Group | None, field: str, value: object, allowed: str) -> ValueError:
    """The one message shape every refusal uses (tests match on the field name)."""
    where = f"group {group.group_id}: " if group is not None else "plan: "
    return ValueError(f"{where}{field}={value!r} is not executed by the runtime; allowed: "
                      f"{allowed}")


def check_model_supported(model: ModelSpec) -> None:
    if model.is_moe:
        raise ValueError(f"model {model.name}: num_experts={model.num_experts} is not executed "
                         f"by the runtime; allowed: 1 (dense models)")
    if model.mlp != "swiglu":
        raise ValueError(f"model {model.name}: mlp={model.mlp!r} is not executed by the "
                         f"runtime; allowed: 'swiglu'")
    # The runtime's decoder layer always ropes queries and keys; a model with learned
    # absolute positions (GPT-3) would silently train with RoPE instead.
    if not model.rope:
        raise ValueError(f"model {model.name}: rope=False is not executed by the runtime; "
                         f"allowed: True (rotary embeddings in every layer)")


def check_plan_fields(plan: Plan) -> None:
    """Plan-level fields the executor does not implement."""
    if plan.parallel.ep != 1:
        raise refuse(None, "parallel.ep", plan.parallel.ep,
                     "1 (the runtime executes dense models; expert parallelism is simulated "
                     "only)")
    if plan.zero_stage is not None and plan.zero_stage not in EXECUTED_ZERO_STAGES:
        raise refuse(None, "zero_stage", plan.zero_stage,
                     f"None or one of {EXECUTED_ZERO_STAGES} (0/1: gradients all-reduced, no "
                     f"optimizer step; 3: parameters sharded over data parallelism)")
    # SlimPipe's attention redistribution ships KV between paired pipeline ranks
    # (slimpack.runtime.redistribution); with one stage there is no pair, so the flag
    # describes the plain computation. Executed lane by lane (tp and ring-CP ranks pair by
    # in-stage offset) under every recompute mode. Ulysses CP is refused: the simulator
    # prices each cp rank's row pieces (the ring layout, sim/redistribution.py), while a
    # Ulysses rank attends every row of the slice with heads/cp heads.
    if plan.attention_redistribution:
        for g in plan.groups():
            if g.pp > 1 and g.cp > 1 and g.cp_kind != "ring":
                raise refuse(None, "attention_redistribution", True,
                             f"false when a group at pp > 1 has cp > 1 with cp_kind other "
                             f"than 'ring' (group {g.group_id}: cp={g.cp}, "
                             f"cp_kind={g.cp_kind!r}); true otherwise")


def check_zero_stage(plan: Plan, model: ModelSpec) -> None:
    """ZeRO-3 shards each rank's parameters over the ranks holding the same stage; tied
    embedding copies on the first and last stage (pp > 1) sit in different ranks' shards, and
    summing their gradients shard by shard is not implemented."""
    if plan.zero_stage == 3 and model.tied_embeddings and any(g.pp > 1 for g in plan.groups()):
        raise refuse(None, "zero_stage", 3, f"0 or 1 for {model.name} (tied embeddings) at "
                                            f"pp > 1; 3 with untied embeddings or pp = 1")


def check_group_fields(group: Group, model: ModelSpec) -> None:
    """Per-group fields: degrees and features the executor runs, everything else refused."""
    if group.tp != 1:
        check_tensor_parallel(group, model)
    # With cp = 1 there is nothing to shard or exchange, so every cp_sharding and cp_kind
    # describes the same computation: accepted, not ignored.
    check_cp_group(group, model)
    if group.recompute not in EXECUTED_RECOMPUTE:
        raise refuse(group, "recompute", group.recompute, str(EXECUTED_RECOMPUTE))
    if not 0.0 <= group.offload <= 1.0:
        raise refuse(group, "offload", group.offload, "a share in [0, 1]")
    if group.vocab_parallel_pp and group.pp > 1:
        check_vocab_over_pp(group, model)


def check_vocab_over_pp(group: Group, model: ModelSpec) -> None:
    """The LM head spread over the pipeline ranks (:mod:`slimpack.runtime.vocab_parallel`):
    untied embeddings only, as the simulator prices it (``stage_state_bytes`` spreads only an
    untied head; a tied one would need each block's gradient summed into the embedding on the
    first stage, which is not implemented), and a vocabulary that splits into ``pp*tp``
    equal blocks."""
    if model.tied_embeddings:
        raise refuse(group, "vocab_parallel_pp", True,
                     f"false for {model.name} (tied embeddings) when pp > 1; true with untied "
                     f"embeddings")
    blocks = group.pp * group.tp
    if model.vocab_size % blocks:
        raise refuse(group, "vocab_parallel_pp", True,
                     f"false when pp*tp = {blocks} does not divide vocab_size="
                     f"{model.vocab_size} of {model.name}")


def check_vocab_layout(groups: Sequence[Group]) -> None:
    """A rank keeps its block of the LM head for the whole step: at pp > 1 every group
    spreads the head over the pipeline ranks or none does."""
    flags = sorted({g.vocab_parallel_pp for g in groups if g.pp > 1})
    if len(flags) > 1:
        raise refuse(None, "vocab_parallel_pp", flags,
                     "one value for all groups at pp > 1 (a rank keeps its head block for the "
                     "step)")


def check_tensor_parallel(group: Group, model: ModelSpec) -> None:
    """tp must split heads, the MLP and the vocabulary evenly (no padded vocabulary), and
    split the kv heads or be a multiple of their number (each kv head then replicated)."""
    tp = group.tp
    for name, size in (("num_heads", model.num_heads), ("ffn_hidden", model.ffn_hidden),
                       ("vocab_size", model.vocab_size)):
        if size % tp:
            raise refuse(group, "tp", tp, f"a divisor of {name}={size} of {model.name} "
                                          f"(heads, MLP and vocabulary split evenly)")
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        raise refuse(group, "tp", tp, f"a divisor or a multiple of num_kv_heads={kv} of "
                                      f"{model.name}")


def check_tp_layout(groups: Sequence[Group]) -> None:
    """A rank keeps its weight shard for the whole step: one tp for every group, and each
    rank's tensor-parallel peers (consecutive ranks of a stage, ``Group.ranks``) the same in
    every group it is in."""
    tps = sorted({g.tp for g in groups})
    if len(tps) > 1:
        raise refuse(None, "tp", tps, "one tp for all groups (a rank keeps its weight shard "
                                      "for the step)")
    peers: dict[int, tuple[tuple[int, ...], int]] = {}
    for g in groups:
        for start in range(0, len(g.ranks), g.tp):
            ranks = tuple(g.ranks[start:start + g.tp])
            for rank in ranks:
                prev = peers.setdefault(rank, (ranks, g.group_id))
                if prev[0] != ranks:
                    raise refuse(g, "ranks", list(g.ranks),
                                 f"rank {rank}'s tensor-parallel peers {list(prev[0])} (as in "
                                 f"group {prev[1]}) in every group")
