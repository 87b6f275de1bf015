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
rows (Ulysses). A slice caches what the exchange says (ring: this rank's rows of its K/V;
Ulysses: its head shard of every row; cp = 1: all of it) and the layer returns exactly that
as its own K/V, so the backward roots and the dK/dV accumulators match the cache. Under full
recompute a layer's forward, exchange included, runs again in backward; its collectives then
run in the same order on every rank of the group, because every rank runs the same op list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from slimpack.plan import Slice
from slimpack.runtime.activations import ActivationPolicy, SavedTensors
from slimpack.runtime.attention import varlen_causal_attention
from slimpack.runtime.context_parallel import LocalExchange, PrefixLeaf
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
    cache_bytes_in_saved: int = 0
    """Bytes of the slice's own K/V cache that lie in storages ``saved_bytes`` already
    counts (attention saved the very K/V tensors the cache keeps), so they are held once."""


class SliceRunner:
    """Runs slices forward and backward on one model chunk of one group."""

    def __init__(self, chunk: ModelChunk, layout: GroupLayout, *, attention_backend: str,
                 head_dim: int, loss_scale: float,
                 policy: ActivationPolicy | None = None, exchange=None, head_comm=None,
                 splits: dict | None = None) -> None:
        self.chunk = chunk
        self.splits = splits or {}
        """Slice id -> its attention split with a paired pipeline rank (SlimPipe's
        redistribution, :mod:`slimpack.runtime.redistribution`); other slices run locally."""
        self.head_comm = head_comm
        """The group's head process groups when the LM head is spread over the pipeline
        ranks (:mod:`slimpack.runtime.vocab_parallel`), else None."""
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
        # A cached K/V that attention also saved is one storage: count it once.
        graphs = sum(g.saved_bytes - (g.cache_bytes_in_saved if sid in self.kv_cache else 0)
                     for sid, g in self.graphs.items())
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
        made: list[list[PrefixLeaf] | None] = [None for _ in self.chunk.layers]

        def prefix_leaves(layer: int) -> list[PrefixLeaf]:
            # Every earlier segment of the slice's sequences, as leaves made from this rank's
            # cached rows of it: their .grad is the dK/dV this slice owes it. Made once per
            # layer: full recompute calls attend again in backward and must reuse them.
            if made[layer] is None:
                made[layer] = []
                for earlier in dict.fromkeys(e for pre in lay.prefixes for e in pre):
                    kc, vc = self.kv_cache[earlier.slice_id][layer]
                    rows = self.exchange.cached_rows(earlier)
                    leaf = (earlier, kc[rows].detach().requires_grad_(),
                            vc[rows].detach().requires_grad_())
                    made[layer].append(leaf)
                    leaves[layer].append(leaf)
            return made[layer]

        def attend_for_layer(layer: int) -> _Attend:
            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                # cp > 1: the exchange brings the slice's and the prefix's keys (Ulysses:
                # also the queries) of the whole cp group; cp = 1 returns them as they are.
                ex = self.exchange.exchange(sl.slice_id, q, k, v, prefix_leaves(layer))
                attend.kv = ex.cache
                saved.keep_on_device(*ex.cache)  # the K/V cache stays on the device
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
                    o = ex.q * 0
                else:
                    kk = torch.cat(ks) if len(ks) > 1 else ks[0]
                    vv = torch.cat(vs) if len(vs) > 1 else vs[0]
                    split = self.splits.get(sl.slice_id)
                    if split is not None:  # a recompute rerun reuses the light rank's part
                        core = self.policy.wrap_attention(
                            lambda qq, kx, vx: split.attention(qq, kx, vx, ex.varlen, layer))
                    else:
                        core = self.policy.wrap_attention(
                            lambda qq, kx, vx: varlen_causal_attention(qq, kx, vx, ex.varlen,
                                                                       backend=self.backend))
                    o = core(ex.q, kk, vv)
                # Collective outputs reach backward through the output even where this
                # rank's queries do not use them (also in a full-recompute rerun).
                return self.exchange.finish(sl.slice_id, _anchor(o, ex.roots))
            return attend

        def run_layer(index: int, layer, x: torch.Tensor, *rest):  # noqa: ANN001, ANN202
            def body(xin: torch.Tensor, *args):  # noqa: ANN202
                out, _, _ = layer(xin, *args)
                return (out, *args[-1].kv)  # what the exchange caches (cp: this rank's rows)
            return self.policy.run_layer(body, x, *rest, index=index)

        with saved.hooks():
            out, own_kv = self.chunk(x, cos=cos, sin=sin, attend_for_layer=attend_for_layer,
                                     labels=labels, run_layer=run_layer,
                                     head_comm=self.head_comm)
            if self.chunk.is_last:
                out = out * self.loss_scale
        in_saved = 0
        if lay.has_consumers:
            self.kv_cache[sl.slice_id] = [(k.detach(), v.detach()) for k, v in own_kv]
            in_saved = sum(t.numel() * t.element_size() for kv in self.kv_cache[sl.slice_id]
                           for t in kv if saved.counted_on_device(t))
        self.graphs[sl.slice_id] = SliceGraph(
            inp=None if self.chunk.is_first else x, out=out,
            own_kv=own_kv if lay.has_consumers else [], leaves=leaves,
            saved_bytes=saved.device_bytes, offloaded_bytes=saved.offloaded_bytes,
            cache_bytes_in_saved=in_saved)
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


class _Anchor(torch.autograd.Function):
    """``x`` unchanged; backward also sends zero gradients to ``roots`` (collective outputs),
    so their backward collectives run on a rank whose queries did not use them."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *roots: torch.Tensor):  # noqa: ANN205 - autograd API
        ctx.like = [(r.shape, r.dtype, r.device) for r in roots]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN205 - autograd API
        return (grad, *(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.like))


def _anchor(x: torch.Tensor, roots: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return _Anchor.apply(x, *roots) if roots else x
