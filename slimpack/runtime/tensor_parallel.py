"""Tensor parallelism with sequence parallelism, Megatron style (docs/architecture.md, runtime).

Per decoder layer on ``tp`` ranks (Shoeybi et al. 2019, arXiv 1909.08053; sequence parallelism:
Korthikanti et al. 2022, arXiv 2205.05198, section 4.2.2):

* between layers each rank holds a contiguous ``1/tp`` of the slice's token rows (sequence
  parallel): RMSNorms and residual adds run on that share with replicated norm weights;
* all-gather the rows, then column-parallel ``wq``/``wk``/``wv`` (each rank its heads and
  kv heads) and ``w_gate``/``w_up`` (a ``1/tp`` of the FFN). With fewer kv heads than ranks
  (tp a multiple of num_kv_heads) each kv head is replicated on the ``tp / num_kv_heads``
  ranks whose query heads read it, as Megatron does; each copy's gradient holds only its
  ranks' share, so the copies' gradients are summed;
* core attention on the rank's heads over the whole slice, with the KV cache of its heads;
* row-parallel ``wo`` / ``w_down`` give partial sums, reduce-scattered back to row shares;
* vocab-parallel embedding (each rank its vocabulary rows, partial sums reduce-scattered)
  and LM head with a vocab-parallel cross-entropy (max, sum-exp and target logit all-reduced;
  the backward is local).

Slices have arbitrary token counts, so a slice's rows are padded to a multiple of ``tp`` at
the end. Padding rows start at zero and stay exactly zero through every layer (RMSNorm,
bias-free linears, RoPE and SwiGLU map zero to zero; attention never sees them; their labels are
ignored), so they change no real value and contribute nothing to any gradient.

Why not DTensor ``parallelize_module`` with ``SequenceParallel``: on torch 2.13 CPU/gloo it
works for even shards, but uneven local lengths abort the process (a gloo size mismatch,
SIGABRT, not an exception), and every slice would need its own padding logic around the DTensor
boundary anyway. The collectives here are four small autograd functions over
``torch.distributed`` (all-gather / reduce-scatter pairs and the cross-entropy all-reduces).
The process group is built from the plan's ranks and passed in: no global state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from slimpack.plan import Group
from slimpack.runtime.comm import all_reduce_flat
from slimpack.runtime.model import IGNORE_INDEX, Attend, RMSNorm, apply_rope, init_named
from slimpack.runtime.stage import EMBED, ModelChunk, last_chunk_head, layer_block
from slimpack.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class TPGroup:
    """This rank's tensor-parallel group: ``ranks`` in tp order and its index among them."""

    ranks: tuple[int, ...]
    index: int
    group: dist.ProcessGroup

    @property
    def size(self) -> int:
        return len(self.ranks)


def tp_rank_sets(groups: Iterable[Group]) -> list[tuple[int, ...]]:
    """Every tensor-parallel rank set of the plan's groups (``Group.ranks`` is ordered
    (pp, cp, tp), tp fastest), in a fixed order every rank computes alike."""
    seen: dict[tuple[int, ...], None] = {}
    for g in groups:
        for start in range(0, len(g.ranks), g.tp):
            seen.setdefault(tuple(g.ranks[start:start + g.tp]), None)
    return list(seen)


def build_tp_group(rank_sets: list[tuple[int, ...]], rank: int) -> TPGroup | None:
    """Create every tp process group (collective: all ranks call this alike); this rank's."""
    mine = None
    for ranks in rank_sets:
        group = dist.new_group(list(ranks))
        if rank in ranks:
            mine = TPGroup(ranks=ranks, index=ranks.index(rank), group=group)
    return mine


