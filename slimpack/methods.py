"""The method registry: names -> each method's own :class:`~slimpack.planning.method.MethodSpec`.

A method declares itself (planner, options dataclass, schedule family, allowed layouts) in
its own module as ``METHOD``; this table only says where to find it. It is immutable and
lazy, so listing names imports no planner, and holds no mutable global state. A new method
adds one row here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType

from slimpack.planning.method import MethodSpec, Planner

METHODS: Mapping[str, str] = MappingProxyType({
    "reference": "baselines.reference",
    "naive": "baselines.naive",
    "megatron": "baselines.megatron",
    "megatron-causal": "baselines.megatron_causal",
    "megatron-dcp": "baselines.megatron_dcp",
    "wlb-llm": "baselines.wlb_llm.method",
    "flexsp": "baselines.flexsp.method",
    "ulysses-static": "baselines.flexsp.ulysses_static",
    "ulysses-adaptive": "baselines.flexsp.ulysses_adaptive",
    "slimpipe": "baselines.slimpipe",
    "slimpack": "slimpack.slimpack_planner.method",
})


def method_names() -> list[str]:
    """Every registered method, in registry order."""
    return list(METHODS)


def compared_method_names() -> list[str]:
    """The methods the suite compares on every workload (``MethodSpec.compared``), in registry
    order: the harness's all-method experiments and the figures' order read this."""
    return [name for name in METHODS if get_method(name).compared]


def get_method(name: str) -> MethodSpec:
    """The spec registered as ``name``; ValueError lists the registered names."""
    module_name = METHODS.get(name)
    if module_name is None:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(METHODS)}")
    spec = importlib.import_module(module_name).METHOD
    if spec.name != name:
        raise ValueError(f"{module_name} declares method {spec.name!r}, registered as {name!r}")
    return spec


def get_planner(name: str) -> Planner:
    """The planner function of method ``name``."""
    return get_method(name).planner
