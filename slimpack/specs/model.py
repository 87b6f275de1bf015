"""Transformer model shapes (``ModelSpec``) and the presets the papers use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from slimpack.specs._validate import require_positive, unknown_preset

MLP_KINDS = ("swiglu", "gelu")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU), optionally with MoE MLPs.

    ``mlp="gelu"`` describes a GPT-3 style MLP instead (two matrices, h x ffn and ffn x h).
    """

    name: str
    num_layers: int
    hidden: int
    ffn_hidden: int
    """MLP inner width (SwiGLU: each of gate and up is hidden x ffn_hidden; GeLU: the one
    up projection is)."""
    num_heads: int
    num_kv_heads: int
    """Key/value heads (GQA); equal to num_heads for multi-head attention."""
    head_dim: int = 0
    """0 means hidden // num_heads."""
    vocab_size: int = 128_256
    tied_embeddings: bool = False
    num_experts: int = 1
    """1 for a dense model."""
    moe_top_k: int = 1
    """Experts each token is routed to (MoE only)."""
    mlp: str = "swiglu"
    """``swiglu`` (gate, up, down: 3 matrices) or ``gelu`` (up, down: 2 matrices, GPT-3)."""
    rope: bool = True
    """Rotary position embedding applied to queries and keys in every layer (Llama, Nemotron);
    False for GPT-3's learned absolute position embeddings (added once, at the input)."""

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "hidden", "ffn_hidden", "num_heads", "num_kv_heads",
                           "vocab_size", "num_experts", "moe_top_k"):
            require_positive("ModelSpec", field_name, getattr(self, field_name))
        if self.head_dim == 0:
            if self.hidden % self.num_heads:
                raise ValueError(
                    f"ModelSpec.hidden ({self.hidden}) must be divisible by num_heads "
                    f"({self.num_heads}) unless head_dim is given"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.num_heads)
        require_positive("ModelSpec", "head_dim", self.head_dim)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelSpec.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                f"({self.num_heads})"
            )
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"ModelSpec.mlp must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if self.moe_top_k > self.num_experts:
            raise ValueError(
                f"ModelSpec.moe_top_k ({self.moe_top_k}) must be <= num_experts "
                f"({self.num_experts})"
            )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (expert): 3 for SwiGLU, 2 for GeLU."""
        return 3 if self.mlp == "swiglu" else 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def attention_params_per_layer(self) -> int:
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden

    @property
    def expert_params_per_layer(self) -> int:
        """MoE: every expert's MLP weights of one layer (what expert parallelism splits);
        0 for a dense model."""
        if not self.is_moe:
            return 0
        return self.mlp_matrices * self.hidden * self.ffn_hidden * self.num_experts

    @property
    def mlp_params_per_layer(self) -> int:
        """All experts' MLP weights (SwiGLU: gate, up, down) plus the router for MoE."""
        router = self.hidden * self.num_experts if self.is_moe else 0
        return self.mlp_matrices * self.hidden * self.ffn_hidden * self.num_experts + router

    @property
    def params_per_layer(self) -> int:
        return self.attention_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden

    @property
    def num_params(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.num_layers * self.params_per_layer + self.embedding_params + head + self.hidden


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int) -> ModelSpec:
    return ModelSpec(name=name, num_layers=layers, hidden=hidden, ffn_hidden=ffn,
                     num_heads=heads, num_kv_heads=kv_heads)


