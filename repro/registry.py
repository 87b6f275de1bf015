"""Experiment names -> the module that defines each (its ``EXPERIMENT`` attribute).

Immutable and lazy: listing names imports nothing, and an experiment module is imported only
when asked for, so one experiment's missing library API never breaks the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType

from repro.experiment import Experiment

EXPERIMENTS: Mapping[str, str] = MappingProxyType({
    "e2e-throughput": "repro.experiments.e2e_throughput",
    "batch-size": "repro.experiments.batch_size",
    "balance": "repro.experiments.balance",
    "memory": "repro.experiments.memory",
    "ablation": "repro.experiments.ablation",
    "scalability": "repro.experiments.scalability",
    "solver-overhead": "repro.experiments.solver_overhead",
    "slimpipe-max-context": "repro.experiments.slimpipe_max_context",
    "slimpipe-mfu": "repro.experiments.slimpipe_mfu",
    "slimpipe-memory-vs-pp": "repro.experiments.slimpipe_memory_vs_pp",
    "bubbles": "repro.experiments.bubbles",
    "wlb-table2": "repro.experiments.wlb_table2",
    "flexsp-headline": "repro.experiments.flexsp_headline",
    "sim-fidelity": "repro.experiments.sim_fidelity",
    "megatron-validation": "repro.experiments.megatron_validation",
    "robustness": "repro.experiments.robustness",
    "outliers": "repro.experiments.outliers",
    "paper-scale": "repro.experiments.paper_scale",
})


def experiment_names(registry: str = "repro.registry") -> list[str]:
    return list(_table(registry))


def resolve_experiment(name: str, registry: str = "repro.registry") -> Experiment:
    """The experiment called ``name``; ValueError lists the known names."""
    table = _table(registry)
    if name not in table:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(table)} (or 'all')")
    experiment = importlib.import_module(table[name]).EXPERIMENT
    if experiment.name != name:
        raise ValueError(f"{table[name]} defines experiment {experiment.name!r}, registered as {name!r}")
    return experiment


def expand_names(names: list[str], registry: str = "repro.registry") -> list[str]:
    """``all`` -> every experiment in registry order; others checked and kept in given order."""
    table = _table(registry)
    if "all" in names:
        return list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown experiment(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(table)} (or 'all')")
    return list(dict.fromkeys(names))


def _table(registry: str) -> Mapping[str, str]:
    if registry == __name__:
        return EXPERIMENTS
    return importlib.import_module(registry).EXPERIMENTS
