"""Per-slice autograd: each slice on each model chunk has its own graph (docs/architecture.md, runtime).

Forward of slice X on a chunk takes (hidden in, the cached K/V of the earlier segments of its
sequences as *leaf* tensors) and returns (hidden out or loss, its own K/V per layer). Its own
K/V are cached detached so later slices can attend to them.

Backward of X takes (d hidden out, the dK/dV that later slices accumulated for X's own K/V)
and produces d hidden in plus dK/dV for the earlier slices' K/V (the grads of X's leaves),
which are added to those slices' accumulators. Because a sequence is backwarded in reverse
slice order (Plan.validate), X's accumulator is complete when X runs backward. The backward
MicroPacks may group slices differently from the forward ones. What the forward keeps (all of
it, or recompute and offload as the group says) is :mod:`slimpack.runtime.activations`.

How queries meet keys is the group's exchange (:mod:`slimpack.runtime.context_parallel`):
locally at cp = 1; with cp > 1 the exchange gathers the slice's K/V (ring) or swaps heads for
rows (Ulysses). A slice's "own K/V" is always what the exchange returns (the whole slice's
keys, of this rank's heads), so the cache, the dK/dV accumulators and the backward roots are
in the slice's buffer order whatever the parallelism. Under full recompute a layer's forward,
exchange included, runs again in backward; its collectives then run in the same order on every
rank of the group, because every rank runs the same op list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from slimpack.plan import Slice
from slimpack.runtime.activations import ActivationPolicy, SavedTensors
from slimpack.runtime.attention import varlen_causal_attention
from slimpack.runtime.context_parallel import LocalExchange
from slimpack.runtime.layout import GroupLayout, SegmentPlace
from slimpack.runtime.model import rope_tables
from slimpack.runtime.stage import ModelChunk

KV = tuple[torch.Tensor, torch.Tensor]
_Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""A layer's attention call; after each call its ``kv`` attribute holds the exchanged K/V."""


@dataclass(kw_only=True)
class SliceGraph:
    """What a slice's forward keeps for its backward."""

    inp: torch.Tensor | None
    """Leaf hidden input (None on the first block: token ids have no gradient)."""
    out: torch.Tensor
    own_kv: list[KV]
    leaves: list[list[tuple[SegmentPlace, torch.Tensor, torch.Tensor]]]
    """Per layer: (earlier segment, its K leaf, its V leaf)."""
    saved_bytes: int = 0
    """Device bytes autograd keeps for this graph (offloaded ones excluded)."""
    offloaded_bytes: int = 0


class SliceRunner:
    """Runs slices forward and backward on one model chunk of one group."""

    def __init__(self, chunk: ModelChunk, layout: GroupLayout, *, attention_backend: str,
                 head_dim: int, loss_scale: float,
                 policy: ActivationPolicy | None = None, exchange=None) -> None:
        self.chunk = chunk
        self.policy = policy or ActivationPolicy()
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

        saved = SavedTensors(skip=self._param_ptrs, offload=self.policy.offload)
        made: list[dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]] = [
            {} for _ in self.chunk.layers]

        def prefix_leaf(layer: int, earlier: SegmentPlace) -> tuple[torch.Tensor, torch.Tensor]:
            # Made once per layer and segment: full recompute calls attend again in backward
            # and must reuse these leaves, whose .grad is the dK/dV this slice owes the
            # earlier ones; two query pieces of one segment (zigzag) share them too.
            key = (earlier.slice_id, earlier.offset)
            if key not in made[layer]:
                kc, vc = self.kv_cache[earlier.slice_id][layer]
                # Views of the cache made into leaves: no copy.
                made[layer][key] = (kc[earlier.rows].detach().requires_grad_(),
                                    vc[earlier.rows].detach().requires_grad_())
                leaves[layer].append((earlier, *made[layer][key]))
            return made[layer][key]

        def attend_for_layer(layer: int) -> _Attend:
            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                q, k, v, pieces, varlen = self.exchange.exchange(sl.slice_id, q, k, v)
                attend.kv = (k, v)
                saved.keep_on_device(k, v)  # the K/V cache stays on the device
                ks, vs = [], []
                for piece in pieces:
                    seg = lay.segments[piece.segment]
                    for earlier in lay.prefixes[piece.segment]:
                        kl, vl = prefix_leaf(layer, earlier)
                        ks.append(kl)
                        vs.append(vl)
                    ks.append(k[seg.offset:piece.hi])
                    vs.append(v[seg.offset:piece.hi])
                if not pieces:  # this cp rank holds no row of the slice
                    return self.exchange.finish(sl.slice_id, q * 0)
                kk = torch.cat(ks) if len(ks) > 1 else ks[0]
                vv = torch.cat(vs) if len(vs) > 1 else vs[0]
                core = self.policy.wrap_attention(
                    lambda qq, kx, vx: varlen_causal_attention(qq, kx, vx, varlen,
                                                               backend=self.backend))
                return self.exchange.finish(sl.slice_id, core(q, kk, vv))
            return attend

        def run_layer(layer, x: torch.Tensor, *rest):  # noqa: ANN001, ANN202 - a layer call
            def body(xin: torch.Tensor, *args):  # noqa: ANN202
                out, _, _ = layer(xin, *args)
                return (out, *args[-1].kv)  # the exchanged K/V, not the layer's local rows
            return self.policy.run_layer(body, x, *rest)

        with saved.hooks():
            out, own_kv = self.chunk(x, cos=cos, sin=sin, attend_for_layer=attend_for_layer,
                                     labels=labels, run_layer=run_layer)
            if self.chunk.is_last:
                out = out * self.loss_scale
        if lay.has_consumers:
            self.kv_cache[sl.slice_id] = [(k.detach(), v.detach()) for k, v in own_kv]
        # A collective exchange keeps its K/V as backward roots even without consumers, so
        # every cp rank runs each layer's reduce-scatter, whether or not it has queries.
        keep = lay.has_consumers or self.exchange.collective
        self.graphs[sl.slice_id] = SliceGraph(
            inp=None if self.chunk.is_first else x, out=out,
            own_kv=own_kv if keep else [], leaves=leaves,
            saved_bytes=saved.device_bytes, offloaded_bytes=saved.offloaded_bytes)
        return out.detach()

    # -- backward --------------------------------------------------------------------------
    def backward(self, sl: Slice, d_out: torch.Tensor | None) -> torch.Tensor | None:
        """Run ``sl`` backward with ``d_out`` (None when ``out`` is the loss); return d input
        (None on the first block). Frees the slice's graph, cache and accumulator."""
        graph = self.graphs.pop(sl.slice_id)
        outputs: list[torch.Tensor] = [graph.out]
        grads: list[torch.Tensor | None] = [d_out]
        acc = self.dkv.pop(sl.slice_id, None)
        if acc is None and graph.own_kv and self.exchange.collective:
            acc = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in graph.own_kv]
        if acc is not None:
            for (k, v), (dk, dv) in zip(graph.own_kv, acc, strict=True):
                outputs += [k, v]
                grads += [dk, dv]
        torch.autograd.backward(outputs, grads)
        for layer, layer_leaves in enumerate(graph.leaves):
            for earlier, kl, vl in layer_leaves:
                dk, dv = self._accumulator(earlier.slice_id, layer)
                dk[earlier.rows] += kl.grad
                dv[earlier.rows] += vl.grad
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
