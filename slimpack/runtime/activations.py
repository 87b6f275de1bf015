"""What a slice's forward keeps for its backward: recompute modes and activation offload.

* ``recompute="selective"``: core attention (softmax(QK^T)V of every document) runs without
  a graph; only its inputs (q and the concatenated K/V) are saved and it runs again in backward
  (Korthikanti et al. 2022, arXiv 2205.05198, section 4.2: the memory-heavy, FLOP-light part);
* ``recompute="full"``: every decoder layer runs without a graph; only its input is saved and
  the whole layer forward runs again in backward;
* ``offload=s``: of the tensors autograd saves (parameters and the slice's own K/V excluded:
  later slices read the K/V cache), a greedy share ``s`` by bytes is copied to host memory
  when saved and copied back when backward unpacks it. On CUDA the copies are non-blocking,
  into pinned memory, on the compute stream (not yet overlapped on a side stream); on CPU it
  is a real copy into a separate buffer, so the path is executed and exact either way.

Recompute is an explicit autograd function (:class:`Recompute`) rather than
``torch.utils.checkpoint``: the non-reentrant checkpoint keeps its inputs by reference, out of
reach of ``saved_tensors_hooks``, so a recomputed layer's input could be neither counted nor
offloaded; here it is saved with ``save_for_backward`` and both apply. Recompute reruns the same
kernels on the same inputs and an offloaded tensor comes back bit for bit, so gradients are
unchanged (the parity tests check it against the unsliced model). The K/V cache leaves a
slice's attention reads are made once per forward and reused when backward reruns the
attention, so their ``.grad`` still collects the dK/dV the slice owes earlier slices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from slimpack.runtime.capabilities import EXECUTED_RECOMPUTE


class Recompute(torch.autograd.Function):
    """``fn(*inputs)`` run without a graph in forward and again, with one, in backward.

    Parameters ``fn`` closes over get their gradients accumulated by the inner backward (as in
    a reentrant checkpoint); the inputs' gradients are returned."""

    @staticmethod
    def forward(ctx, fn: Callable, *inputs: torch.Tensor):  # noqa: ANN205 - autograd API
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):  # noqa: ANN205 - autograd API
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        with torch.enable_grad():
            outputs = ctx.fn(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True)
                 if g is not None and o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *(t.grad if t.requires_grad else None for t in inputs))


@dataclass(frozen=True, kw_only=True)
class ActivationPolicy:
    recompute: str = "none"
    recompute_layers: int | None = None
    """With full recompute: only a chunk's first this many layers (``Group.recompute_layers``)."""
    offload: float = 0.0

    def __post_init__(self) -> None:
        if self.recompute not in EXECUTED_RECOMPUTE:
            raise ValueError(f"ActivationPolicy.recompute must be one of {EXECUTED_RECOMPUTE}, "
                             f"got {self.recompute!r}")
        if not 0.0 <= self.offload <= 1.0:
            raise ValueError(f"ActivationPolicy.offload must be in [0, 1], got {self.offload!r}")

    def wrap_attention(self, attention: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if self.recompute != "selective":
            return attention
        return lambda q, k, v: Recompute.apply(attention, q, k, v)

    def run_layer(self, layer: Callable, x: torch.Tensor, *rest, index: int = 0):
        """``layer(x, *rest)``, the ``index``-th layer of its chunk; under full recompute
        (of that layer: ``recompute_layers``) only ``x`` is kept (``rest`` is the rope tables
        and the attention closure, constants of the slice)."""
        if self.recompute != "full" or (self.recompute_layers is not None
                                         and index >= self.recompute_layers):
            return layer(x, *rest)
        return Recompute.apply(lambda xin: layer(xin, *rest), x)


@dataclass
class _Offloaded:
    """A saved tensor's host copy and where it came from."""

    host: torch.Tensor
    device: torch.device


@dataclass(kw_only=True)
class SavedTensors:
    """``saved_tensors_hooks`` pair for one slice forward: counts the device bytes autograd
    keeps (unique storages, model state excluded) and offloads the policy's share."""

    skip: set[int]
    """Storage pointers never counted nor offloaded (parameters)."""
    offload: float = 0.0
    keep: set[int] = field(default_factory=set)
    """Storage pointers counted but kept on the device (the slice's own K/V)."""
    seen: set[int] = field(default_factory=set)
    device_bytes: int = 0
    offloaded_bytes: int = 0
    offloaded: set[int] = field(default_factory=set)

    def counted_on_device(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage is among the device bytes counted (saved, not offloaded)."""
        ptr = t.untyped_storage().data_ptr()
        return ptr in self.seen and ptr not in self.offloaded and ptr not in self.skip

    def keep_on_device(self, *tensors: torch.Tensor) -> None:
        self.keep.update(t.untyped_storage().data_ptr() for t in tensors)

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.skip:
            return t
        nbytes = storage.nbytes()
        if ptr in self.offloaded:
            # The same storage saved again through another view: copy that view too (counted
            # once; autograd rarely saves two views of one storage).
            return _Offloaded(host=_host_copy(t), device=t.device)
        first = ptr not in self.seen
        self.seen.add(ptr)
        seen_total = self.device_bytes + self.offloaded_bytes + (nbytes if first else 0)
        if (first and self.offload > 0.0 and ptr not in self.keep
                and self.offloaded_bytes + nbytes <= self.offload * seen_total):
            self.offloaded_bytes += nbytes
            self.offloaded.add(ptr)
            return _Offloaded(host=_host_copy(t), device=t.device)
        if first:
            self.device_bytes += nbytes
        return t

    @staticmethod
    def unpack(packed) -> torch.Tensor:
        if isinstance(packed, _Offloaded):
            return packed.host.to(packed.device, non_blocking=packed.device.type == "cuda")
        return packed

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host
    return t.detach().clone()  # CPU: a real copy, so the offload path is exercised
