"""Specs: what model, what hardware, how it is split (frozen keyword-only dataclasses)."""

from slimpack.specs.hardware import HARDWARE_PRESETS, HardwareSpec, hardware_preset
from slimpack.specs.model import MODEL_PRESETS, ModelSpec, model_preset
from slimpack.specs.parallel import ParallelSpec, RankCoords

__all__ = [
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "HardwareSpec",
    "ModelSpec",
    "ParallelSpec",
    "RankCoords",
    "hardware_preset",
    "model_preset",
]
