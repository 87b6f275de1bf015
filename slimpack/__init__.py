"""SlimPack suite: packing, slicing and scheduling variable-length sequences for LLM training.

The library core (specs, cost model, plan IR, simulator, runtime) is shared by every method;
SlimPack's own planner lives in :mod:`slimpack.slimpack_planner` and the other methods in ``baselines/``.
"""

__version__ = "0.1.0"
