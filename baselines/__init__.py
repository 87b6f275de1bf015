"""Reimplemented baselines (docs/methods.md); each module exposes
``plan(batch, model, hardware, parallel, cost, **options) -> Plan`` and is registered by name
in :mod:`slimpack.methods`."""
