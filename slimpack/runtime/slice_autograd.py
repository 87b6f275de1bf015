"""Per-slice autograd: each slice on each model chunk has its own graph (docs/architecture.md, runtime).

Forward of slice X on a chunk takes (hidden in, the cached K/V of the earlier segments of its
sequences as *leaf* tensors) and returns (hidden out or loss, its own K/V per layer). Its own
K/V are cached detached so later slices can attend to them.

Backward of X takes (d hidden out, the dK/dV that later slices accumulated for X's own K/V)
and produces d hidden in plus dK/dV for the earlier slices' K/V (the grads of X's leaves),
which are added to those slices' accumulators. Because a sequence is backwarded in reverse
slice order (Plan.validate), X's accumulator is complete when X runs backward. Nothing is
recomputed, and the backward MicroPacks may group slices differently from the forward ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from slimpack.plan import Slice
from slimpack.runtime.attention import varlen_causal_attention
from slimpack.runtime.context_parallel import LocalExchange
from slimpack.runtime.layout import GroupLayout, SegmentPlace
from slimpack.runtime.model import rope_tables
from slimpack.runtime.stage import ModelChunk

KV = tuple[torch.Tensor, torch.Tensor]


@dataclass(kw_only=True)
class SliceGraph:
    """What a slice's forward keeps for its backward."""

    inp: torch.Tensor | None
    """Leaf hidden input (None on the first block: token ids have no gradient)."""
    out: torch.Tensor
    own_kv: list[KV]
    leaves: list[list[tuple[SegmentPlace, torch.Tensor, torch.Tensor]]]
    """Per layer: (earlier segment, its K leaf, its V leaf)."""
    roots: list[torch.Tensor] = field(default_factory=list)
    """Outputs of collectives that get a zero gradient in backward (see ``backward``)."""
    saved_bytes: int = 0


@dataclass(kw_only=True)
class _SavedBytes:
    """Counts unique storages saved for backward, excluding parameters (model state)."""

    skip: set[int]
    seen: set[int] = field(default_factory=set)
    total: int = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.skip and ptr not in self.seen:
            self.seen.add(ptr)
            self.total += storage.nbytes()
        return t


