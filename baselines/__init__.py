"""Reimplemented baselines (DESIGN section 8); each module exposes
``plan(batch, model, hardware, parallel, cost, **options) -> Plan`` and is registered by name
in :mod:`slimpack.methods`."""
