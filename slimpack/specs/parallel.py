"""Parallel degrees and every rank/group question about them (``ParallelSpec``).

Ranks are laid out in Megatron-LM's default order, tensor-parallel fastest:
``rank = tp + TP * (cp + CP * (dp + DP * pp))``. So a TP group is contiguous (inside a
node when TP <= GPUs per node), then CP, then DP, and pipeline stages are farthest apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.specs._validate import require_int, require_positive
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class RankCoords:
    dp: int
    pp: int
    cp: int
    tp: int


PIPELINE_SPLITS = ("even", "embedding-and-loss")
"""How the decoder layers are split over the ``pp*vpp`` virtual stages: ``even`` (every stage
the same count); ``embedding-and-loss`` (Megatron-Core's ``account_for_embedding_in_pipeline_
split`` and ``account_for_loss_in_pipeline_split``: the embedding and the loss each count as
one layer, so ``num_layers + 2`` is split evenly and the first and last virtual stages hold one
decoder layer fewer)."""


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """Degrees of tensor, context, pipeline and data parallelism (world = tp*cp*pp*dp)."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    vpp: int = 1
    """Virtual pipeline stages (model chunks) per pipeline rank."""
    ep: int = 1
    """Expert parallelism, carved out of dp*cp (MoE only)."""
    gpus_per_node: int = 8
    world_size: int | None = None
    """If given, must equal tp*cp*pp*dp; catches a configuration meant for another cluster."""
    pipeline_split: str = "even"
    """One of :data:`PIPELINE_SPLITS`: the decoder layers of each virtual stage
    (:meth:`virtual_stage_layers`)."""

    def __post_init__(self) -> None:
        for f in ("tp", "cp", "pp", "dp", "vpp", "ep", "gpus_per_node"):
            # tp=2.5 would otherwise flow into rank arithmetic; numpy ints become Python ints.
            object.__setattr__(self, f, require_int("ParallelSpec", f, getattr(self, f)))
            require_positive("ParallelSpec", f, getattr(self, f))
        if self.world_size is not None:
            object.__setattr__(self, "world_size",
                               require_int("ParallelSpec", "world_size", self.world_size))
        product = self.tp * self.cp * self.pp * self.dp
        if self.world_size is not None and self.world_size != product:
            raise ValueError(
                f"ParallelSpec.world_size={self.world_size} but tp*cp*pp*dp = "
                f"{self.tp}*{self.cp}*{self.pp}*{self.dp} = {product}; the degrees must "
                f"multiply to the world size"
            )
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ParallelSpec.ep ({self.ep}) must divide dp*cp ({self.dp * self.cp})")
        if self.pipeline_split not in PIPELINE_SPLITS:
            raise ValueError(f"ParallelSpec.pipeline_split must be one of "
                             f"{', '.join(PIPELINE_SPLITS)}; got {self.pipeline_split!r}")

    @classmethod
    def for_world(cls, world_size: int, *, tp: int = 1, cp: int = 1, pp: int = 1,
                  vpp: int = 1, ep: int = 1, gpus_per_node: int = 8,
                  pipeline_split: str = "even") -> ParallelSpec:
        """Derive dp from the world size; raise if tp*cp*pp does not divide it."""
        require_int("ParallelSpec", "world_size", world_size)
        require_positive("ParallelSpec", "world_size", world_size)
        for name, value in (("tp", tp), ("cp", cp), ("pp", pp)):
            require_int("ParallelSpec", name, value)  # before the divisibility arithmetic
        model_parallel = tp * cp * pp
        if model_parallel <= 0 or world_size % model_parallel:
            raise ValueError(
                f"ParallelSpec: tp*cp*pp = {tp}*{cp}*{pp} = {model_parallel} must divide "
                f"world_size {world_size}"
            )
        return cls(tp=tp, cp=cp, pp=pp, dp=world_size // model_parallel, vpp=vpp, ep=ep,
                   gpus_per_node=gpus_per_node, world_size=world_size,
                   pipeline_split=pipeline_split)

    # -- sizes ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def model_parallel_size(self) -> int:
        """GPUs in one model replica (tp*cp*pp)."""
        return self.tp * self.cp * self.pp

    def validate_for_model(self, model: ModelSpec) -> None:
        """Raise ValueError if these degrees cannot shard ``model``."""
        if model.num_heads % self.tp or model.num_kv_heads % self.tp and self.tp % model.num_kv_heads:
            raise ValueError(
                f"ParallelSpec.tp={self.tp} must divide num_heads={model.num_heads} and either "
                f"divide or be a multiple of num_kv_heads={model.num_kv_heads} ({model.name})"
            )
        self.virtual_stage_layers(model.num_layers, name=model.name)
        if not model.is_moe and self.ep != 1:
            raise ValueError(f"ParallelSpec.ep={self.ep} needs an MoE model; {model.name} is "
                             f"dense (num_experts=1); allowed: ep=1")
        if model.is_moe and model.num_experts % self.ep:
            raise ValueError(f"ParallelSpec.ep={self.ep} must divide num_experts={model.num_experts}")

    def virtual_stage_layers(self, num_layers: int, *, name: str = "") -> tuple[int, ...]:
        """Decoder layers of each virtual stage (``chunk*pp + stage``) under
        :attr:`pipeline_split`; ValueError when the split does not come out whole."""
        stages = self.pp * self.vpp
        where = f" ({name})" if name else ""
        if self.pipeline_split == "even":
            if num_layers % stages:
                raise ValueError(f"ParallelSpec.pp*vpp = {self.pp}*{self.vpp} must divide "
                                 f"num_layers={num_layers}{where}")
            return (num_layers // stages,) * stages
        counted = num_layers + 2  # the embedding and the loss count as a layer each
        if counted % stages or counted // stages - (2 if stages == 1 else 1) < 1:
            raise ValueError(f"ParallelSpec.pp*vpp = {self.pp}*{self.vpp} must divide "
                             f"num_layers + 2 = {counted} (pipeline_split "
                             f"'embedding-and-loss') and leave the first and last virtual "
                             f"stages a layer each{where}")
        layers = [counted // stages] * stages
        layers[0] -= 1
        layers[-1] -= 1
        return tuple(layers)

    # -- rank <-> coordinates ---------------------------------------------------------------
    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world}), got {rank}")
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return RankCoords(dp=dp, pp=pp, cp=cp, tp=tp)

    def rank(self, *, dp: int = 0, pp: int = 0, cp: int = 0, tp: int = 0) -> int:
        for name, value, size in (("dp", dp, self.dp), ("pp", pp, self.pp),
                                  ("cp", cp, self.cp), ("tp", tp, self.tp)):
            if not 0 <= value < size:
                raise ValueError(f"{name} coordinate must be in [0, {size}), got {value}")
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def _group(self, rank: int, axis: str) -> tuple[int, ...]:
        c = self.coords(rank)
        base = {"dp": c.dp, "pp": c.pp, "cp": c.cp, "tp": c.tp}
        size = getattr(self, axis)
        return tuple(self.rank(**{**base, axis: i}) for i in range(size))

    def tp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, "tp")

    def cp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, "cp")

    def dp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, "dp")

    def pp_group(self, rank: int) -> tuple[int, ...]:
        return self._group(rank, "pp")

    def replica_ranks(self, dp: int) -> tuple[int, ...]:
        """All ranks of data-parallel replica ``dp``, ordered by (pp, cp, tp)."""
        return tuple(self.rank(dp=dp, pp=p, cp=c, tp=t)
                     for p in range(self.pp) for c in range(self.cp) for t in range(self.tp))

    def all_groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every distinct group along ``axis`` ("tp", "cp", "dp" or "pp")."""
        if axis not in ("tp", "cp", "dp", "pp"):
            raise ValueError(f"axis must be one of tp, cp, dp, pp; got {axis!r}")
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world):
            seen.setdefault(self._group(r, axis), None)
        return list(seen)

    # -- placement --------------------------------------------------------------------------
    def node_of(self, rank: int) -> int:
        self.coords(rank)  # range check
        return rank // self.gpus_per_node

    def same_node(self, ranks: tuple[int, ...] | list[int]) -> bool:
        """True when every rank in ``ranks`` sits on one node (so NVLink carries their traffic)."""
        return len({self.node_of(r) for r in ranks}) <= 1

    def describe(self) -> str:
        extra = f" vpp={self.vpp}" if self.vpp > 1 else ""
        if self.pipeline_split != "even":
            extra += f" split={self.pipeline_split}"
        return f"tp={self.tp} cp={self.cp} pp={self.pp} dp={self.dp}{extra}"

    def to_dict(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {
            "tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp, "vpp": self.vpp,
            "ep": self.ep, "gpus_per_node": self.gpus_per_node}
        if self.pipeline_split != "even":  # only when set: records and plans keep their bytes
            out["pipeline_split"] = self.pipeline_split
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ParallelSpec:
        allowed = {"tp", "cp", "pp", "dp", "vpp", "ep", "gpus_per_node", "world_size",
                   "pipeline_split"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"ParallelSpec: unknown fields {sorted(unknown)}; allowed {sorted(allowed)}")
        return cls(**data)
