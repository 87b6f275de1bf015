"""Output files: checked before any work, written atomically, JSON kept strict.

* ``check_output_path`` runs before a command plans or simulates, so a typo in ``-o`` costs
  nothing instead of a traceback after minutes of work.
* ``atomic_write_text`` writes a temp file in the destination's directory and ``os.replace``s
  it, so a reader never sees half a file, and removes the temp file when anything fails.
* ``strict_json`` never emits bare ``NaN``/``Infinity`` (not JSON, rejected by strict
  parsers): a non-finite float is written as ``null``. Readers treat ``null`` as "no value".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def check_output_path(flag: str, path: str | os.PathLike[str], *,
                      create_parent: bool = False) -> Path:
    """Raise ValueError naming ``flag`` unless ``path`` can be written as a file.

    With ``create_parent`` (commands that create missing directories when they write), the
    nearest existing ancestor must be a writable directory; nothing is created here, so a
    command that fails later leaves no empty directory behind."""
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag} {str(out)!r} is a directory; give a file path")
    parent = out.parent
    if create_parent:
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise ValueError(f"{flag} {str(out)!r}: {str(parent)!r} is not a directory")
    elif not parent.is_dir():
        raise ValueError(f"{flag} {str(out)!r}: directory {str(parent)!r} does not exist; "
                         "create it first")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{flag} {str(out)!r}: directory {str(parent)!r} is not writable")
    return out


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same directory."""
    out = Path(path)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        return finite_or_none(value.item())  # numpy scalars
    return value


def strict_json(value: Any, *, indent: int | None = None, **kwargs: Any) -> str:
    """``json.dumps`` with non-finite floats as null and ``allow_nan=False``."""
    return json.dumps(finite_or_none(value), indent=indent, allow_nan=False, **kwargs)
