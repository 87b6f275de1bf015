"""Pieces several baselines share: fixed-length sample layout and plan finishing."""
