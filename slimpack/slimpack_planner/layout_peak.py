"""A group's memory peak guessed from its layout, before any slice is built (*reconstructed*).

The planner's memory check is exact: it reads the peak off the schedule the simulator will
run (:func:`slimpack.sim.memory.peaks_and_schedule`). But it needs the group's slices and
MicroPacks, and building them is most of a packing's cost, so a group whose first packing
overflows memory used to be built twice. This guess reads the same walk from the layout
alone (tokens per MicroPack, which sequences span which MicroPacks), taking each round's
backward MicroPacks as the mirror of its forward ones (what ``asymmetric=False`` builds):

* backward MicroPack ``n-1-u`` of a round holds forward MicroPack ``u``'s long segments, so it
  needs that forward (``need``); with the asymmetric re-deal, one without long segments is
  taken to need only the round's first forward (its short documents may come from anywhere
  in the round: the least it can need, so the guess does not run ahead of the schedule);
  the schedule's counts follow from the same rule
  (:func:`slimpack.schedules.pipeline.forward_counts`);
* backward MicroPack ``n-1-u`` of a round frees forward MicroPack ``u``'s tokens;
* a sequence cut over several MicroPacks holds its dK/dV buffers from the mirror of its last
  forward MicroPack to the mirror of its first;
* the logits are those of the largest MicroPack (no slice is longer).

The asymmetric re-deal of short documents over a round's backward MicroPacks moves some
tokens between them, so the guess is not the simulator's number (0.06% above it on the
16,384-sequence benchmark batch, whose peak is set by its last rounds); the planner acts on
it only when it is clearly over the budget, and keeps the exact check for every plan it
returns.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from slimpack.cost.memory import activation_bytes_per_token_per_layer, kv_bytes_per_token_per_layer
from slimpack.schedules.pipeline import forward_counts, warmup_offset
from slimpack.sim.costs import layers_per_virtual_stage
from slimpack.sim.memory import GroupMemory, peak_bytes_from_counts, stage_constant_bytes
from slimpack.slimpack_planner.micropacks import ReplicaLayout
from slimpack.specs import ModelSpec
from slimpack.specs.training import TrainingSpec


def layout_peak_bytes(layout: ReplicaLayout, *, model: ModelSpec, tp: int, cp: int, pp: int,
                      dp: int, vocab_parallel_pp: bool, training: TrainingSpec | None,
                      mirrored: bool, schedule: str = "asymmetric",
                      recompute: str = "none", ep: int = 1) -> float:
    """The largest per-stage peak of a vpp-1 group packed as ``layout`` with mirrored
    backward MicroPacks (module docstring). ``mirrored``: the packing's backward MicroPacks
    are the mirror (``asymmetric=False``), so every backward needs its mirror forward."""
    rounds = layout.unit_tokens()
    sizes = np.fromiter(map(len, rounds), dtype=np.int64, count=len(rounds))
    n = int(sizes.sum())
    if not n:
        raise ValueError("layout_peak_bytes: the layout holds no tokens")
    fwd_tokens = np.fromiter(chain.from_iterable(rounds), dtype=np.float64, count=n)
    holds_long = np.fromiter(chain.from_iterable(layout.holds_long()), dtype=bool, count=n)
    ends = np.cumsum(sizes)
    start_of = np.repeat(ends - sizes, sizes)  # per position: its round's first and end
    end_of = np.repeat(ends, sizes)
    position = np.arange(n)
    # Backward j of a round frees forward mirror[j] (and forward i's mirror backward is
    # mirror[i]: the map is its own inverse within each round).
    mirror = start_of + end_of - 1 - position
    bwd_tokens = fwd_tokens[mirror]
    # Backward j holds the mirror forward's long segments, so it needs that forward; one
    # without long work needs at least its round's first.
    needs = np.where(mirrored | holds_long[mirror], mirror + 1, start_of + 1)

    per_token = activation_bytes_per_token_per_layer(model, recompute) / (tp * cp)
    kv_per_token = kv_bytes_per_token_per_layer(model, tp) / cp
    kvgrad_alloc = np.zeros(n)
    kvgrad_free = np.zeros(n)
    spans = layout.long_spans()
    if spans:
        tokens, first, last = (np.asarray(x) for x in zip(*spans, strict=True))
        np.add.at(kvgrad_alloc, mirror[last], tokens * kv_per_token)
        np.add.at(kvgrad_free, mirror[first], tokens * kv_per_token)
    states, logits = stage_constant_bytes(model, tp=tp, cp=cp, pp=pp, vpp=1, dp=dp,
                                          vocab_parallel_pp=vocab_parallel_pp,
                                          training=training,
                                          longest_slice=int(fwd_tokens.max()), ep=ep)
    zeros = np.zeros(n)
    memory = GroupMemory(
        fwd_alloc=fwd_tokens * per_token, bwd_free=bwd_tokens * per_token,
        kvgrad_alloc=kvgrad_alloc, kvgrad_free=kvgrad_free,
        static_bytes=[s + lg for s, lg in zip(states, logits, strict=True)],
        model_state_bytes=states, logits_bytes=logits, kv_share=0.0,
        fwd_offload=zeros, bwd_fetch=zeros)
    counts = [forward_counts(needs, warmup_offset(schedule, pp, 1, r), n, schedule == "gpipe")
              for r in range(pp)]
    layers = layers_per_virtual_stage(model.num_layers, pp, 1)
    return max(peak_bytes_from_counts(counts, memory, layers))
