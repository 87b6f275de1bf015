"""Reimplemented baselines (docs/methods.md); each module exposes
``plan(batch, setup, options) -> Plan`` (``slimpack.planning.setup.PlanSetup``, the method's
options dataclass) and is registered by name in :mod:`slimpack.methods`; call it through
``slimpack.compare.plan_method``, which builds both and times the planner."""
