"""FlexSP's cost model (arXiv 2412.01523, section 4.2): time and memory of one SP group.

A group of SP degree ``d`` running sequences ``S`` takes
``sum_s (alpha1*s^2 + alpha2*s) / d + sum_s comm(s, d) + beta1`` seconds and holds
``sum_s s * act_bytes_per_token / d`` bytes of activations per GPU, under a budget ``E``.
``comm`` is the Ulysses all-to-all volume over the degree's measured bandwidth.

Two sources of constants: the authors' profiled A100 values for gpt-7b (``paper_a100_gpt7b``)
and a fit to the suite's cost model (``from_cost_model``, the default), so the planner's view
agrees with the simulator that judges it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from slimpack.cost.memory import activation_bytes_per_token_per_layer, model_state_bytes
from slimpack.cost.model import CostModel
from slimpack.specs import HardwareSpec, ModelSpec

MB = 1e6


@dataclass(frozen=True, kw_only=True)
class FlexSPConstants:
    alpha1_s_per_token2: float
    alpha2_s_per_token: float
    beta1_s: float
    act_bytes_per_token: float
    """Activation bytes per token of the whole model (divided by the SP degree per GPU)."""
    memory_budget_bytes: float
    """E: bytes per GPU left for activations after model states."""
    a2a_bytes_per_token: float
    """Bytes one token moves in all Ulysses all-to-alls of a step (forward and backward)."""
    a2a_gbps: dict[int, float] = field(default_factory=dict)
    """All-to-all bandwidth (GB/s) by SP degree."""
    per_degree: dict[int, tuple[float, float]] = field(default_factory=dict)
    """(s^2, s) coefficients of one sequence's seconds at each SP degree, all-to-alls and
    everything else the degree costs included (a profile per degree, as FlexSP's authors
    measured theirs). A degree listed here replaces the alpha/d + bandwidth formula."""

    def bandwidth(self, degree: int) -> float:
        if degree in self.a2a_gbps:
            return self.a2a_gbps[degree]
        known = sorted(self.a2a_gbps)
        below = [d for d in known if d <= degree]
        return self.a2a_gbps[below[-1] if below else known[0]]

    def seq_seconds(self, length: float, degree: int) -> float:
        """Seconds one sequence adds to its group's time (compute and all-to-all)."""
        if degree in self.per_degree:
            a, b = self.per_degree[degree]
            return a * length * length + b * length
        compute = (self.alpha1_s_per_token2 * length * length
                   + self.alpha2_s_per_token * length) / degree
        comm = 0.0
        if degree > 1:
            comm = (degree - 1) / degree * length / degree * self.a2a_bytes_per_token / (
                self.bandwidth(degree) * 1e9)
        return compute + comm

    def max_tokens(self, degree: int) -> float:
        """Tokens a group of ``degree`` GPUs can hold at once."""
        return self.memory_budget_bytes * degree / self.act_bytes_per_token


def _a2a_bytes_per_token(model: ModelSpec, tp: int) -> float:
    # Q, K, V in and the attention output back, forward and again backward, bf16.
    return model.num_layers * 2 * (model.q_dim + 2 * model.kv_dim + model.q_dim) * 2 / tp


def paper_a100_gpt7b(model: ModelSpec, hardware: HardwareSpec, *, tp: int = 1, pp: int = 1,
                     num_gpus: int = 64) -> FlexSPConstants:
    """The FlexSP authors' profiled A100 constants for gpt-7b (their artifact)."""
    states = model_state_bytes(model, tp=tp, pp=pp, dp=num_gpus)
    return FlexSPConstants(
        alpha1_s_per_token2=5.128e-6 * 1e-3, alpha2_s_per_token=0.1840e-3, beta1_s=0.6294,
        act_bytes_per_token=4.48 * MB / (tp * pp),
        memory_budget_bytes=max(hardware.usable_memory_bytes - states, 0.0),
        a2a_bytes_per_token=_a2a_bytes_per_token(model, tp),
        a2a_gbps={2: 119.5, 4: 104.1, 8: 96.5, 16: 10.3, 32: 5.94, 64: 4.87},
    )


