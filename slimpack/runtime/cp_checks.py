"""What the runtime checks about a group's context parallelism before any process starts."""

from __future__ import annotations

from slimpack.plan import Group
from slimpack.specs.model import ModelSpec


def check_cp_group(group: Group, model: ModelSpec) -> None:
    """Raise ValueError, naming the field, for cp settings the runtime cannot execute.

    ``cp_kind="ring"`` runs for any degree and either ``cp_sharding``; ``"ulysses"`` splits
    the attention heads each tp rank holds (``num_heads / tp``) over the cp ranks, so they
    must divide evenly.
    """
    if group.cp == 1:
        return
    local_heads = model.num_heads // group.tp
    if group.cp_kind == "ulysses" and local_heads % group.cp:
        raise ValueError(f"group {group.group_id}: cp_kind='ulysses' needs cp={group.cp} to "
                         f"divide num_heads={model.num_heads} / tp={group.tp} = {local_heads} "
                         f"heads per tp rank ({model.name})")