class SliceRunner:
    """Runs slices forward and backward on one model chunk of one group."""

    def __init__(self, chunk: ModelChunk, layout: GroupLayout, *, attention_backend: str,
                 head_dim: int, loss_scale: float, exchange=None) -> None:
        self.chunk = chunk
        self.exchange = LocalExchange(layout) if exchange is None else exchange
        """How queries meet keys across ranks (context parallelism) or locally (cp = 1)."""
        self.loss_scale = loss_scale
        """1 / (labelled tokens of the whole step): the loss is a token-weighted mean."""
        self.layout = layout
        self.backend = attention_backend
        self.head_dim = head_dim
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in chunk.parameters()}
        self.kv_cache: dict[int, list[KV]] = {}
        self.dkv: dict[int, list[KV]] = {}
        self.graphs: dict[int, SliceGraph] = {}

    # -- memory accounting (bytes this runner holds beyond the model state) ------------------
    def live_bytes(self) -> int:
        graphs = sum(g.saved_bytes for g in self.graphs.values())
        caches = sum(t.numel() * t.element_size() for kvs in (*self.kv_cache.values(),
                                                              *self.dkv.values())
                     for kv in kvs for t in kv)
        return graphs + caches

    # -- forward ---------------------------------------------------------------------------
    def forward(self, sl: Slice, inp: torch.Tensor, *, positions: torch.Tensor,
                labels: torch.Tensor | None) -> torch.Tensor:
        """Run ``sl`` forward; return the detached output (hidden, or the summed loss)."""
        lay = self.layout[sl.slice_id]
        x = inp if self.chunk.is_first else inp.detach().requires_grad_()
        dtype = self.chunk.layers[0].wq.weight.dtype
        cos, sin = rope_tables(positions, self.head_dim, dtype)
        leaves: list[list[tuple[SegmentPlace, torch.Tensor, torch.Tensor]]] = [
            [] for _ in self.chunk.layers]

        own_kv: list[KV | None] = [None] * len(self.chunk.layers)
        roots: list[torch.Tensor] = []

        def attend_for_layer(layer: int):
            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                # Every earlier segment of the slice's sequences, as leaves made from this
                # rank's cached rows of it: their .grad is the dK/dV this slice owes it.
                prefix = []
                for earlier in dict.fromkeys(e for pre in lay.prefixes for e in pre):
                    kc, vc = self.kv_cache[earlier.slice_id][layer]
                    rows = self.exchange.cached_rows(earlier)
                    kl = kc[rows].detach().requires_grad_()
                    vl = vc[rows].detach().requires_grad_()
                    leaves[layer].append((earlier, kl, vl))
                    prefix.append((earlier, kl, vl))
                # cp > 1: the exchange brings the slice's and the prefix's keys (Ulysses:
                # also the queries) of the whole cp group; cp = 1 returns them as they are.
                ex = self.exchange.exchange(sl.slice_id, q, k, v, prefix)
                own_kv[layer] = ex.cache
                roots.extend(ex.roots)
                ks, vs = [], []
                for piece in ex.pieces:
                    seg = lay.segments[piece.segment]
                    for earlier in lay.prefixes[piece.segment]:
                        kp, vp = ex.prefix[earlier]
                        ks.append(kp)
                        vs.append(vp)
                    ks.append(ex.k[seg.offset:piece.hi])
                    vs.append(ex.v[seg.offset:piece.hi])
                if not ex.pieces:  # this cp rank holds no row of the slice
                    return self.exchange.finish(sl.slice_id, ex.q * 0)
                kk = torch.cat(ks) if len(ks) > 1 else ks[0]
                vv = torch.cat(vs) if len(vs) > 1 else vs[0]
                o = varlen_causal_attention(ex.q, kk, vv, ex.varlen, backend=self.backend)
                return self.exchange.finish(sl.slice_id, o)
            return attend

        counter = _SavedBytes(skip=self._param_ptrs)
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
            out, _ = self.chunk(x, cos=cos, sin=sin, attend_for_layer=attend_for_layer,
                                labels=labels)
            if self.chunk.is_last:
                out = out * self.loss_scale
        if lay.has_consumers:
            self.kv_cache[sl.slice_id] = [(k.detach(), v.detach()) for k, v in own_kv]
        self.graphs[sl.slice_id] = SliceGraph(
            inp=None if self.chunk.is_first else x, out=out,
            own_kv=own_kv if lay.has_consumers else [], leaves=leaves, roots=roots,
            saved_bytes=counter.total)
        return out.detach()

    # -- backward --------------------------------------------------------------------------
    def backward(self, sl: Slice, d_out: torch.Tensor | None) -> torch.Tensor | None:
        """Run ``sl`` backward with ``d_out`` (None when ``out`` is the loss); return d input
        (None on the first block). Frees the slice's graph, cache and accumulator."""
        graph = self.graphs.pop(sl.slice_id)
        outputs: list[torch.Tensor] = [graph.out]
        grads: list[torch.Tensor | None] = [d_out]
        acc = self.dkv.pop(sl.slice_id, None)
        if acc is not None:
            for (k, v), (dk, dv) in zip(graph.own_kv, acc, strict=True):
                outputs += [k, v]
                grads += [dk, dv]
        # Collective outputs with zero gradient: a cp rank whose queries do not use them
        # still runs their backward collective with the rest of its group.
        outputs += graph.roots
        grads += [torch.zeros_like(t) for t in graph.roots]
        torch.autograd.backward(outputs, grads)
        for layer, layer_leaves in enumerate(graph.leaves):
            for earlier, kl, vl in layer_leaves:
                dk, dv = self._accumulator(earlier.slice_id, layer)
                rows = self.exchange.cached_rows(earlier)
                dk[rows] += kl.grad
                dv[rows] += vl.grad
        self.kv_cache.pop(sl.slice_id, None)  # every later slice has run its backward
        return None if graph.inp is None else graph.inp.grad

    def _accumulator(self, slice_id: int, layer: int) -> KV:
        if slice_id not in self.dkv:
            self.dkv[slice_id] = [(torch.zeros_like(k), torch.zeros_like(v))
                                  for k, v in self.kv_cache[slice_id]]
        return self.dkv[slice_id][layer]

    def pending(self) -> list[int]:
        """Slices forwarded but not yet backwarded (must be empty at the end of a phase)."""
        return sorted(self.graphs)