def from_cost_model(cost: CostModel, *, tp: int = 1, pp: int = 1, num_gpus: int = 64,
                    state_shards: int = 1, recompute: str = "none",
                    zero_stage: int = 1) -> FlexSPConstants:
    """Fit alpha1/alpha2 to the cost model's forward+backward time of whole documents over all
    layers; memory from the shared memory model (optimizer states, and with ``zero_stage=3``
    parameters and gradients too, sharded ``state_shards`` ways)."""
    model, hardware = cost.model, cost.hardware
    gpn = hardware.gpus_per_node
    xs = np.array([8192.0, 32768.0, 131072.0])
    design = np.vstack([xs**2, xs, np.ones_like(xs)]).T
    ys = []
    for n in xs:
        t = cost.layer_times([(int(n), 0)], tp=tp, recompute=recompute)
        ys.append((t.forward_s + t.backward_s) * model.num_layers)
    a, b, c = np.linalg.solve(design, np.array(ys))
    # Each degree priced as the simulator prices a Ulysses unit (layers and the LM head):
    # the alpha/d formula misses what a degree costs beyond its all-to-alls (at tp 8 x SP 8,
    # 32K tokens: 0.41 s by the formula, 1.15 s in the simulator).
    per_degree = {}
    d = 1
    while d <= max(num_gpus, 1):
        ys_d = [_ulysses_seconds(cost, int(n), tp=tp, degree=d, recompute=recompute,
                                 intra=d * tp <= gpn) for n in xs]
        ad, bd, _ = np.linalg.solve(design, np.array(ys_d))
        per_degree[d] = (max(float(ad), 0.0), max(float(bd), 0.0))
        d *= 2
    act = activation_bytes_per_token_per_layer(model, recompute) * model.num_layers / (tp * pp)
    # fp32 logits of the micro-batch on the last stage (one of pp units in flight there).
    act += 4 * model.vocab_size / (tp * pp)
    states = model_state_bytes(model, tp=tp, pp=pp, dp=state_shards, zero_stage=zero_stage)
    bandwidth = {}
    d = 2
    while d <= max(num_gpus, 2):
        intra = d * tp <= gpn
        bandwidth[d] = hardware.intra_node_gbps if intra else hardware.inter_node_gbps
        d *= 2
    return FlexSPConstants(
        alpha1_s_per_token2=max(float(a), 0.0), alpha2_s_per_token=max(float(b), 0.0),
        beta1_s=max(float(c), 0.0), act_bytes_per_token=act,
        # 10% headroom: the simulator also counts KV caches and allocator slack per op.
        memory_budget_bytes=max(0.9 * hardware.usable_memory_bytes - states, 0.0),
        a2a_bytes_per_token=_a2a_bytes_per_token(model, tp), a2a_gbps=bandwidth,
        per_degree=per_degree,
    )


def _ulysses_seconds(cost: CostModel, length: int, *, tp: int, degree: int, recompute: str,
                     intra: bool) -> float:
    """Forward + backward seconds of one ``length``-token sequence alone in a Ulysses group
    of ``degree`` (the simulator's own per-unit rule, over all layers, plus the LM head)."""
    from slimpack.sim.costs import unit_layer_seconds

    fwd, bwd, *_ = unit_layer_seconds([[(length, 0)]] + [[] for _ in range(degree - 1)],
                                      model=cost.model, cost=cost, tp=tp, cp=degree,
                                      cp_kind="ulysses", recompute=recompute, cp_intra=intra)
    head = cost.head_times(-(-length // degree), tp=tp)
    return (fwd + bwd) * cost.model.num_layers + head.forward_s + head.backward_s