# Shapes from docs/architecture.md, core types (the SlimPack/SlimPipe artifacts); vocab 128,256 throughout.
MODEL_PRESETS: dict[str, Callable[[], ModelSpec]] = {
    "llama-7b": lambda: _llama("llama-7b", 32, 4096, 11008, 32, 32),
    "llama-13b": lambda: _llama("llama-13b", 40, 5120, 13824, 40, 40),
    "llama-34b": lambda: _llama("llama-34b", 48, 8192, 22016, 64, 8),
    "llama-70b": lambda: _llama("llama-70b", 80, 8192, 28672, 64, 8),
    "llama-150b": lambda: _llama("llama-150b", 96, 12288, 32768, 96, 8),
    "mixtral-8x7b": lambda: ModelSpec(name="mixtral-8x7b", num_layers=32, hidden=4096,
                                      ffn_hidden=14336, num_heads=32, num_kv_heads=8,
                                      num_experts=8, moe_top_k=2),
    "mixtral-8x22b": lambda: ModelSpec(name="mixtral-8x22b", num_layers=56, hidden=6144,
                                       ffn_hidden=16384, num_heads=48, num_kv_heads=8,
                                       num_experts=8, moe_top_k=2),
    # Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json: 16 layers, hidden 2048, intermediate
    # 8192, 32 heads, 8 kv heads, vocab 128,256, tied embeddings): the 1-3B model the GPU
    # check's MFU run uses (`make gpu-check`).
    "llama3.2-1b": lambda: ModelSpec(name="llama3.2-1b", num_layers=16, hidden=2048,
                                     ffn_hidden=8192, num_heads=32, num_kv_heads=8,
                                     vocab_size=128256, tied_embeddings=True),
    # Public models as Megatron-Core / NeMo run them (issue 25's presets; the Hopper
    # validation records of slimpack/validation/hopper_published.json use these shapes).
    # Llama 3.1 8B and 70B: meta-llama/Llama-3.1-8B and -70B config.json (GQA, 8 kv heads,
    # vocab 128,256, untied); 8.03B and 70.6B parameters.
    "llama3.1-8b": lambda: ModelSpec(name="llama3.1-8b", num_layers=32, hidden=4096,
                                     ffn_hidden=14336, num_heads=32, num_kv_heads=8),
    "llama3.1-70b": lambda: ModelSpec(name="llama3.1-70b", num_layers=80, hidden=8192,
                                      ffn_hidden=28672, num_heads=64, num_kv_heads=8),
    # Nemotron-4 15B (Parmar et al. 2024, arXiv 2402.16819, Table 1) and 340B (NVIDIA 2024,
    # arXiv 2406.11704, Table 1): squared-ReLU two-matrix MLP of 4h (priced as the two-matrix
    # "gelu" MLP: the same GEMMs), 8 kv heads, vocab 256,000, untied; 15.7B and 341B.
    "nemotron4-15b": lambda: ModelSpec(name="nemotron4-15b", num_layers=32, hidden=6144,
                                       ffn_hidden=24576, num_heads=48, num_kv_heads=8,
                                       vocab_size=256000, mlp="gelu"),
    "nemotron4-340b": lambda: ModelSpec(name="nemotron4-340b", num_layers=96, hidden=18432,
                                        ffn_hidden=73728, num_heads=96, num_kv_heads=8,
                                        vocab_size=256000, mlp="gelu"),
    # GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12,288, 96 heads; Narayanan
    # et al. 2021, Table 1: 174.6B parameters with a 51,200 vocab): GeLU, learned positions,
    # tied embeddings, as the A100 validation records run it.
    "gpt3-175b": lambda: ModelSpec(name="gpt3-175b", num_layers=96, hidden=12288,
                                   ffn_hidden=49152, num_heads=96, num_kv_heads=96,
                                   vocab_size=51200, tied_embeddings=True, mlp="gelu",
                                   rope=False),
    # Tiny models for runtime tests: small enough for fp32 gradient parity on 2 CPU cores.
    "tiny": lambda: ModelSpec(name="tiny", num_layers=4, hidden=64, ffn_hidden=128,
                              num_heads=4, num_kv_heads=2, vocab_size=256),
    "tiny-mha": lambda: ModelSpec(name="tiny-mha", num_layers=2, hidden=32, ffn_hidden=64,
                                  num_heads=4, num_kv_heads=4, vocab_size=128,
                                  tied_embeddings=True),
    "small": lambda: ModelSpec(name="small", num_layers=8, hidden=256, ffn_hidden=688,
                               num_heads=8, num_kv_heads=4, vocab_size=4096),
}


def model_preset(name: str) -> ModelSpec:
    """Return the preset called ``name`` (e.g. ``"llama-70b"``)."""
    try:
        return MODEL_PRESETS[name]()
    except KeyError:
        raise unknown_preset("model", name, list(MODEL_PRESETS)) from None
