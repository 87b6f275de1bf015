"""Fuzzing every registered planner: random batches x random layouts x random methods.

For each case a method is drawn from the registry, a layout the method accepts is drawn, and
the plan is checked against the simulator:

* it validates (``Plan.validate``) and holds every token of the batch;
* its ``memory_fits`` verdict equals the simulator's (``not record.oom``);
* it comes back within its time limit +10% (plus ``grace_s`` on a shared machine);
* a fallback says so (``metadata['fallback']``): fallbacks are counted, never silent.

``python -m slimpack.validation.planner_fuzz --cases 10000`` runs the big one; the unit test
runs a few dozen cases. Layouts a model cannot take, or that a method refuses, are the
caller's errors (tested elsewhere) and are skipped, not counted.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.methods import DEFAULT_METHODS, MethodRegistry
from slimpack.sim import simulate
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODELS = ("llama-7b", "llama-13b")
SLACK = 1.10
TIME_LIMIT_S = 2.0
"""Every case's planner time limit: long enough for the slow planners' first answer on these
small batches, short enough that a planner ignoring it shows."""


@dataclass(frozen=True, kw_only=True)
class PlannerFuzzResult:
    cases: int
    """Cases planned (skipped layouts excluded)."""
    failures: list[str]
    fallbacks: Counter = field(default_factory=Counter)
    """Method -> cases that fell back (with a reason)."""
    per_method: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    """Method -> cases it refused with a clear ValueError (e.g. nothing fits memory)."""
    worst_over_limit: float = 0.0
    wall_s: float = 0.0


def _random_case(rng: np.random.Generator) -> tuple[list[int], ParallelSpec, int]:
    n = int(rng.integers(1, 96))
    context = int(rng.choice([4096, 16384, 65536]))
    lengths = np.minimum(rng.lognormal(float(rng.uniform(5.5, 9.0)), float(rng.uniform(0.5, 2.0)),
                                       size=n).astype(int) + 1, context)
    parallel = ParallelSpec(tp=int(rng.choice([1, 2, 4, 8])), cp=int(rng.choice([1, 1, 2, 4])),
                            pp=int(rng.choice([1, 2, 4])), dp=int(rng.choice([1, 2, 4])))
    return [int(x) for x in lengths], parallel, context


def run(cases: int, *, seed: int = 0, grace_s: float = 0.0,
        registry: MethodRegistry = DEFAULT_METHODS) -> PlannerFuzzResult:
    rng = np.random.default_rng(seed)
    hw = hardware_preset("h800")
    costs = {m: default_cost_model(model_preset(m), hw) for m in MODELS}
    methods = registry.names()
    failures: list[str] = []
    fallbacks: Counter = Counter()
    per_method: Counter = Counter()
    refusals: Counter = Counter()
    worst = 0.0
    planned = 0
    started = time.perf_counter()
    for case in range(cases):
        lengths, parallel, context = _random_case(rng)
        method = methods[int(rng.integers(len(methods)))]
        cost = costs[MODELS[case % len(MODELS)]]
        try:
            parallel.validate_for_model(cost.model)
        except ValueError:
            continue
        if not registry.get(method).allows(parallel):
            continue
        batch = Batch.from_lengths(lengths)
        label = f"case {case}: {method}, {len(lengths)} seqs, max {max(lengths)}, {parallel.describe()}"
        t0 = time.perf_counter()
        try:
            plan = plan_method(method, batch, cost.model, hw, parallel, cost, context=context,
                               registry=registry, time_limit_s=TIME_LIMIT_S)
        except ValueError as exc:
            # A clear refusal (e.g. a sequence no layout of this method can hold) is an answer.
            if not str(exc):
                failures.append(f"{label}: a refusal without a message")
            refusals[method] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - a fuzzer reports every crash
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            continue
        elapsed = time.perf_counter() - t0
        planned += 1
        per_method[method] += 1
        try:
            plan.validate()
            record = simulate(plan, model=cost.model, hardware=hw, cost=cost).record
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{label}: invalid plan: {type(exc).__name__}: {exc}")
            continue
        if plan.num_tokens != batch.num_tokens:
            failures.append(f"{label}: {plan.num_tokens} tokens planned of {batch.num_tokens}")
        fits = plan.memory_fits
        if fits is None or fits == bool(record.oom):
            failures.append(f"{label}: planner says memory_fits={fits}, simulator oom={record.oom}")
        if elapsed > SLACK * TIME_LIMIT_S + grace_s:
            failures.append(f"{label}: planned in {elapsed:.2f} s > {SLACK} x {TIME_LIMIT_S} s")
        worst = max(worst, elapsed / TIME_LIMIT_S)
        if plan.metadata.get("fallback"):
            fallbacks[method] += 1
    return PlannerFuzzResult(cases=planned, failures=failures, fallbacks=fallbacks,
                             per_method=per_method, refusals=refusals, worst_over_limit=worst,
                             wall_s=time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="random cases to draw")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    result = run(args.cases, seed=args.seed)
    print(f"planned {result.cases} cases in {result.wall_s:.0f} s; failures "
          f"{len(result.failures)}; worst plan time / limit {result.worst_over_limit:.3f}")
    print("per method: " + ", ".join(f"{m} {n}" for m, n in sorted(result.per_method.items())))
    print("refused (clear ValueError): " + (", ".join(
        f"{m} {n}" for m, n in sorted(result.refusals.items())) or "none"))
    print("fallbacks: " + (", ".join(f"{m} {n}" for m, n in sorted(result.fallbacks.items()))
                           or "none"))
    for line in result.failures[:20]:
        print("  " + line)
    return 1 if result.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
