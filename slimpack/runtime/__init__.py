"""The runtime: execute a Plan for real with PyTorch (docs/architecture.md, runtime, says
which plan fields it executes; the rest are refused by name before any process starts).

Modules, one job each:

* :mod:`~slimpack.runtime.config`         ``RuntimeConfig`` (device, dtype, backend, seed)
* :mod:`~slimpack.runtime.model`          Llama-style layers, deterministic per-name init
* :mod:`~slimpack.runtime.attention`      varlen causal attention with a KV prefix, backends
* :mod:`~slimpack.runtime.layout`         slices -> token buffers, positions, labels, KV pieces
* :mod:`~slimpack.runtime.stage`          the model chunks one pipeline rank holds
* :mod:`~slimpack.runtime.slice_autograd` per-slice graphs, KV leaves, dK/dV accumulation
* :mod:`~slimpack.runtime.activations`    recompute (selective, full) and activation offload
* :mod:`~slimpack.runtime.tensor_parallel` tensor + sequence parallel layers, vocab-parallel loss
* :mod:`~slimpack.runtime.cp_layout`      which rows of a slice each context-parallel rank holds
* :mod:`~slimpack.runtime.context_parallel` cp groups; K/V all-gather exchange (``cp_kind="ring"``)
* :mod:`~slimpack.runtime.ulysses`        all-to-all head/row exchange (``cp_kind="ulysses"``)
* :mod:`~slimpack.runtime.cp_checks`      cp settings checked before launch
* :mod:`~slimpack.runtime.block_attention` attention over one key block with its log-sum-exp
* :mod:`~slimpack.runtime.redistribution` SlimPipe's attention moves between pipeline ranks
* :mod:`~slimpack.runtime.reference`      the unsliced single-process oracle
* :mod:`~slimpack.runtime.validate`       plan checks done before any process starts
* :mod:`~slimpack.runtime.capabilities`   the plan fields the runtime executes; refusals
* :mod:`~slimpack.runtime.parity`         loss/gradient error against the unsliced reference
* :mod:`~slimpack.runtime.comm`           directed p2p channels and DP/tied-weight groups
* :mod:`~slimpack.runtime.executor`       runs one rank's op lists; measures records
* :mod:`~slimpack.runtime.launch`         torchrun or local spawn; records out
* :mod:`~slimpack.runtime.many`           several plans of one world size in one process job
* :mod:`~slimpack.runtime.parity_matrix`  the gradient-parity matrix (its table is in docs/)
* :mod:`~slimpack.runtime.profiler`       per-layer (tokens, prefix) timing grid -> CSV

The one-shot CUDA check (``make gpu-check``) is :mod:`slimpack.cli.gpu_check`: it compares the
runtime with the simulator, so it sits above both.
"""

from slimpack.runtime.config import RuntimeConfig

__all__ = ["RuntimeConfig"]
