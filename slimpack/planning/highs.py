"""A quiet HiGHS model: the one place the suite constructs the MILP solver."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS prints a banner on C-level stdout when constructed; keep ``--json`` clean."""
    fd = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(fd, 1)
        os.close(fd)


def new_highs(*, time_limit_s: float, mip_rel_gap: float, threads: int = 1):
    """A HiGHS instance with logging off, a time limit and an explicit MIP gap (HiGHS's
    default gap is 1e-4 and it reports "Optimal" at that gap, so callers set theirs)."""
    import highspy

    with _quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.setOptionValue("threads", int(threads))
    return h
