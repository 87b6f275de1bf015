"""Cost model: time (analytic or calibrated), memory and communication."""

from slimpack.cost.comm import CommModel
from slimpack.cost.flops import (
    FlopCount,
    Piece,
    attention_flops,
    head_flops,
    layer_flops,
    linear_flops_per_token,
    mfu,
    model_flops,
)
from slimpack.cost.memory import (
    GIB,
    MemoryEstimate,
    activation_bytes_per_token_per_layer,
    estimate_memory,
    inflight_units,
    kv_bytes_per_token_per_layer,
    logits_bytes,
    model_state_bytes,
)
from slimpack.cost.model import AnalyticCostModel, CostModel, PassTimes, sequence_pieces

__all__ = [
    "GIB",
    "AnalyticCostModel",
    "CommModel",
    "CostModel",
    "FlopCount",
    "MemoryEstimate",
    "PassTimes",
    "Piece",
    "activation_bytes_per_token_per_layer",
    "attention_flops",
    "estimate_memory",
    "head_flops",
    "inflight_units",
    "kv_bytes_per_token_per_layer",
    "layer_flops",
    "linear_flops_per_token",
    "logits_bytes",
    "mfu",
    "model_flops",
    "model_state_bytes",
    "sequence_pieces",
]
