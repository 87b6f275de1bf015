"""Adapters that let other training stacks consume suite plans."""
