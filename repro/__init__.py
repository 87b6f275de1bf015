"""Reproduction harness: experiments, sweep runner, figures and the claims report."""
