"""What the runtime checks about a group's context parallelism before any process starts."""

from __future__ import annotations

from slimpack.plan import Group
from slimpack.specs.model import ModelSpec


def check_cp_group(group: Group, model: ModelSpec) -> None:
    """Raise ValueError, naming the field, for cp settings the runtime cannot execute.

    ``cp_kind="ring"`` runs for any degree and either ``cp_sharding``; ``"ulysses"`` splits
    attention heads over the cp ranks, so the model's query heads must divide evenly.
    """
    if group.cp == 1:
        return
    if group.tp > 1:
        raise ValueError(f"group {group.group_id}: cp={group.cp} with tp={group.tp}: the "
                         f"runtime runs context parallelism with tp=1 only for now")
    if group.cp_kind == "ulysses" and model.num_heads % group.cp:
        raise ValueError(f"group {group.group_id}: cp_kind='ulysses' needs cp={group.cp} to "
                         f"divide num_heads={model.num_heads} ({model.name})")
