"""Per-layer timing over a grid of (query tokens, KV prefix): the calibration table.

Three kinds of rows, all seconds on the current device, medians over ``repeats``:

* ``layer``      one decoder layer, one document of ``tokens`` queries with a ``prefix``-token
                 KV prefix (prefix K/V are leaves, as in the runtime); backward includes dK/dV;
* ``attention``  the attention kernel alone for the same shapes, so the calibrated cost model
                 can price a packed slice as one layer's linear work plus attention per
                 document (packing does not make attention quadratic in the pack);
* ``head``       final norm, LM head and summed cross-entropy over ``tokens`` tokens.

:mod:`slimpack.cost.calibrated` reads the CSV this writes.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from slimpack.runtime.attention import VarlenLayout, choose_backend, varlen_causal_attention
from slimpack.runtime.config import DTYPES
from slimpack.runtime.model import DecoderLayer, LMHead, init_named, rope_tables
from slimpack.specs.model import ModelSpec

CSV_FIELDS = ("kind", "tokens", "prefix", "forward_s", "backward_s", "model", "device", "dtype",
              "threads")


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    tokens: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
    prefixes: tuple[int, ...] = (0, 512, 2048)
    repeats: int = 3
    warmup: int = 1
    device: str = "cpu"
    dtype: str = "fp32"
    attention: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.tokens or min(self.tokens) < 1:
            raise ValueError(f"ProfileConfig.tokens must be positive token counts, got {self.tokens}")
        if not self.prefixes or min(self.prefixes) < 0 or 0 not in self.prefixes:
            raise ValueError(f"ProfileConfig.prefixes must be >= 0 and include 0, got "
                             f"{self.prefixes}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("ProfileConfig.repeats must be >= 1 and warmup >= 0")
        if self.dtype not in DTYPES:
            raise ValueError(f"ProfileConfig.dtype must be one of {sorted(DTYPES)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileRow:
    kind: str
    tokens: int
    prefix: int
    forward_s: float
    backward_s: float
    model: str
    device: str
    dtype: str
    threads: int


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def _measure(make: Callable[[], tuple[Callable[[], torch.Tensor], list[torch.Tensor]]],
             config: ProfileConfig, device: torch.device) -> tuple[float, float]:
    """Median forward and backward seconds; ``make`` returns (forward, tensors to free)."""
    fwd, bwd = [], []
    for i in range(config.warmup + config.repeats):
        forward, _keep = make()
        box: dict[str, torch.Tensor] = {}
        tf = _timed(lambda forward=forward, box=box: box.setdefault("out", forward()), device)
        out = box["out"]
        grad = torch.randn_like(out) if out.dim() else None
        tb = _timed(lambda out=out, grad=grad: torch.autograd.backward([out], [grad]), device)
        if i >= config.warmup:
            fwd.append(tf)
            bwd.append(tb)
    return statistics.median(fwd), statistics.median(bwd)


def profile_model(spec: ModelSpec, config: ProfileConfig,
                  progress: Callable[[str], None] | None = None) -> list[ProfileRow]:
    device = torch.device(config.device)
    dtype = DTYPES[config.dtype]
    backend = choose_backend(device, dtype, config.attention)
    layer = DecoderLayer(spec, device=device, dtype=dtype)
    for name, p in layer.named_parameters():
        init_named(p, f"layers.0.{name}", config.seed)
    head = LMHead(spec, device=device, dtype=dtype)
    for name, p in head.named_parameters():
        init_named(p, name, config.seed)
    meta = {"model": spec.name, "device": config.device, "dtype": config.dtype,
            "threads": torch.get_num_threads()}
    gen = torch.Generator(device=device).manual_seed(config.seed)
    h, nh, nkv, d = spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype).requires_grad_()

    rows: list[ProfileRow] = []
    for t in config.tokens:
        for p in config.prefixes:
            layout = VarlenLayout(q_lens=(t,), k_lens=(p + t,))
            cos, sin = rope_tables(torch.arange(p, p + t, device=device), d, dtype)

            def make_layer(t=t, p=p, layout=layout, cos=cos, sin=sin):
                x, pk, pv = rand(t, h), rand(p, nkv, d), rand(p, nkv, d)

                def attend(q, k, v):
                    kk = torch.cat([pk, k]) if p else k
                    vv = torch.cat([pv, v]) if p else v
                    return varlen_causal_attention(q, kk, vv, layout, backend=backend)

                return (lambda: layer(x, cos, sin, attend)[0]), [x, pk, pv]

            def make_attention(t=t, p=p, layout=layout):
                q, k, v = rand(t, nh, d), rand(p + t, nkv, d), rand(p + t, nkv, d)
                return (lambda: varlen_causal_attention(q, k, v, layout, backend=backend)), [q, k, v]

            for kind, make in (("layer", make_layer), ("attention", make_attention)):
                f, b = _measure(make, config, device)
                rows.append(ProfileRow(kind=kind, tokens=t, prefix=p, forward_s=f, backward_s=b,
                                       **meta))
                if progress:
                    progress(f"{kind:9s} tokens={t:6d} prefix={p:6d} fwd={f * 1e3:8.3f} ms "
                             f"bwd={b * 1e3:8.3f} ms")
        labels = torch.randint(0, spec.vocab_size, (t,), generator=gen, device=device)

        def make_head(t=t, labels=labels):
            x = rand(t, h)
            return (lambda: head.loss_sum(x, labels)), [x]

        f, b = _measure(make_head, config, device)
        rows.append(ProfileRow(kind="head", tokens=t, prefix=0, forward_s=f, backward_s=b, **meta))
    return rows


def profile_concurrently(spec: ModelSpec, config: ProfileConfig, *, processes: int,
                         threads: int) -> list[ProfileRow]:
    """Profile in ``processes`` identical processes at once and keep the first one's rows.

    On a CPU the ranks of a run share memory bandwidth and caches, so attention (memory
    bound) runs markedly slower with a neighbour busy; profiling with as many co-runners as
    the run has ranks per machine calibrates for that. GPUs do not share, use 1 there.
    """
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if processes == 1:
        torch.set_num_threads(threads)
        return profile_model(spec, config)
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="slimpack-profile-") as tmp:
        out = Path(tmp) / "rows.pt"
        mp.spawn(_profile_worker, nprocs=processes, join=True,
                 args=(spec, config, threads, str(out)))
        return torch.load(out, weights_only=False)


def _profile_worker(index: int, spec: ModelSpec, config: ProfileConfig, threads: int,
                    out: str) -> None:
    torch.set_num_threads(threads)
    rows = profile_model(spec, config)
    if index == 0:
        torch.save(rows, out)


def write_profile_csv(rows: Sequence[ProfileRow], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
    tmp.replace(path)
