"""The method registry: names -> each method's own :class:`~slimpack.planning.method.MethodSpec`.

A method declares itself (planner, options dataclass, schedule family, allowed layouts, its
harness search budget) in its own module as ``METHOD``; the registry only says where to find
it. :data:`DEFAULT_METHODS` is the suite's registry, and the module functions
(:func:`method_names`, :func:`get_method`, ...) read it. A registry is an immutable value, so a
caller that wants one more method (a test, a user's own planner) builds
``DEFAULT_METHODS.with_methods(spec)`` and passes it to the code that takes ``registry=``
(``slimpack.compare``, the CLI's ``main``, the harness's all-method experiments) instead of
mutating a global. Module-path entries are imported when first asked for, so listing names
imports no planner.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slimpack.planning.method import MethodSpec, Planner

Entry = str | MethodSpec
"""A registry entry: the module declaring ``METHOD`` (imported lazily), or the spec itself."""


@dataclass(frozen=True)
class MethodRegistry:
    """Method names -> their specs, in display order (figures, ``slimpack methods``, the
    harness's all-method experiments). Picklable, so ``compare(jobs > 1)`` can hand it to its
    worker processes."""

    entries: tuple[tuple[str, Entry], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.entries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"MethodRegistry: method names registered twice: {duplicates}")
        for name, entry in self.entries:
            if not isinstance(name, str) or not name or name != name.strip() or ":" in name:
                raise ValueError(f"MethodRegistry: a method name must be a non-empty string "
                                 f"without spaces at its ends or ':' (the variant separator), "
                                 f"got {name!r}")
            if isinstance(entry, MethodSpec):
                if entry.name != name:
                    raise ValueError(f"MethodRegistry: spec {entry.name!r} registered as "
                                     f"{name!r}")
            elif not isinstance(entry, str) or not entry:
                raise ValueError(f"MethodRegistry: entry {name!r} must be a module path or a "
                                 f"MethodSpec, got {entry!r}")

    def names(self) -> list[str]:
        """Every registered method, in registry order."""
        return [name for name, _ in self.entries]

    def compared_names(self) -> list[str]:
        """The methods the suite compares on every workload (``MethodSpec.compared``), in
        registry order: the harness's all-method experiments read this."""
        return [name for name in self.names() if self.get(name).compared]

    def get(self, name: str) -> MethodSpec:
        """The spec registered as ``name``; ValueError lists the registered names."""
        entry = dict(self.entries).get(name)
        if entry is None:
            raise ValueError(f"unknown method {name!r}; allowed: {', '.join(self.names())}")
        if isinstance(entry, MethodSpec):
            return entry
        spec = importlib.import_module(entry).METHOD
        if spec.name != name:
            raise ValueError(f"{entry} declares method {spec.name!r}, registered as {name!r}")
        return spec

    def planner(self, name: str) -> Planner:
        """The planner function of method ``name``."""
        return self.get(name).planner

    def with_methods(self, *specs: MethodSpec, **modules: str) -> MethodRegistry:
        """This registry plus ``specs`` (registered under their names) and ``modules``
        (``name="package.module"`` declaring ``METHOD``), after the existing entries; a name
        already registered is refused (ValueError)."""
        added = [(spec.name, spec) for spec in specs] + list(modules.items())
        return MethodRegistry(entries=self.entries + tuple(added))


DEFAULT_METHODS = MethodRegistry(entries=(
    ("reference", "baselines.reference"),
    ("naive", "baselines.naive"),
    ("megatron", "baselines.megatron"),
    ("megatron-causal", "baselines.megatron_causal"),
    ("megatron-dcp", "baselines.megatron_dcp"),
    ("wlb-llm", "baselines.wlb_llm.method"),
    ("flexsp", "baselines.flexsp.method"),
    ("ulysses-static", "baselines.flexsp.ulysses_static"),
    ("ulysses-adaptive", "baselines.flexsp.ulysses_adaptive"),
    ("slimpipe", "baselines.slimpipe"),
    ("slimpack", "slimpack.slimpack_planner.method"),
))
"""The suite's methods. A new method adds one row here (and its module's ``METHOD``)."""

METHODS: Mapping[str, Entry] = MappingProxyType(dict(DEFAULT_METHODS.entries))
""":data:`DEFAULT_METHODS` as a read-only name -> entry mapping."""


def method_names(registry: MethodRegistry = DEFAULT_METHODS) -> list[str]:
    """Every method of ``registry``, in its order."""
    return registry.names()


def compared_method_names(registry: MethodRegistry = DEFAULT_METHODS) -> list[str]:
    """The methods of ``registry`` the suite compares on every workload, in its order."""
    return registry.compared_names()


def get_method(name: str, registry: MethodRegistry = DEFAULT_METHODS) -> MethodSpec:
    """The spec registered as ``name``; ValueError lists the registered names."""
    return registry.get(name)


def get_planner(name: str, registry: MethodRegistry = DEFAULT_METHODS) -> Planner:
    """The planner function of method ``name``."""
    return registry.planner(name)
