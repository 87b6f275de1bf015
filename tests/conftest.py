"""Shared test fixtures: where the real length samples live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def shared_dir() -> Path:
    """``../shared`` beside the checkout (or $SLIMPACK_SHARED_DIR)."""
    env = os.environ.get("SLIMPACK_SHARED_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def length_samples_dir() -> Path:
    path = shared_dir() / "length_distributions"
    if not path.is_dir():
        pytest.skip(f"real length samples not found at {path} (set SLIMPACK_SHARED_DIR)")
    return path
