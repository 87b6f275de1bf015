"""ZeRO-3 parameter sharding over a rank's data-parallel group (docs/architecture.md, runtime).

Between plan phases a rank holds only its ``1/n`` shard of its chunks' parameters and of their
gradients (``n``: the ranks holding the same pipeline stage and tp shard, dp replicas and cp
ranks alike: :attr:`slimpack.runtime.comm.PlanGroups.dp_group`). The parameters are laid out
as one flat buffer in the chunks' parameter order (the same on every rank of the group: same
stage, same shapes), padded at the end to a multiple of ``n``; shard ``i`` is the ``i``-th
``1/n`` of it. Per plan phase:

* :meth:`ZeroShards.unshard` all-gathers the flat parameters (one collective) and points
  every parameter at its slice of the gathered buffer, before the phase's first forward;
* the phase's forwards and backwards (every slice's own graph) use those whole parameters
  and accumulate whole gradients;
* :meth:`ZeroShards.reshard` reduce-scatters the phase's whole gradients (one collective) so
  each rank adds the sum of its shard, then frees the whole parameters and gradients.

Why per phase and not per layer use, as FSDP does: every rank of the group must call each
collective the same number of times, but in one phase the group's ranks run different plan
groups (FlexSP's mixed Ulysses degrees, DP replicas with different slice counts) or none at
all, so per-slice or per-layer gathers would not pair up. Every rank walks every phase, so a
phase boundary is the one point they all reach. That is also why not PyTorch FSDP2
``fully_shard``: it works on gloo CPU, but it all-gathers in each module's forward and
reduce-scatters in each backward, so a rank running more slices than its peer waits for a
partner that never comes (probed on torch 2.13: the peer's gloo pair closes), and it has no
public call to reduce-scatter at a point of the caller's choosing.

The process group is passed in; nothing here is global.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


class ZeroShards:
    """One rank's ZeRO-3 state: its shard of the flat parameters and of their gradients."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup | None) -> None:
        if not params:
            raise ValueError("ZeroShards needs at least one parameter")
        self.params = params
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.index = 0 if group is None else dist.get_rank(group)
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        total = sum(self.numels)
        self.shard_numel = -(-total // self.size)
        self.padded_numel = self.shard_numel * self.size
        flat = self._flat([p.detach() for p in params])
        lo = self.index * self.shard_numel
        self.shard = flat[lo:lo + self.shard_numel].clone()
        """This rank's parameter shard (every rank built the same whole weights from the
        seeded init, so no scatter is needed)."""
        self.shard_grad = torch.zeros_like(self.shard)
        """This rank's shard of the step's gradient sum over the group."""
        self.gathered = False
        self._release()

    # -- bytes held (tracked memory on CPU) ------------------------------------------------
    @property
    def state_bytes(self) -> int:
        """Parameter and gradient shards: what the rank keeps between phases."""
        return 2 * self.shard.numel() * self.shard.element_size()

    @property
    def gathered_bytes(self) -> int:
        """Whole parameters and gradients while a phase runs (0 between phases)."""
        return 2 * self.padded_numel * self.shard.element_size() if self.gathered else 0

    # -- the phase protocol (collective over the group) -------------------------------------
    def unshard(self) -> None:
        """All-gather the parameters; every parameter then views its slice of them."""
        self._point_at(self._all_gather(self.shard))
        self.gathered = True

    def reshard(self, before_reduce: Callable[[], None] | None = None) -> None:
        """Reduce-scatter the phase's gradients into :attr:`shard_grad`, then free the whole
        parameters and gradients. ``before_reduce`` runs first, on the whole gradients (the
        tensor-parallel sums of replicated weights: sums commute with the reduce-scatter)."""
        for p in self.params:
            if p.grad is None:  # a rank whose group ran no slice this phase still joins
                p.grad = torch.zeros_like(p)
        if before_reduce is not None:
            before_reduce()
        flat = self._flat([p.grad for p in self.params])
        out = torch.empty_like(self.shard_grad)
        if self.group is None:
            out.copy_(flat)
        else:
            dist.reduce_scatter_single(out, flat, group=self.group)
        self.shard_grad += out
        self._release()
        self.gathered = False

    def zero_grad(self) -> None:
        self.shard_grad.zero_()

    def gather_gradients(self) -> None:
        """Whole parameters and the step's whole gradients back on every parameter (to compare
        with the unsliced model; collective). The shards stay as they are."""
        self._point_at(self._all_gather(self.shard))
        grads = self._all_gather(self.shard_grad)
        for p, (lo, hi) in zip(self.params, self._ranges(), strict=True):
            p.grad = grads[lo:hi].view(p.shape)

    # -- helpers ---------------------------------------------------------------------------
    def _ranges(self) -> list[tuple[int, int]]:
        out, lo = [], 0
        for n in self.numels:
            out.append((lo, lo + n))
            lo += n
        return out

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        pad = self.padded_numel - flat.numel()
        return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat

    def _all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return shard.clone()
        out = shard.new_empty(self.padded_numel)
        dist.all_gather_single(out, shard, group=self.group)
        return out

    def _point_at(self, flat: torch.Tensor) -> None:
        for p, shape, (lo, hi) in zip(self.params, self.shapes, self._ranges(), strict=True):
            p.data = flat[lo:hi].view(shape)

    def _release(self) -> None:
        """Parameters hold no storage between phases (an empty tensor of their dtype)."""
        for p in self.params:
            p.grad = None
            p.data = p.data.new_empty(0)
