"""Kernel-level measurements on the current GPU, beside the cost model's prediction of each.

The cost model's kernel constants (:mod:`slimpack.cost.kernels`) are fitted to published
kernel benchmarks; this module measures the same kernels on a GPU of our own so that the fit
can be checked (and, with enough rows, refitted) from kernel data, never from end-to-end
training runs. Four sweeps, each row one shape:

* ``gemm``       ``(m x k) @ (k x n)`` in bf16 (``torch.matmul``) and fp8 (``torch._scaled_mm``
                 with per-tensor scales, e4m3 operands, bf16 output: the cuBLASLt class of
                 GEMM that Transformer Engine's per-tensor FP8 recipes run): square sizes and
                 the four GEMMs of a decoder layer (QKV, attention out, fused gate/up, down)
                 of the Llama presets at tp 1-8 and 1K-16K tokens, with their dgrad and wgrad
                 shapes at tp 1 and 8 (:func:`gemm_shapes`);
* ``attention``  torch's scaled-dot-product attention, one backend at a time (flash, cuDNN,
                 memory-efficient), forward and backward, causal and not, head dim 64 and 128,
                 the flash-attn benchmark's convention (``batch x seqlen`` = 16K tokens, hidden
                 2048; FLOPs ``4*b*h*s^2*d``, halved when causal, backward 2.5x forward);
* ``varlen``     one packed varlen attention call (torch's ``varlen_attn``, a FlashAttention-2
                 class kernel) over real document mixes (``sample_batch`` of the Common Crawl,
                 GitHub and Wikipedia profiles, 16K and 64K tokens), forward and backward, GQA
                 heads of Llama 3 8B: the per-document pricing (tiles plus a per-query-tile
                 overhead, :func:`slimpack.cost.kernels.attention_seconds`) against one launch;
* ``memory``     a device-to-device copy (HBM streaming bandwidth) and the FP8 cast with its
                 amax reduction (what an FP8 GEMM's input costs before the GEMM runs).

Times are CUDA-event medians over repeated launches after a warm-up long enough for the clocks
to settle (each shape runs for at least ``min_ms`` in total). Back-to-back launches of one
shape are what training runs too, so these are sustained rates, not single-launch bests.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from slimpack.cost import kernels as K
from slimpack.specs import model_preset
from slimpack.specs.hardware import HardwareSpec

GEMM_SQUARES = (1024, 2048, 4096, 8192, 16384)
LAYER_MODELS = ("llama-7b", "llama-13b", "llama-70b")
LAYER_TPS = (1, 2, 4, 8)
LAYER_TOKENS = (1024, 4096, 16384)
"""Token counts of one GEMM: a short slice, a Megatron micro-batch, a long pack."""
ATTENTION_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
ATTENTION_TOKENS = 16384
ATTENTION_HIDDEN = 2048
ATTENTION_BACKENDS = ("flash", "cudnn", "efficient")
VARLEN_PROFILES = ("commoncrawl", "github", "wikipedia")
VARLEN_TOKENS = (16384, 65536)
VARLEN_HEADS = (32, 8, 128)
"""(query heads, kv heads, head dim) of the varlen sweep: Llama 3 8B."""

CSV_FIELDS = ("sweep", "kernel", "dtype", "shape", "m", "n", "k", "pass", "causal", "head_dim",
              "heads", "batch", "seqlen", "profile", "bytes", "flops", "measured_s", "tflops",
              "model_s", "model_over_measured", "device")


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelRow:
    sweep: str
    kernel: str
    dtype: str
    shape: str
    measured_s: float
    model_s: float
    device: str
    m: int = 0
    n: int = 0
    k: int = 0
    pass_: str = ""
    causal: int = 0
    head_dim: int = 0
    heads: int = 0
    batch: int = 0
    seqlen: int = 0
    profile: str = ""
    bytes: int = 0
    flops: float = 0.0

    def as_csv(self) -> dict:
        row = asdict(self)
        row["pass"] = row.pop("pass_")
        row["tflops"] = self.flops / self.measured_s / 1e12 if self.flops else 0.0
        row["model_over_measured"] = self.model_s / self.measured_s if self.model_s else 0.0
        return {k: row[k] for k in CSV_FIELDS}

    @classmethod
    def from_csv(cls, row: dict[str, str]) -> KernelRow:
        ints = ("m", "n", "k", "causal", "head_dim", "heads", "batch", "seqlen", "bytes")
        return cls(sweep=row["sweep"], kernel=row["kernel"], dtype=row["dtype"],
                   shape=row["shape"], measured_s=float(row["measured_s"]),
                   model_s=float(row["model_s"]), device=row["device"], pass_=row["pass"],
                   profile=row["profile"], flops=float(row["flops"]),
                   **{name: int(row[name]) for name in ints})


def model_seconds(row: KernelRow, hw: HardwareSpec) -> float:
    """The kernel-level cost model's time for the kernel ``row`` measured, from the row's own
    fields (varlen rows draw their documents again: ``sample_batch(profile, seed=0)``)."""
    if row.sweep == "gemm":
        return K.capped_gemm_seconds(hw, row.m, row.n, row.k, dtype=row.dtype)
    if row.sweep == "memory":
        return K.memory_seconds(hw, row.bytes)
    backward = row.pass_ == "bwd"
    if row.sweep == "attention":
        return row.batch * K.attention_seconds(hw, [(row.seqlen, 0)], heads=row.heads,
                                               head_dim=row.head_dim, backward=backward,
                                               causal=bool(row.causal))
    if row.sweep == "varlen":
        consts = K.ATTENTION_CONSTANTS.get(f"{hw.kernel_family}-fa2") \
            if row.kernel != "sdpa" else None
        pieces = [(n, 0) for n in _varlen_lengths(row.profile, row.seqlen)]
        return K.attention_seconds(hw, pieces, heads=row.heads, head_dim=row.head_dim,
                                   backward=backward, consts=consts)
    raise ValueError(f"KernelRow.sweep must be gemm, attention, varlen or memory; "
                     f"got {row.sweep!r}")


def priced(row: KernelRow, hw: HardwareSpec) -> KernelRow:
    """``row`` with the cost model's time for its kernel (:func:`model_seconds`)."""
    return replace(row, model_s=model_seconds(row, hw))


