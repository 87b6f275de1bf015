"""Validation of the cost model and simulator against published, measured training runs."""

from slimpack.validation.megatron import (
    Case,
    Skipped,
    ValidationReport,
    ValidationRow,
    express,
    load_records,
    validate,
)

__all__ = ["Case", "Skipped", "ValidationReport", "ValidationRow", "express", "load_records",
           "validate"]
