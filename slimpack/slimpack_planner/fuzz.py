"""Fuzzing the SlimPack planner: random batches x random parallel configurations.

Every plan must validate (``Plan.validate``: coverage, order, schedule rules), hold every
token of its batch, and come back within its time limit +10%. The unit test runs a few
hundred cases; ``python -m slimpack.slimpack_planner.fuzz --cases 10000`` runs the big one
and prints its summary (docs/slimpack-planner.md quotes it).

The heuristic (first) candidate is always finished, so a limit below its build time cannot
hold; such a case must return that answer at once and is counted apart. Search cases get
short limits, so the deadline inside a candidate is what is exercised. Two knobs stress the
limit further: ``--tiny-limits P`` gives a share P of the cases a 0.05-0.5 s limit whatever
their mode, ``--long-tp1 P`` turns a share P into batches holding 1M-token sequences at tp 1
(the slowest plans per sequence: many small slices). Both draw from their own random stream,
so the default cases stay the same.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from slimpack.batch import Batch
from slimpack.cost import AnalyticCostModel
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

MODELS = ("llama-7b", "llama-13b")
SLACK = 1.10


@dataclass(frozen=True, kw_only=True)
class FuzzResult:
    cases: int
    failures: list[str]
    worst_over_limit: float
    """max of plan seconds / time limit over the cases whose heuristic candidate was built
    within the limit."""
    heuristic_over: int
    """cases whose first (heuristic) candidate alone took longer than the limit."""
    searched: int
    wall_s: float


def random_case(rng: np.random.Generator, knobs: np.random.Generator | None = None, *,
                tiny_limits: float = 0.0, long_tp1: float = 0.0,
                ) -> tuple[list[int], ParallelSpec, dict]:
    n = int(rng.integers(1, 160))
    context = int(rng.choice([8192, 65536, 262144, 1048576]))
    lengths = np.minimum(rng.lognormal(float(rng.uniform(5.5, 9.5)), float(rng.uniform(0.5, 2.2)),
                                       size=n).astype(int) + 1, context)
    if rng.random() < 0.2:  # outliers far above the rest (DP-Merge territory)
        lengths[: int(rng.integers(1, 3))] = context
    parallel = ParallelSpec(tp=int(rng.choice([1, 2, 4, 8])), cp=int(rng.choice([1, 1, 2, 4])),
                            pp=int(rng.choice([1, 2, 4, 8])), dp=int(rng.choice([1, 2, 4, 8])))
    search = bool(rng.random() < 0.2)
    options = {"search": search,
               "time_limit_s": float(rng.uniform(0.2, 0.5) if search else rng.uniform(1.0, 3.0))}
    for switch in ("no_slicing", "no_asymmetric", "no_dp_aware", "no_dp_merge"):
        if rng.random() < 0.1:
            options[switch] = True
    if knobs is not None:
        if knobs.random() < long_tp1:
            lengths[: int(knobs.integers(1, 3))] = 1048576
            parallel = ParallelSpec(tp=1, cp=parallel.cp, pp=parallel.pp, dp=parallel.dp)
        if knobs.random() < tiny_limits:
            options["time_limit_s"] = float(knobs.uniform(0.05, 0.5))
    return [int(x) for x in lengths], parallel, options


def run(cases: int, *, seed: int = 0, slack: float = SLACK, grace_s: float = 0.0,
        tiny_limits: float = 0.0, long_tp1: float = 0.0, first_case: int = 0) -> FuzzResult:
    """``cases`` random cases; a case fails when its plan is invalid or loses tokens, or when
    it returns later than ``slack * limit + grace_s`` (``grace_s`` absorbs scheduler noise on a
    shared machine; the standalone run uses none). ``first_case`` skips that many cases of
    the stream (to run a long fuzz in pieces)."""
    from slimpack.planning.setup import PlanSetup
    from slimpack.slimpack_planner import SlimPackOptions, plan

    rng = np.random.default_rng(seed)
    knobs = np.random.default_rng([seed, 1]) if tiny_limits or long_tp1 else None
    hw = hardware_preset("h800")
    costs = {m: AnalyticCostModel(model=model_preset(m), hardware=hw) for m in MODELS}
    failures: list[str] = []
    worst, searched, heuristic_over = 0.0, 0, 0
    started = time.perf_counter()
    for case in range(first_case + cases):
        lengths, parallel, options = random_case(rng, knobs, tiny_limits=tiny_limits,
                                                 long_tp1=long_tp1)
        if case < first_case:
            continue
        cost = costs[MODELS[case % len(MODELS)]]
        batch = Batch.from_lengths(lengths)
        label = f"case {case}: {len(lengths)} seqs, max {max(lengths)}, {parallel}, {options}"
        try:
            parallel.validate_for_model(cost.model)
        except ValueError:
            continue  # a layout the model cannot take is the caller's error, tested elsewhere
        t0 = time.perf_counter()
        try:
            result = plan(batch, PlanSetup(model=cost.model, hardware=hw, parallel=parallel,
                                           cost=cost), SlimPackOptions.from_kwargs(options))
        except Exception as exc:  # noqa: BLE001 - a fuzzer reports every failure
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            continue
        elapsed = time.perf_counter() - t0
        searched += options["search"]
        if result.num_tokens != batch.num_tokens:
            failures.append(f"{label}: {result.num_tokens} tokens planned of {batch.num_tokens}")
        tried = result.metadata["search"]
        if tried[0]["built_s"] > options["time_limit_s"]:
            # The heuristic answer alone overran the limit: it must be returned at once.
            heuristic_over += 1
            if len(tried) > 1:
                failures.append(f"{label}: {len(tried)} candidates after the limit had passed")
        elif elapsed > slack * options["time_limit_s"] + grace_s:
            failures.append(f"{label}: {elapsed:.3f} s > {slack} x limit + {grace_s} s")
        else:
            worst = max(worst, elapsed / options["time_limit_s"])
    return FuzzResult(cases=cases, failures=failures, worst_over_limit=worst, searched=searched,
                      heuristic_over=heuristic_over, wall_s=time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-case", type=int, default=0)
    parser.add_argument("--tiny-limits", type=float, default=0.0,
                        help="share of cases with a 0.05-0.5 s limit")
    parser.add_argument("--long-tp1", type=float, default=0.0,
                        help="share of cases with 1M-token sequences at tp 1")
    args = parser.parse_args(argv)
    for name in ("tiny_limits", "long_tp1"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise ValueError(f"--{name.replace('_', '-')} must be a share in [0, 1], "
                             f"got {getattr(args, name)}")
    result = run(args.cases, seed=args.seed, tiny_limits=args.tiny_limits,
                 long_tp1=args.long_tp1, first_case=args.first_case)
    print(f"cases {result.cases} (search {result.searched}), failures {len(result.failures)}, "
          f"worst plan time / limit {result.worst_over_limit:.3f}, heuristic alone over the "
          f"limit {result.heuristic_over}, wall {result.wall_s:.0f} s")
    for line in result.failures[:20]:
        print("  " + line)
    return 1 if result.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