def reprice(rows: list[KernelRow], hw: HardwareSpec) -> list[KernelRow]:
    """The same measurements priced by the current cost model (after its constants change)."""
    return [priced(r, hw) for r in rows]


def read_rows(path: Path) -> list[KernelRow]:
    with path.open(newline="") as fh:
        return [KernelRow.from_csv(r) for r in csv.DictReader(fh)]


def summarize(rows: list[KernelRow]) -> list[dict]:
    """One line per kernel, dtype and pass: rows, median rate (TFLOP/s, or TB/s for copies and
    casts) and the model/measured time ratio's median, min and max."""
    groups: dict[tuple, list[dict]] = {}
    for row in (r.as_csv() for r in rows):
        groups.setdefault((row["kernel"], row["dtype"], row["pass"]), []).append(row)
    summary = []
    for (kernel, dtype, pass_), members in groups.items():
        ratios = [r["model_over_measured"] for r in members if r["model_over_measured"]]
        rates = [r["tflops"] if r["tflops"] else r["bytes"] / r["measured_s"] / 1e12
                 for r in members]
        summary.append({"kernel": kernel, "dtype": dtype, "pass": pass_, "rows": len(members),
                        "median_rate": statistics.median(rates),
                        "median_ratio": statistics.median(ratios) if ratios else 0.0,
                        "min_ratio": min(ratios, default=0.0),
                        "max_ratio": max(ratios, default=0.0)})
    return summary


