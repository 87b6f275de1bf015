"""The model chunks one pipeline rank holds, split by layer (docs/architecture.md, runtime).

With ``pp`` pipeline ranks and ``vpp`` virtual stages the layers form ``pp*vpp`` blocks, equal
unless the plan gives each block's count (``Group.virtual_stage_layers``);
model chunk ``c`` of pipeline rank ``s`` holds block ``c*pp + s`` (Megatron's interleaving).
Block 0 also holds the embedding, the last block the final norm and LM head. With tied
embeddings and more than one block, the first and last blocks each keep a copy of the shared
matrix (same name, same init) and the executor sums their gradients. With the head spread over
the pipeline ranks (``vocab_parallel_pp``) every rank's last chunk holds a block of it, made by
``make_head`` (:mod:`slimpack.runtime.vocab_parallel`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from slimpack.runtime.model import Attend, DecoderLayer, LMHead, init_named
from slimpack.specs.model import ModelSpec

EMBED = "embed.weight"


def layer_block(spec: ModelSpec, num_blocks: int, block: int,
                layers: Sequence[int] | None = None) -> range:
    """The layer indices of ``block``: the ``layers[block]`` after the earlier blocks', or
    one of ``num_blocks`` equal blocks."""
    if layers is not None:
        if len(layers) != num_blocks or sum(layers) != spec.num_layers:
            raise ValueError(f"block layers {list(layers)} must be {num_blocks} counts adding "
                             f"up to num_layers = {spec.num_layers} ({spec.name})")
        first = sum(layers[:block])
        return range(first, first + layers[block])
    if spec.num_layers % num_blocks:
        raise ValueError(f"pp*vpp = {num_blocks} must divide num_layers = {spec.num_layers} "
                         f"({spec.name})")
    per = spec.num_layers // num_blocks
    return range(block * per, (block + 1) * per)


class ModelChunk(nn.Module):
    """One block of consecutive layers, plus the embedding and/or head when it owns them."""

    def __init__(self, spec: ModelSpec, *, block: int, num_blocks: int, seed: int,
                 device: torch.device, dtype: torch.dtype,
                 make_head: Callable[[], nn.Module] | None = None,
                 layers: Sequence[int] | None = None) -> None:
        super().__init__()
        self.block = block
        self.is_first = block == 0
        self.is_last = block == num_blocks - 1
        self.layer_ids = tuple(layer_block(spec, num_blocks, block, layers))
        kw = {"device": device, "dtype": dtype}
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden, **kw) if self.is_first else None
        self.layers = nn.ModuleList(DecoderLayer(spec, **kw) for _ in self.layer_ids)
        self.head = None
        if make_head is not None:  # a block of a head spread over the pipeline ranks
            self.head = make_head()
        elif self.is_last:
            tied = self.embed.weight if (spec.tied_embeddings and self.embed is not None) else None
            self.head = LMHead(spec, tied_weight=tied, **kw)
        self._global = self._global_names(spec)
        for local, param in self.named_parameters():
            init_named(param, self._global[local], seed)
        if make_head is not None:
            self.head.init_parameters(seed)

    def _global_names(self, spec: ModelSpec) -> dict[str, str]:
        names = {}
        for local, _ in self.named_parameters():
            if local.startswith("layers."):
                _, idx, rest = local.split(".", 2)
                names[local] = f"layers.{self.layer_ids[int(idx)]}.{rest}"
            elif local == "embed.weight":
                names[local] = EMBED
            elif local == "head.weight":
                names[local] = EMBED if spec.tied_embeddings else "head.weight"
            else:  # head.final_norm.weight
                names[local] = local.removeprefix("head.")
        return names

    def global_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name in the unsliced model, parameter): the key gradients are compared on."""
        return [(self._global[local], p) for local, p in self.named_parameters()]

    def forward(self, inp: torch.Tensor, *, cos: torch.Tensor, sin: torch.Tensor,
                attend_for_layer: Callable[[int], Attend],
                labels: torch.Tensor | None = None, run_layer: Callable | None = None,
                head_comm: Any = None,
                ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Token ids (first block) or hidden ``[T, hidden]`` in; hidden out, or the summed
        loss (last block, fp32 scalar). Also returns each layer's own (k, v).
        ``run_layer(index, layer, *args)`` calls the chunk's ``index``-th layer (full recompute
        wraps it in a checkpoint);
        ``head_comm``: the group's process groups for a head spread over the pipeline."""
        x = self.embed(inp) if self.embed is not None else inp
        kvs = []
        for i, layer in enumerate(self.layers):
            args = (x, cos, sin, attend_for_layer(i))
            x, k, v = run_layer(i, layer, *args) if run_layer is not None else layer(*args)
            kvs.append((k, v))
        if self.is_last:
            assert labels is not None, "the last block needs labels"
            x = (self.head.loss_sum(x, labels) if head_comm is None
                 else self.head.loss_sum(x, labels, head_comm))
        return x, kvs


def build_chunks(spec: ModelSpec, *, pp: int, vpp: int, stage: int, seed: int,
                 device: torch.device, dtype: torch.dtype,
                 make_head: Callable[[bool], nn.Module] | None = None,
                 layers: Sequence[int] | None = None) -> list[ModelChunk]:
    """The ``vpp`` chunks of pipeline rank ``stage``, chunk c holding block ``c*pp + stage``;
    ``make_head(is_last_block)`` builds the last chunk's block of a head spread over pp;
    ``layers``: each block's layer count (None: equal blocks)."""
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in [0, {pp}), got {stage}")
    return [ModelChunk(spec, block=c * pp + stage, num_blocks=pp * vpp, seed=seed,
                       device=device, dtype=dtype,
                       make_head=last_chunk_head(make_head, c, vpp, stage, pp), layers=layers)
            for c in range(vpp)]


def last_chunk_head(make_head: Callable[[bool], nn.Module] | None, chunk: int, vpp: int,
                    stage: int, pp: int) -> Callable[[], nn.Module] | None:
    """``make_head`` for a rank's last chunk (told whether it is the model's last block)."""
    if make_head is None or chunk != vpp - 1:
        return None
    return lambda: make_head(stage == pp - 1)
