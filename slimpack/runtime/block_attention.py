"""Attention over one block of keys per segment, with its log-sum-exp, and its backward.

SlimPipe's redistribution (:mod:`slimpack.runtime.redistribution`) splits a segment's keys
in two blocks: the first ``d`` tokens of its KV prefix (computed on the paired pipeline rank)
and the rest (computed where the slice is). Softmax attention over the union is the two
partial results merged by their log-sum-exp, and its gradient is the sum of the two blocks'
gradients given the whole attention's log-sum-exp (the FlashAttention backward):
``P = exp(S - lse)``, ``dV = P^T dO``, ``dS = P * (dO V^T - delta)`` with
``delta = rowsum(dO * O)``, ``dQ = dS K * scale``, ``dK = dS^T Q * scale``.

Shapes as in :mod:`slimpack.runtime.attention`: ``q`` ``[Tq, H, D]``, ``k``/``v``
``[Tk, Hkv, D]``, segment after segment (``q_lens``, ``k_lens``); ``lse`` and ``delta`` are
``[Tq, H]`` in fp32 (or the inputs' wider type). ``causal``: each segment's mask is causal
aligned bottom-right (its own rows' block after a prefix); otherwise every query sees every
key of its segment (a shipped prefix block): block-diagonal by segment either way. Computed
in fp32 (fp64 for fp64 inputs) with plain tensor algebra: exact, any device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _pairs(lens: Sequence[int]) -> list[tuple[int, int]]:
    out, at = [], 0
    for n in lens:
        out.append((at, at + n))
        at += n
    return out


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """What softmax statistics are kept in: fp32, or the inputs' own wider type."""
    return torch.promote_types(dtype, torch.float32)


def _scores(qi: torch.Tensor, ki: torch.Tensor, causal: bool) -> torch.Tensor:
    """``[H, lq, lk]`` scaled scores of one segment (GQA: key heads repeated)."""
    kf = _repeat(ki, qi.shape[1] // ki.shape[1])
    s = _acc(qi).transpose(0, 1) @ kf.permute(1, 2, 0) / qi.shape[-1] ** 0.5
    if causal:
        lq, lk = qi.shape[0], ki.shape[0]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=qi.device).tril(lk - lq)
        s = s.masked_fill(~mask, float("-inf"))
    return s


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t.to(accumulate_dtype(t.dtype))


def _repeat(t: torch.Tensor, groups: int) -> torch.Tensor:
    return _acc(t).repeat_interleave(groups, dim=1) if groups > 1 else _acc(t)


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_lens: Sequence[int],
                  k_lens: Sequence[int], *, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(output ``[Tq, H, D]`` in q's dtype, log-sum-exp ``[Tq, H]``)."""
    outs, lses = [], []
    for (q0, q1), (k0, k1) in zip(_pairs(q_lens), _pairs(k_lens), strict=True):
        groups = q.shape[1] // k.shape[1]
        s = _scores(q[q0:q1], k[k0:k1], causal)
        lse = torch.logsumexp(s, dim=-1)  # [H, lq]
        p = torch.exp(s - lse.unsqueeze(-1))
        o = p @ _repeat(v[k0:k1], groups).transpose(0, 1)  # [H, lq, D]
        outs.append(o.transpose(0, 1))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs).to(q.dtype), torch.cat(lses)


def block_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out: torch.Tensor,
                   lse: torch.Tensor, delta: torch.Tensor, q_lens: Sequence[int],
                   k_lens: Sequence[int], *, causal: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of this key block's share, given the whole attention's ``lse`` and
    ``delta``; dK, dV summed over the query heads sharing a key head."""
    groups = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5
    acc = accumulate_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    for (q0, q1), (k0, k1) in zip(_pairs(q_lens), _pairs(k_lens), strict=True):
        s = _scores(q[q0:q1], k[k0:k1], causal)
        p = torch.exp(s - lse[q0:q1].transpose(0, 1).unsqueeze(-1))  # [H, lq, lk]
        do = _acc(d_out[q0:q1]).transpose(0, 1)  # [H, lq, D]
        kh = _repeat(k[k0:k1], groups).transpose(0, 1)  # [H, lk, D]
        vh = _repeat(v[k0:k1], groups).transpose(0, 1)
        dvh = p.transpose(1, 2) @ do
        ds = p * (do @ vh.transpose(1, 2) - delta[q0:q1].transpose(0, 1).unsqueeze(-1))
        dq[q0:q1] = (ds @ kh * scale).transpose(0, 1)
        dkh = ds.transpose(1, 2) @ _acc(q[q0:q1]).transpose(0, 1) * scale  # [H, lk, D]
        hkv = k.shape[1]
        dk[k0:k1] = dkh.reshape(hkv, groups, *dkh.shape[1:]).sum(1).transpose(0, 1)
        dv[k0:k1] = dvh.reshape(hkv, groups, *dvh.shape[1:]).sum(1).transpose(0, 1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def merge(parts: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial attentions over disjoint key blocks -> the attention over their union."""
    lse = parts[0][1]
    for _, other in parts[1:]:
        lse = torch.logaddexp(lse, other)
    out = sum(_acc(o) * torch.exp(part_lse - lse).unsqueeze(-1) for o, part_lse in parts)
    return out.to(parts[0][0].dtype), lse