def _varlen_lengths(profile: str, tokens: int) -> tuple[int, ...]:
    from slimpack import data

    return tuple(int(n) for n in data.sample_batch(profile, token_budget=tokens, context=tokens,
                                                   seed=0).lengths)


def time_kernel(fn: Callable[[], object], *, min_ms: float = 40.0, samples: int = 5) -> float:
    """Median seconds of one call of ``fn``: warm up, size a batch of launches to about
    ``min_ms / samples`` each, time ``samples`` batches (CUDA events on a GPU, the wall clock
    on a CPU, where only the code path is of interest)."""
    cuda = torch.cuda.is_available()

    def batch_seconds(calls: int) -> float:
        if not cuda:
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            return time.perf_counter() - t
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    fn()
    if cuda:
        torch.cuda.synchronize()
    once_ms = max(batch_seconds(1) * 1e3, 1e-3)
    per_sample = max(1, int(min_ms / samples / once_ms))
    batch_seconds(per_sample)  # warm-up at the timed rate, so clocks settle
    return statistics.median(batch_seconds(per_sample) / per_sample for _ in range(samples))


def layer_gemm_shapes(model: str, tp: int, tokens: int) -> list[tuple[str, int, int, int]]:
    """The four fprop GEMMs of one decoder layer, ``(name, m, n, k)``, at tensor parallelism
    ``tp`` (column-parallel outputs and row-parallel inputs divided by ``tp``)."""
    spec = model_preset(model)
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    return [("qkv", tokens, qkv // tp, spec.hidden),
            ("attn_out", tokens, spec.hidden, spec.num_heads * spec.head_dim // tp),
            ("gate_up", tokens, 2 * spec.ffn_hidden // tp, spec.hidden),
            ("down", tokens, spec.hidden, spec.ffn_hidden // tp)]


def gemm_shapes() -> list[tuple[str, int, int, int]]:
    """Square GEMMs; every layer GEMM's fprop at each tp and token count; its dgrad
    ``(m x n) @ (n x k)`` and wgrad ``(n x m) @ (m x k)`` at the extreme tps and the larger
    token count (the backward's shapes: wgrad reduces over the tokens)."""
    shapes = [(f"square {s}", s, s, s) for s in GEMM_SQUARES]
    for model in LAYER_MODELS:
        for tp in LAYER_TPS:
            for tokens in LAYER_TOKENS:
                for name, m, n, k in layer_gemm_shapes(model, tp, tokens):
                    shapes.append((f"{model} tp{tp} {name} fprop {tokens} tokens", m, n, k))
                    if tokens == max(LAYER_TOKENS) and tp in (min(LAYER_TPS), max(LAYER_TPS)):
                        shapes.append((f"{model} tp{tp} {name} dgrad {tokens} tokens", m, k, n))
                        shapes.append((f"{model} tp{tp} {name} wgrad {tokens} tokens", n, k, m))
    return shapes


def gemm_sweep(hw: HardwareSpec, device_name: str, dtypes: Iterable[str] = ("bf16", "fp8"),
               progress: Callable[[str], None] = print, *,
               shapes: list[tuple[str, int, int, int]] | None = None,
               device: str = "cuda") -> list[KernelRow]:
    dev = torch.device(device)
    rows = []
    for dtype in dtypes:
        for shape, m, n, k in shapes or gemm_shapes():
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            if dtype == "bf16":
                fn = lambda a=a, w=w: torch.matmul(a, w.t())  # noqa: E731
            else:
                a8 = a.to(torch.float8_e4m3fn)
                w8 = w.to(torch.float8_e4m3fn)
                one = torch.ones((), device=dev, dtype=torch.float32)
                fn = lambda a8=a8, w8=w8, one=one: torch._scaled_mm(  # noqa: E731
                    a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            row = KernelRow(sweep="gemm", kernel="torch._scaled_mm" if dtype == "fp8"
                            else "torch.matmul", dtype=dtype, shape=shape, m=m, n=n, k=k,
                            measured_s=time_kernel(fn), flops=2.0 * m * n * k, model_s=0.0,
                            device=device_name)
            rows.append(priced(row, hw))
            progress(f"gemm {dtype} {shape}: {rows[-1].as_csv()['tflops']:.0f} TFLOP/s, "
                     f"model/measured {rows[-1].as_csv()['model_over_measured']:.2f}")
            del a, w
    return rows


_SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                  "efficient": "EFFICIENT_ATTENTION"}


def attention_sweep(hw: HardwareSpec, device_name: str,
                    progress: Callable[[str], None] = print, *,
                    seqlens: tuple[int, ...] = ATTENTION_SEQLENS,
                    backends: tuple[str, ...] = ATTENTION_BACKENDS, tokens: int = ATTENTION_TOKENS,
                    hidden: int = ATTENTION_HIDDEN, device: str = "cuda") -> list[KernelRow]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for backend in backends:
        sdp = getattr(SDPBackend, _SDPA_BACKENDS[backend])
        for head_dim in (64, 128):
            heads = hidden // head_dim
            for causal in (False, True):
                for seqlen in seqlens:
                    batch = max(1, tokens // seqlen)
                    try:
                        with sdpa_kernel([sdp]):
                            fwd, bwd = _time_sdpa(batch, heads, seqlen, head_dim, causal, device)
                    except RuntimeError as exc:  # backend refuses this shape or is absent
                        progress(f"attention {backend} d{head_dim} s{seqlen}: not run ({exc})"
                                 .splitlines()[0][:160])
                        continue
                    flops = 4.0 * batch * heads * seqlen * seqlen * head_dim
                    flops *= 0.5 if causal else 1.0
                    for pass_, seconds, mult in (("fwd", fwd, 1.0),
                                                 ("bwd", bwd, K.BWD_ATTENTION_FLOP_RATIO)):
                        row = KernelRow(
                            sweep="attention", kernel=f"sdpa-{backend}", dtype="bf16",
                            shape=f"b{batch} h{heads} s{seqlen} d{head_dim}", pass_=pass_,
                            causal=int(causal), head_dim=head_dim, heads=heads, batch=batch,
                            seqlen=seqlen, measured_s=seconds, flops=flops * mult, model_s=0.0,
                            device=device_name)
                        rows.append(priced(row, hw))
                    progress(f"attention {backend} d{head_dim} causal={int(causal)} s{seqlen}: "
                             f"fwd {rows[-2].as_csv()['tflops']:.0f}, bwd "
                             f"{rows[-1].as_csv()['tflops']:.0f} TFLOP/s")
    return rows


def _time_sdpa(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool,
               device: str) -> tuple[float, float]:
    """(forward, backward) seconds of one SDPA call under the active backend selection."""
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device=device, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad = torch.randn_like(out)
    fwd = time_kernel(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    bwd = time_kernel(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
    return fwd, bwd


def varlen_sweep(hw: HardwareSpec, device_name: str,
                 progress: Callable[[str], None] = print, *,
                 profiles: tuple[str, ...] = VARLEN_PROFILES,
                 token_counts: tuple[int, ...] = VARLEN_TOKENS,
                 heads: tuple[int, int, int] = VARLEN_HEADS, backend: str = "torch-varlen",
                 device: str = "cuda") -> list[KernelRow]:
    """One causal varlen call over each profile's documents (seed 0, documents cut at the
    token count), beside the model's per-document price (``hopper-fa2`` constants for the
    FlashAttention-2 class kernel on Hopper, the family's own otherwise)."""
    from slimpack.runtime.attention import VarlenLayout, varlen_causal_attention

    nh, nkv, d = heads
    rows = []
    for profile in profiles:
        for tokens in token_counts:
            lengths = _varlen_lengths(profile, tokens)
            layout = VarlenLayout(q_lens=lengths, k_lens=lengths)
            q = torch.randn(sum(lengths), nh, d, device=device, dtype=torch.bfloat16,
                            requires_grad=True)
            k, v = (torch.randn(sum(lengths), nkv, d, device=device, dtype=torch.bfloat16,
                                requires_grad=True) for _ in range(2))
            out = varlen_causal_attention(q, k, v, layout, backend=backend)
            grad = torch.randn_like(out)
            fwd = time_kernel(lambda q=q, k=k, v=v, layout=layout: varlen_causal_attention(
                q, k, v, layout, backend=backend))
            bwd = time_kernel(lambda out=out, q=q, k=k, v=v, grad=grad: torch.autograd.grad(
                out, (q, k, v), grad, retain_graph=True))
            flops = sum(4.0 * n * n * d * nh * 0.5 for n in lengths)
            for pass_, seconds, mult in (("fwd", fwd, 1.0),
                                         ("bwd", bwd, K.BWD_ATTENTION_FLOP_RATIO)):
                row = KernelRow(sweep="varlen", kernel=backend, dtype="bf16",
                                shape=f"{profile} {tokens} tokens, {len(lengths)} docs, "
                                f"longest {max(lengths)}", pass_=pass_, causal=1, head_dim=d,
                                heads=nh, batch=len(lengths), seqlen=tokens, profile=profile,
                                measured_s=seconds, flops=flops * mult, model_s=0.0,
                                device=device_name)
                rows.append(priced(row, hw))
            progress(f"varlen {profile} {tokens}: {len(lengths)} docs, fwd "
                     f"{fwd * 1e3:.2f} ms (model/measured "
                     f"{rows[-2].as_csv()['model_over_measured']:.2f}), bwd {bwd * 1e3:.2f} ms "
                     f"({rows[-1].as_csv()['model_over_measured']:.2f})")
            del q, k, v, out, grad
    return rows


def memory_sweep(hw: HardwareSpec, device_name: str,
                 progress: Callable[[str], None] = print, *, copy_mib: tuple[int, ...] = (1024, 4096),
                 cast_shapes: tuple[tuple[int, int], ...] = ((16384, 4096), (16384, 8192)),
                 device: str = "cuda") -> list[KernelRow]:
    dev = torch.device(device)
    rows = []
    for mib in copy_mib:
        n = mib * 2**20 // 2
        src = torch.randn(n, device=dev, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        seconds = time_kernel(lambda src=src, dst=dst: dst.copy_(src))
        moved = 2 * n * 2
        rows.append(priced(KernelRow(sweep="memory", kernel="copy", dtype="bf16",
                                     shape=f"{mib} MiB", bytes=moved, measured_s=seconds,
                                     model_s=0.0, device=device_name), hw))
        progress(f"memory copy {mib} MiB: {moved / seconds / 1e12:.2f} TB/s")
        del src, dst
    for tokens, hidden in cast_shapes:
        x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)

        def cast(x=x):
            amax = x.abs().amax().float()
            return (x * (448.0 / amax)).to(torch.float8_e4m3fn)

        seconds = time_kernel(cast)
        moved = tokens * hidden * (2 + 1)  # read bf16, write fp8 (the amax pass reads again)
        rows.append(priced(KernelRow(sweep="memory", kernel="fp8-cast+amax (eager)",
                                     dtype="fp8", shape=f"{tokens}x{hidden}", m=tokens, k=hidden,
                                     bytes=moved, measured_s=seconds, model_s=0.0,
                                     device=device_name), hw))
        progress(f"fp8 cast+amax {tokens}x{hidden}: {seconds * 1e6:.0f} us")
        del x
    return rows


def write_rows(rows: list[KernelRow], path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_FIELDS))
        writer.writeheader()
        writer.writerows(r.as_csv() for r in rows)
