"""Varlen causal attention where each document's queries see a KV prefix (docs/architecture.md, runtime).

Shapes: ``q`` is ``[Tq, H, D]`` and ``k``/``v`` are ``[Tk, Hkv, D]``, packed document after
document; document ``i`` owns query rows ``cu_q[i]:cu_q[i+1]`` and key rows
``cu_k[i]:cu_k[i+1]``, and its keys are ``cat(KV prefix, own keys)``, so ``len_k >= len_q``.
The mask is causal aligned to the bottom-right corner: query ``j`` of a document (counted from
the end) sees every key except the last ``j``. That is what flash-attn's varlen kernel does with
``causal=True`` and what ``torch.nn.attention.varlen`` does with window ``(-1, 0)``. SDPA's
``is_causal`` aligns top-left when ``len_q < len_k`` (wrong here), so the SDPA backend builds
an explicit ``tril(diagonal=len_k - len_q)`` mask (PyTorch's
``scaled_dot_product_attention`` documents ``is_causal`` as ``ones(L, S).tril(diagonal=0)``).

Backends behind one function, chosen by :func:`choose_backend`:

* ``flash``        flash-attn ``flash_attn_varlen_func`` (CUDA, fp16/bf16), when installed;
* ``torch-varlen`` ``torch.nn.attention.varlen.varlen_attn`` (CUDA, fp16/bf16);
* ``sdpa``         one ``scaled_dot_product_attention`` call per document: exact, any device
                   and dtype, with autograd (the fastest exact CPU path measured here);
* ``dense``        one block-diagonal masked attention over the whole pack: the test oracle.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import cache

import torch
import torch.nn.functional as F


@dataclass(frozen=True, kw_only=True)
class VarlenLayout:
    """Per-document query and key lengths of one packed buffer (host-side, no device sync)."""

    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    _device_cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.q_lens) != len(self.k_lens):
            raise ValueError("VarlenLayout: q_lens and k_lens must have one entry per document")
        for lq, lk in zip(self.q_lens, self.k_lens, strict=True):
            if lq < 1 or lk < lq:
                raise ValueError(f"VarlenLayout: need 1 <= len_q <= len_k, got {lq}, {lk}")

    @property
    def cu_q(self) -> list[int]:
        return _cumsum(self.q_lens)

    @property
    def cu_k(self) -> list[int]:
        return _cumsum(self.k_lens)

    def cu_tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 cumulative offsets on ``device``, built once per device."""
        key = str(device)
        if key not in self._device_cache:
            self._device_cache[key] = (
                torch.tensor(self.cu_q, dtype=torch.int32, device=device),
                torch.tensor(self.cu_k, dtype=torch.int32, device=device),
            )
        return self._device_cache[key]


def _cumsum(lengths: tuple[int, ...]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


@cache
def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:  # also covers an ABI mismatch of a wheel built for another torch
        return None
    return flash_attn_varlen_func


@cache
def _torch_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def choose_backend(device: torch.device, dtype: torch.dtype, requested: str = "auto") -> str:
    """The backend ``requested`` (checked), or for ``auto`` the fastest exact one available."""
    half = dtype in (torch.float16, torch.bfloat16)
    cuda = device.type == "cuda"
    if requested == "flash" and not (cuda and half and _flash_varlen() is not None):
        raise ValueError("attention backend 'flash' needs flash-attn installed, CUDA and fp16/bf16")
    if requested == "torch-varlen" and not (cuda and half and _torch_varlen() is not None):
        raise ValueError("attention backend 'torch-varlen' needs torch.nn.attention.varlen, "
                         "CUDA and fp16/bf16")
    if requested != "auto":
        return requested
    if cuda and half and _flash_varlen() is not None:
        return "flash"
    if cuda and half and _torch_varlen() is not None:
        return "torch-varlen"
    return "sdpa"


def varlen_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            layout: VarlenLayout, *, backend: str = "sdpa") -> torch.Tensor:
    """Bottom-right causal attention per document; returns ``[Tq, H, D]``."""
    if backend == "sdpa":
        return _sdpa_per_document(q, k, v, layout)
    if backend == "dense":
        return dense_reference_attention(q, k, v, layout)
    cu_q, cu_k = layout.cu_tensors(q.device)
    max_q, max_k = max(layout.q_lens), max(layout.k_lens)
    if backend == "flash":
        # flash-attn >= 2.1 aligns causal masks bottom-right and handles GQA natively.
        return _flash_varlen()(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    if backend == "torch-varlen":
        fn = _torch_varlen()
        params = inspect.signature(fn).parameters
        kwargs = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        elif k.shape[1] != q.shape[1]:
            k, v = _repeat_kv(k, v, q.shape[1] // k.shape[1])
        return fn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    raise ValueError(f"unknown attention backend {backend!r}")


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def _sdpa_per_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       layout: VarlenLayout) -> torch.Tensor:
    gqa = k.shape[1] != q.shape[1]
    outs = []
    for (q0, q1), (k0, k1) in zip(_pairs(layout.cu_q), _pairs(layout.cu_k), strict=True):
        lq, lk = q1 - q0, k1 - k0
        # [T, H, D] -> [1, H, T, D]
        qi = q[q0:q1].transpose(0, 1).unsqueeze(0)
        ki = k[k0:k1].transpose(0, 1).unsqueeze(0)
        vi = v[k0:k1].transpose(0, 1).unsqueeze(0)
        if lq == lk:
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=gqa)
        else:
            mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq)
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, enable_gqa=gqa)
        outs.append(oi.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0) if len(outs) > 1 else outs[0].contiguous()


def _pairs(cu: list[int]) -> list[tuple[int, int]]:
    return list(zip(cu[:-1], cu[1:], strict=True))


def dense_reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              layout: VarlenLayout) -> torch.Tensor:
    """One masked softmax over the whole pack, computed in fp32: slow, obviously right."""
    tq, tk = q.shape[0], k.shape[0]
    mask = torch.zeros(tq, tk, dtype=torch.bool, device=q.device)
    for (q0, q1), (k0, k1) in zip(_pairs(layout.cu_q), _pairs(layout.cu_k), strict=True):
        lq, lk = q1 - q0, k1 - k0
        mask[q0:q1, k0:k1] = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
    if k.shape[1] != q.shape[1]:
        k, v = _repeat_kv(k, v, q.shape[1] // k.shape[1])
    qf, kf, vf = (t.float().transpose(0, 1) for t in (q, k, v))  # [H, T, D]
    scores = qf @ kf.transpose(1, 2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vf
    return out.transpose(0, 1).to(q.dtype)