def local_rows(num_tokens: int, tp: int) -> int:
    """Rows of a ``num_tokens`` slice each of ``tp`` ranks holds (padded up)."""
    return -(-num_tokens // tp)


# -- collectives with autograd -----------------------------------------------------------------
def _all_gather_rows(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    out = torch.empty((x.shape[0] * tp.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(out, x.contiguous(), group=tp.group)
    return out


def _reduce_scatter_rows(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    out = torch.empty((x.shape[0] // tp.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_single(out, x.contiguous(), group=tp.group)
    return out


class _GatherRows(torch.autograd.Function):
    """Row shares -> all rows; backward sums the gradients' shares (reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup):  # noqa: ANN205 - autograd API
        ctx.tp = tp
        return _all_gather_rows(x, tp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN205 - autograd API
        return _reduce_scatter_rows(grad, ctx.tp), None


class _ReduceScatterRows(torch.autograd.Function):
    """Partial sums of all rows -> the summed row share; backward all-gathers."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup):  # noqa: ANN205 - autograd API
        ctx.tp = tp
        return _reduce_scatter_rows(x, tp)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN205 - autograd API
        return _all_gather_rows(grad, ctx.tp), None


def gather_rows(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return _GatherRows.apply(x, tp)


def reduce_scatter_rows(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return _ReduceScatterRows.apply(x, tp)


def vocab_parallel_ce_forward(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int,
                              group: dist.ProcessGroup
                              ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Summed cross-entropy of rows whose logits are split by vocabulary over ``group`` (this
    rank's columns start at ``vocab_start``): max, sum-exp and target logit all-reduced.
    Returns (the sum, same on every rank; what :func:`vocab_parallel_ce_backward` needs)."""
    logits = logits.float()
    row_max = logits.max(dim=-1).values
    dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - row_max[:, None]
    exp = shifted.exp()
    sum_exp = exp.sum(dim=-1)
    dist.all_reduce(sum_exp, group=group)
    local = labels - vocab_start
    mine = (local >= 0) & (local < logits.shape[-1]) & (labels != IGNORE_INDEX)
    local = torch.where(mine, local, torch.zeros_like(local))
    target = shifted.gather(1, local[:, None]).squeeze(1) * mine
    dist.all_reduce(target, group=group)
    valid = labels != IGNORE_INDEX
    per_token = (sum_exp.log() - target) * valid
    return per_token.sum(), (exp / sum_exp[:, None], local, mine, valid)


def vocab_parallel_ce_backward(saved: tuple[torch.Tensor, ...],
                               grad: torch.Tensor) -> torch.Tensor:
    """d(summed cross-entropy * ``grad``)/d(this rank's logits), fp32; local, no collective."""
    softmax, local, mine, valid = saved
    d = softmax.clone()
    rows = torch.arange(d.shape[0], device=d.device)
    d[rows, local] -= mine.to(d.dtype)
    d *= (valid.to(d.dtype) * grad)[:, None]
    return d


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of logits split by vocabulary over the tp ranks (fp32)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, vocab_start: int,  # noqa: ANN205
                tp: TPGroup):
        ctx.logits_dtype = logits.dtype
        loss, saved = vocab_parallel_ce_forward(logits, labels, vocab_start, tp.group)
        ctx.save_for_backward(*saved)
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN205 - autograd API
        d = vocab_parallel_ce_backward(ctx.saved_tensors, grad)
        return d.to(ctx.logits_dtype), None, None, None


# -- sharded modules ----------------------------------------------------------------------------
SHARD_DIMS = {"wq.weight": 0, "wk.weight": 0, "wv.weight": 0, "wo.weight": 1,
              "w_gate.weight": 0, "w_up.weight": 0, "w_down.weight": 1}
"""Split dimension of each sharded decoder-layer matrix (``nn.Linear`` weights are
``[out, in]``: column-parallel splits dim 0, row-parallel dim 1); others are replicated."""


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    extra = rows - x.shape[0]
    return x if extra == 0 else torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])


class TPDecoderLayer(nn.Module):
    """:class:`~slimpack.runtime.model.DecoderLayer` over ``tp`` ranks; same call signature,
    hidden in and out as this rank's row share, own K/V of its kv heads for the real rows."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, *, device=None, dtype=None) -> None:
        super().__init__()
        n = tp.size
        kw = {"bias": False, "device": device, "dtype": dtype}
        self.tp = tp
        self.num_heads = spec.num_heads // n
        self.num_kv_heads = max(1, spec.num_kv_heads // n)  # one replicated head if tp > kv
        self.head_dim = spec.head_dim
        self.attn_norm = RMSNorm(spec.hidden, device=device, dtype=dtype)
        self.wq = nn.Linear(spec.hidden, spec.q_dim // n, **kw)
        self.wk = nn.Linear(spec.hidden, self.num_kv_heads * spec.head_dim, **kw)
        self.wv = nn.Linear(spec.hidden, self.num_kv_heads * spec.head_dim, **kw)
        self.wo = nn.Linear(spec.q_dim // n, spec.hidden, **kw)
        self.mlp_norm = RMSNorm(spec.hidden, device=device, dtype=dtype)
        self.w_gate = nn.Linear(spec.hidden, spec.ffn_hidden // n, **kw)
        self.w_up = nn.Linear(spec.hidden, spec.ffn_hidden // n, **kw)
        self.w_down = nn.Linear(spec.ffn_hidden // n, spec.hidden, **kw)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [rows, hidden]`` (row share), ``cos``/``sin`` ``[T, 1, D]`` for the slice's
        ``T`` real tokens -> (row share out, own ``k``/``v`` ``[T, Hkv/tp, D]``)."""
        real, padded = cos.shape[0], x.shape[0] * self.tp.size
        cos, sin = _pad_rows(cos, padded), _pad_rows(sin, padded)
        h = gather_rows(self.attn_norm(x), self.tp)
        q = apply_rope(self.wq(h).view(padded, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.wk(h).view(padded, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.wv(h).view(padded, self.num_kv_heads, self.head_dim)
        k, v = k[:real], v[:real]  # padding rows never enter attention or the KV cache
        o = _pad_rows(attend(q[:real], k, v), padded)
        # Explicit width: a cp rank may hold no row of a slice (padded = 0).
        x = x + reduce_scatter_rows(self.wo(o.reshape(padded, self.num_heads * self.head_dim)),
                                    self.tp)
        h = gather_rows(self.mlp_norm(x), self.tp)
        x = x + reduce_scatter_rows(self.w_down(F.silu(self.w_gate(h)) * self.w_up(h)), self.tp)
        return x, k, v


class VocabParallelEmbedding(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPGroup, *, device=None, dtype=None) -> None:
        super().__init__()
        self.tp = tp
        self.per_rank = spec.vocab_size // tp.size
        self.vocab_start = tp.index * self.per_rank
        self.weight = nn.Parameter(torch.empty(self.per_rank, spec.hidden, device=device,
                                               dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """All ``T`` token ids -> this rank's row share of the embeddings."""
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.per_rank)
        e = F.embedding(torch.where(mine, local, torch.zeros_like(local)), self.weight)
        e = e * mine[:, None].to(e.dtype)
        padded = local_rows(ids.shape[0], self.tp.size) * self.tp.size
        return reduce_scatter_rows(_pad_rows(e, padded), self.tp)


class TPLMHead(nn.Module):
    """Final norm on the row share, all-gather, vocab-parallel logits and cross-entropy."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, *, tied_weight: nn.Parameter | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_start = tp.index * (spec.vocab_size // tp.size)
        self.final_norm = RMSNorm(spec.hidden, device=device, dtype=dtype)
        self._tied = [tied_weight] if tied_weight is not None else []
        self.weight = None if tied_weight is not None else nn.Parameter(
            torch.empty(spec.vocab_size // tp.size, spec.hidden, device=device, dtype=dtype))

    def loss_sum(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The slice's summed cross-entropy (same value on every tp rank)."""
        weight = self._tied[0] if self._tied else self.weight
        h = gather_rows(self.final_norm(x), self.tp)
        padded = torch.full((h.shape[0],), IGNORE_INDEX, dtype=labels.dtype,
                            device=labels.device)
        padded[:labels.shape[0]] = labels
        return _VocabParallelCrossEntropy.apply(F.linear(h, weight), padded, self.vocab_start,
                                                self.tp)


class TPModelChunk(nn.Module):
    """:class:`~slimpack.runtime.stage.ModelChunk` with every matrix split over ``tp``: the
    same interface (the executor and the per-slice autograd use either)."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, *, block: int, num_blocks: int, seed: int,
                 device: torch.device, dtype: torch.dtype,
                 make_head: Callable[[], nn.Module] | None = None,
                 layers: Sequence[int] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.block = block
        self.is_first = block == 0
        self.is_last = block == num_blocks - 1
        self.layer_ids = tuple(layer_block(spec, num_blocks, block, layers))
        kw = {"device": device, "dtype": dtype}
        self.embed = VocabParallelEmbedding(spec, tp, **kw) if self.is_first else None
        self.layers = nn.ModuleList(TPDecoderLayer(spec, tp, **kw) for _ in self.layer_ids)
        self.head = None
        if make_head is not None:  # a block of a head spread over the pipeline ranks
            self.head = make_head()
        elif self.is_last:
            tied = self.embed.weight if (spec.tied_embeddings and self.embed is not None) else None
            self.head = TPLMHead(spec, tp, tied_weight=tied, **kw)
        self._global: dict[str, str] = {}
        self._shard_dim: dict[str, int | None] = {}
        self._copies: dict[str, int] = {}
        """Ranks holding the same shard (tp / num_kv_heads for replicated kv heads, else 1)."""
        kv_copies = max(1, tp.size // spec.num_kv_heads)
        for local, param in self.named_parameters():
            name, dim = self._describe(spec, local)
            copies = kv_copies if local.endswith(("wk.weight", "wv.weight")) else 1
            self._global[local], self._shard_dim[local] = name, dim
            self._copies[local] = copies
            _init_shard(param, name, dim, tp, seed, copies=copies)
        if make_head is not None:
            self.head.init_parameters(seed)

    def _describe(self, spec: ModelSpec, local: str) -> tuple[str, int | None]:
        """(name in the unsliced model, split dimension or None when replicated)."""
        if local.startswith("layers."):
            _, idx, rest = local.split(".", 2)
            return f"layers.{self.layer_ids[int(idx)]}.{rest}", SHARD_DIMS.get(rest)
        if local == "embed.weight":
            return EMBED, 0
        if local == "head.weight":
            return (EMBED if spec.tied_embeddings else "head.weight"), 0
        return local.removeprefix("head."), None  # final_norm.weight

    def global_named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """(name in the unsliced model, this rank's shard or replica)."""
        return [(self._global[local], p) for local, p in self.named_parameters()]

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Norm weights: every tp rank holds them whole and sees only its row share, so
        their gradients are summed over the tp group."""
        return [p for local, p in self.named_parameters() if self._shard_dim[local] is None]

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Global name -> whole gradient (shards all-gathered over tp; collective)."""
        out = {}
        for local, p in self.named_parameters():
            grad, dim = p.grad.detach().float(), self._shard_dim[local]
            if dim is not None:
                parts = _all_gather_list(grad, self.tp)
                grad = torch.cat(parts[::self._copies[local]], dim=dim)
            out[self._global[local]] = grad.cpu().clone()
        return out

    def sum_shared_copies(self) -> None:
        """Replicated kv heads: every copy's gradient becomes the sum over its copies
        (collective over tp; after the data-parallel sum or before, sums commute)."""
        for local, p in self.named_parameters():
            copies = self._copies[local]
            if copies > 1:
                parts = _all_gather_list(p.grad, self.tp)
                first = self.tp.index - self.tp.index % copies
                p.grad.copy_(torch.stack(parts[first:first + copies]).sum(0))

    # The same block walk as the unsharded chunk (embed, layers, head): only the modules differ.
    # Token ids (first block, all of the slice's) or this rank's row share in; row share out,
    # or the slice's summed loss (last block).
    forward = ModelChunk.forward


def _all_gather_list(t: torch.Tensor, tp: TPGroup) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(tp.size)]
    dist.all_gather(parts, t.contiguous(), group=tp.group)
    return parts


def _init_shard(param: nn.Parameter, name: str, dim: int | None, tp: TPGroup, seed: int, *,
                copies: int = 1) -> None:
    """This rank's slice of the whole parameter the unsliced model draws for ``name``
    (``copies`` consecutive ranks hold the same slice)."""
    if dim is None:
        init_named(param, name, seed)
        return
    shape = list(param.shape)
    shape[dim] *= tp.size // copies
    whole = torch.empty(shape, dtype=param.dtype, device=param.device)
    init_named(whole, name, seed)
    with torch.no_grad():
        index = tp.index // copies
        param.copy_(whole.narrow(dim, index * param.shape[dim], param.shape[dim]))


def build_tp_chunks(spec: ModelSpec, tp: TPGroup, *, pp: int, vpp: int, stage: int, seed: int,
                    device: torch.device, dtype: torch.dtype,
                    make_head: Callable[[bool], nn.Module] | None = None,
                    layers: Sequence[int] | None = None) -> list[TPModelChunk]:
    """The ``vpp`` chunks of pipeline rank ``stage`` (block ``c*pp + stage``), sharded;
    ``make_head`` as in :func:`~slimpack.runtime.stage.build_chunks`."""
    if not 0 <= stage < pp:
        raise ValueError(f"stage must be in [0, {pp}), got {stage}")
    return [TPModelChunk(spec, tp, block=c * pp + stage, num_blocks=pp * vpp, seed=seed,
                         device=device, dtype=dtype,
                         make_head=last_chunk_head(make_head, c, vpp, stage, pp), layers=layers)
            for c in range(vpp)]


def sync_tp_gradients(chunks: list[TPModelChunk], tp: TPGroup) -> None:
    """Sum the replicated (norm) weights' gradients over the tp group (one collective), and
    replicated kv heads' gradients over their copies."""
    all_reduce_flat([p.grad for c in chunks for p in c.replicated_parameters()], tp.group)
    for c in chunks:
        c.sum_shared_copies()
