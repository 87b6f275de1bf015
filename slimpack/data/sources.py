"""Turn a user's SOURCE (a profile name or a path) into a profile or a set of real lengths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from slimpack.data.lengths import LengthData
from slimpack.data.profile import Profile, available_profiles, load_profile
from slimpack.data.read_megatron import megatron_index_path
from slimpack.data.readers import read_lengths

LengthSource = Profile | LengthData


def resolve_source(
    source: str | Path | Profile | LengthData,
    *,
    column: str | None = None,
    text_column: str | None = None,
    tokenizer: str | Callable[[str], object] | None = None,
) -> LengthSource:
    """A ``Profile`` for a profile name or profile JSON, else the lengths read from a path."""
    if isinstance(source, Profile | LengthData):
        return source
    path = Path(source)
    if path.exists() or megatron_index_path(path) is not None:
        if path.is_file() and path.suffix == ".json" and _starts_with_object(path):
            return load_profile(path)
        return read_lengths(path, column=column, text_column=text_column, tokenizer=tokenizer)
    names = available_profiles()
    if str(source) in names:
        return load_profile(str(source))
    raise ValueError(
        f"{source}: neither an existing file/folder nor a profile name; profiles are {names}"
    )


def source_label(source: LengthSource) -> str:
    return source.name if isinstance(source, Profile) else source.source


def _starts_with_object(path: Path) -> bool:
    # A profile is a JSON object; a length file is a JSON list. Peek instead of parsing twice.
    with path.open("rb") as handle:
        head = handle.read(256).lstrip()
    return head.startswith(b"{")
