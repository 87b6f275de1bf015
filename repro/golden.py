"""Regression guard: headline numbers of cheap quick sweeps, kept per hardware preset.

``python -m repro golden --update`` reruns the quick sweep of :data:`GOLDEN_EXPERIMENTS` in a
scratch directory and writes ``results/golden/<hardware>.json``; ``--check`` (and the test)
reruns it and fails when a headline moves by more than its tolerance. A headline is a claim's
reproduced value, so the guarded numbers are exactly the ones the report publishes.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from repro.report import collect_claims
from repro.runner import RESULTS_DIR, RunOptions, run_experiment

GOLDEN_EXPERIMENTS = ("slimpipe-max-context", "slimpipe-memory-vs-pp", "bubbles", "wlb-table2",
                      "e2e-throughput", "slimpipe-mfu")
"""Quick sweeps cheap enough for a test (about 35 s together on 2 cores). ``e2e-throughput``
pins SlimPack's headline ratios over Megatron-LM (both ends of the bracket) and
``slimpipe-mfu`` SlimPipe's MFU gain at 512K and its MFU at 2048K."""

Headlines = dict[str, dict[str, dict[str, float]]]
"""hardware -> 'experiment/claim_id' -> {'value', 'rel_tol'}."""


def compute_headlines(experiments: tuple[str, ...] = GOLDEN_EXPERIMENTS, *,
                      jobs: int = 1, registry: str = "repro.registry") -> Headlines:
    with tempfile.TemporaryDirectory(prefix="repro-golden-") as scratch:
        options = RunOptions(quick=True, jobs=jobs, results_dir=Path(scratch), progress=False,
                             registry=registry)
        for name in experiments:
            summary = run_experiment(name, options)
            if not summary.ok:
                raise RuntimeError(f"golden sweep {name} failed: {'; '.join(summary.failures)}")
        collected = collect_claims(Path(scratch), registry)
    headlines: Headlines = {}
    for entry in collected:
        if entry.experiment not in experiments:
            continue
        if entry.error:
            raise RuntimeError(f"claims of {entry.experiment} failed: {entry.error}")
        for claim in entry.claims:
            if claim.golden_rel_tol is None:
                continue
            key = f"{entry.experiment}/{claim.claim_id}"
            values = [(key, claim.reproduced)] + [
                (f"{key} vs {name}", value) for name, value in claim.bracket[1:]]
            for name, value in values:
                if math.isfinite(value):
                    headlines.setdefault(claim.hardware, {})[name] = {
                        "value": value, "rel_tol": claim.golden_rel_tol}
    return headlines


def golden_dir(results_dir: Path = RESULTS_DIR) -> Path:
    return results_dir / "golden"


def write_golden(headlines: Headlines, results_dir: Path = RESULTS_DIR) -> list[Path]:
    out = golden_dir(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for hardware, values in sorted(headlines.items()):
        path = out / f"{hardware}.json"
        path.write_text(json.dumps(dict(sorted(values.items())), indent=2) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def read_golden(results_dir: Path = RESULTS_DIR) -> Headlines:
    return {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(golden_dir(results_dir).glob("*.json"))}


def regressions(current: Headlines, golden: Headlines) -> list[str]:
    """Every golden headline that is missing now or moved beyond its tolerance. No golden
    headlines at all is a problem too: a check with nothing to compare must not say "ok"."""
    if not any(golden.values()):
        return ["no golden headlines to compare with (no results/golden/<hardware>.json in the "
                "results dir, or all empty): run `python -m repro golden --update` first"]
    problems = []
    for hardware, values in golden.items():
        for key, ref in values.items():
            now = current.get(hardware, {}).get(key)
            if now is None:
                problems.append(f"{hardware} {key}: missing (golden {ref['value']:g})")
                continue
            allowed = ref["rel_tol"] * abs(ref["value"])
            if abs(now["value"] - ref["value"]) > allowed:
                problems.append(f"{hardware} {key}: {now['value']:g} vs golden {ref['value']:g} "
                                f"(tolerance {ref['rel_tol']:.1%})")
    return problems
