"""Length workloads: shipped length profiles, dataset readers and the global-batch sampler."""

from slimpack.data.empirical import build_empirical_profile
from slimpack.data.lengths import LengthData
from slimpack.data.profile import Profile, available_profiles, load_profile, save_profile
from slimpack.data.readers import read_lengths
from slimpack.data.sampler import SamplerConfig, sample_batch, sample_lengths
from slimpack.data.sources import resolve_source
from slimpack.data.stats import LengthStats, compute_stats

__all__ = [
    "LengthData",
    "LengthStats",
    "Profile",
    "SamplerConfig",
    "available_profiles",
    "build_empirical_profile",
    "compute_stats",
    "load_profile",
    "read_lengths",
    "resolve_source",
    "sample_batch",
    "sample_lengths",
    "save_profile",
]
