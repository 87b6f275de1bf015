"""The runtime's gradient-parity matrix on CPU gloo: each case runs a hand-built plan on real
processes and compares loss and every parameter gradient with the unsliced single-process
model (docs/architecture.md, runtime, prints the table this writes).

    python -m slimpack.runtime.parity_matrix [--only NAME ...]

Cases combine tensor parallelism (with sequence parallelism), context parallelism (ring
all-gather of K/V, both shardings) and Ulysses, pipeline and data parallelism, virtual stages,
slices with a KV cache, asymmetric units, every recompute mode and offload, ZeRO-3
parameter sharding (gradients compared whole, gathered from the shards), and the LM head spread
over the pipeline ranks (``vocab_parallel_pp``, "head over pp" cases).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from slimpack.plan import Phase, Plan
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.examples import flexsp_plan, packed_plan, slimpack_plan, slimpipe_plan
from slimpack.runtime.launch import run_in_process_group, run_plan
from slimpack.runtime.parity import Parity, parity
from slimpack.runtime.reference import reference_step
from slimpack.specs import model_preset


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    make: Callable[[], Plan]
    model: str = "tiny"
    recompute: str = "none"
    recompute_layers: int | None = None
    offload: float = 0.0
    zero_stage: int | None = None
    vocab_parallel_pp: bool = False

    def plan(self) -> Plan:
        plan = self.make()
        phases = tuple(Phase(groups=tuple(
            dataclasses.replace(g, recompute=self.recompute,
                                recompute_layers=self.recompute_layers, offload=self.offload,
                                vocab_parallel_pp=self.vocab_parallel_pp)
            for g in ph.groups)) for ph in plan.phases)
        return dataclasses.replace(plan, phases=phases, zero_stage=self.zero_stage)


CASES: tuple[Case, ...] = (
    # One rank: the subset the GPU check runs on a single device (`make gpu-check`).
    Case(name="1 rank, 4 slices/seq, selective, offload 0.5",
         make=lambda: slimpipe_plan(pp=1, dp=1), recompute="selective", offload=0.5),
    Case(name="1 rank, asymmetric units, full", make=lambda: slimpack_plan(pp=1, dp=1),
         recompute="full"),
    Case(name="1 rank, asymmetric units, full on each chunk's first 2 of 4 layers",
         make=lambda: slimpack_plan(pp=1, dp=1), recompute="full", recompute_layers=2),
    Case(name="1 rank vpp2, asymmetric units, selective",
         make=lambda: slimpack_plan(pp=1, dp=1, vpp=2), recompute="selective"),
    Case(name="1 rank, packed documents, tied embeddings, offload 0.5",
         make=lambda: packed_plan(pp=1, dp=1), model="tiny-mha", offload=0.5),
    Case(name="pp2 dp2, 4 slices/seq", make=lambda: slimpipe_plan(pp=2, dp=2)),
    Case(name="pp2 dp2, 4 slices/seq, selective, offload 0.5",
         make=lambda: slimpipe_plan(pp=2, dp=2), recompute="selective", offload=0.5),
    Case(name="pp2 dp2, 4 slices/seq, full, offload 0.5",
         make=lambda: slimpipe_plan(pp=2, dp=2), recompute="full", offload=0.5),
    Case(name="pp2 dp2, 4 slices/seq, full on each stage's first of 2 layers",
         make=lambda: slimpipe_plan(pp=2, dp=2), recompute="full", recompute_layers=1),
    Case(name="tp2, asymmetric units", make=lambda: slimpack_plan(pp=1, dp=1, tp=2)),
    Case(name="tp2 pp2, 4 slices/seq, selective, offload 0.5",
         make=lambda: slimpipe_plan(pp=2, dp=1, tp=2), recompute="selective", offload=0.5),
    Case(name="tp2 dp2, asymmetric units, full, offload 0.5",
         make=lambda: slimpack_plan(pp=1, dp=2, tp=2), recompute="full", offload=0.5),
    Case(name="tp2 pp2 vpp2, asymmetric units, full",
         make=lambda: slimpack_plan(pp=2, dp=1, vpp=2, tp=2), recompute="full"),
    Case(name="tp2 pp2, packed documents, tied embeddings",
         make=lambda: packed_plan(pp=2, dp=1, tp=2), model="tiny-mha"),
    Case(name="tp4, kv heads replicated", make=lambda: slimpack_plan(pp=1, dp=1, tp=4)),
    Case(name="tp2 pp2 dp2, asymmetric units, selective, offload 0.5",
         make=lambda: slimpack_plan(pp=2, dp=2, tp=2), recompute="selective", offload=0.5),
    # Context parallelism and Ulysses, alone and inside tp groups (ranks (pp, cp, tp)).
    Case(name="cp2 dp2 ring per-document, asymmetric units",
         make=lambda: slimpack_plan(pp=1, dp=2, cp=2, cp_sharding="per-document")),
    Case(name="cp2 pp2 ring per-sequence, 4 slices/seq, full, offload 0.5",
         make=lambda: slimpipe_plan(pp=2, dp=1, cp=2), recompute="full", offload=0.5),
    Case(name="ulysses4, asymmetric units, selective",
         make=lambda: slimpack_plan(pp=1, dp=1, cp=4, cp_kind="ulysses"),
         recompute="selective"),
    Case(name="tp2 cp2 ring per-document, asymmetric units, full, offload 0.5",
         make=lambda: slimpack_plan(pp=1, dp=1, tp=2, cp=2, cp_sharding="per-document"),
         recompute="full", offload=0.5),
    Case(name="tp2 ulysses2, asymmetric units",
         make=lambda: slimpack_plan(pp=1, dp=1, tp=2, cp=2, cp_kind="ulysses")),
    Case(name="tp2 cp2 pp2 ring per-sequence, 4 slices/seq, selective",
         make=lambda: slimpipe_plan(pp=2, dp=1, tp=2, cp=2), recompute="selective"),
    Case(name="cp2 pp2 ring per-document, packed documents, tied embeddings",
         make=lambda: packed_plan(pp=2, dp=1, cp=2, cp_sharding="per-document"),
         model="tiny-mha"),
    Case(name="ulysses2 dp2, asymmetric units, offload 0.5",
         make=lambda: slimpack_plan(pp=1, dp=2, cp=2, cp_kind="ulysses"), offload=0.5),
    Case(name="tp2 cp2 pp2 vpp2 ring per-document, asymmetric units, full",
         make=lambda: slimpack_plan(pp=2, dp=1, vpp=2, tp=2, cp=2, cp_sharding="per-document"),
         recompute="full"),
    Case(name="tp2 ulysses2 pp2, packed documents, tied embeddings",
         make=lambda: packed_plan(pp=2, dp=1, tp=2, cp=2, cp_kind="ulysses"), model="tiny-mha"),
    Case(name="ulysses2 pp2, packed documents, tied embeddings",
         make=lambda: packed_plan(pp=2, dp=1, cp=2, cp_kind="ulysses"), model="tiny-mha"),
    Case(name="tp2 ulysses2, asymmetric units, selective, offload 0.5",
         make=lambda: slimpack_plan(pp=1, dp=1, tp=2, cp=2, cp_kind="ulysses"),
         recompute="selective", offload=0.5),
    Case(name="tp2 cp2 pp2 ring per-document, packed documents, tied embeddings",
         make=lambda: packed_plan(pp=2, dp=1, tp=2, cp=2, cp_sharding="per-document"),
         model="tiny-mha"),
    # ZeRO-3: parameters sharded over the ranks holding a stage (dp and cp), gathered per
    # plan phase, gradients reduce-scattered.
    Case(name="zero3, FlexSP phases: ulysses4; ulysses2 x2; 1 x3 + idle rank",
         make=flexsp_plan, zero_stage=3),
    Case(name="zero3, FlexSP phases, tied embeddings, full",
         make=flexsp_plan, model="tiny-mha", recompute="full", zero_stage=3),
    Case(name="zero3 pp2 dp2, 4 slices/seq", make=lambda: slimpipe_plan(pp=2, dp=2),
         zero_stage=3),
    Case(name="zero3 tp2 dp2, asymmetric units, selective, offload 0.5",
         make=lambda: slimpack_plan(pp=1, dp=2, tp=2), recompute="selective", offload=0.5,
         zero_stage=3),
    Case(name="zero3 cp2 dp2 ring per-document, asymmetric units",
         make=lambda: slimpack_plan(pp=1, dp=2, cp=2, cp_sharding="per-document"),
         zero_stage=3),
    # The LM head and loss spread over the pipeline ranks (vocab/(pp*tp) rows per rank).
    Case(name="pp2 dp2, 4 slices/seq, head over pp", make=lambda: slimpipe_plan(pp=2, dp=2),
         vocab_parallel_pp=True),
    Case(name="pp2 dp2, asymmetric units, head over pp, full, offload 0.5",
         make=lambda: slimpack_plan(pp=2, dp=2), recompute="full", offload=0.5,
         vocab_parallel_pp=True),
    Case(name="pp2 vpp2 dp2, asymmetric units, head over pp, selective",
         make=lambda: slimpack_plan(pp=2, dp=2, vpp=2), recompute="selective",
         vocab_parallel_pp=True),
    Case(name="pp4, packed documents (1f1b), head over pp", make=lambda: packed_plan(pp=4, dp=1),
         vocab_parallel_pp=True),
    Case(name="tp2 pp2 dp2, asymmetric units, head over pp",
         make=lambda: slimpack_plan(pp=2, dp=2, tp=2), vocab_parallel_pp=True),
    Case(name="cp2 pp2 ring per-document, packed documents, head over pp",
         make=lambda: packed_plan(pp=2, dp=1, cp=2, cp_sharding="per-document"),
         vocab_parallel_pp=True),
    Case(name="ulysses2 pp2, 4 slices/seq, head over pp",
         make=lambda: slimpipe_plan(pp=2, dp=1, cp=2, cp_kind="ulysses"),
         vocab_parallel_pp=True),
    Case(name="tp2 cp2 pp2 vpp2 ring per-sequence, asymmetric units, head over pp",
         make=lambda: slimpack_plan(pp=2, dp=1, vpp=2, tp=2, cp=2), vocab_parallel_pp=True),
    Case(name="zero3 pp2 dp2, 4 slices/seq, head over pp", make=lambda: slimpipe_plan(pp=2, dp=2),
         zero_stage=3, vocab_parallel_pp=True),
)


def single_rank_cases() -> tuple[Case, ...]:
    """The cases whose plan runs on one rank: what a single GPU can check without emulating
    ranks it does not have."""
    return tuple(c for c in CASES if c.plan().world_size == 1)


def run_case(case: Case, *, seed: int = 3) -> tuple[Parity, int, float]:
    """(parity, world size, seconds) on CPU gloo, spawning the plan's ranks."""
    plan, spec = case.plan(), model_preset(case.model)
    start = time.perf_counter()
    result = run_plan(plan, spec, RuntimeConfig(seed=seed), return_grads=True, timeout_s=300)
    ref = reference_step(spec, plan.sequence_lengths, seed=seed)
    return (parity(result.loss, result.grads(), ref.loss, ref.grads), plan.world_size,
            time.perf_counter() - start)


def run_single_rank_case(case: Case, config: RuntimeConfig, *, seed: int = 3) -> Parity:
    """One single-rank case in the caller's process group of one rank (the GPU check: CUDA,
    NCCL), against the fp32 unsliced reference on the same device. The bounds of
    :class:`Parity` are CPU fp32's; callers on other devices judge the errors themselves."""
    plan, spec = case.plan(), model_preset(case.model)
    if plan.world_size != 1:
        raise ValueError(f"case {case.name!r} needs {plan.world_size} ranks; "
                         f"run_single_rank_case runs world-1 cases only")
    result = run_in_process_group(plan, spec, dataclasses.replace(config, seed=seed), rank=0,
                                  local_rank=0, return_grads=True)
    ref = reference_step(spec, plan.sequence_lengths, seed=seed, device=config.device)
    return parity(result.loss, result.grads(), ref.loss, ref.grads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="case names to run (default all)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    print("| case | model | world | loss rel. error | max grad rel. error (param) | ok |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for case in cases:
        check, world, _ = run_case(case)
        failed += not check.ok
        print(f"| {case.name} | {case.model} | {world} | {check.loss_rel:.1e} | "
              f"{check.max_grad_rel:.1e} ({check.worst}) | {'yes' if check.ok else 'NO'} |",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
