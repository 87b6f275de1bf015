"""SlimPack against SlimPipe on one batch at one layout (issue 24): where the step goes.

Plans both methods on the e2e-throughput batch (documents drawn until ``--tokens`` at 64K
context, seed 0, kernel cost model, no wall-clock limit) at the same layout, simulates them,
and prints per method: step, balanced ideal step, bubble, slices (count, median and largest
length), forward MicroPacks, the sum of unit forward and backward seconds, attention FLOPs
(every slice segment at its KV prefix, all layers), offload and the slice length chosen.
``--cut`` gives SlimPack SlimPipe's sample-boundary pieces as its documents, so both plans
hold the same attention (docs/slimpack-planner.md, "SlimPack vs SlimPipe on the same
layout").

    python -m repro.scripts.same_layout llama-13b commoncrawl --layout 1,8,4,4,2
    python -m repro.scripts.same_layout llama-13b commoncrawl --layout 1,8,4,4,2 --cut
    python -m repro.scripts.same_layout llama-13b commoncrawl --tokens 1048576 \\
        --layout 2,4,8,2,5 --opt search_mirrored=false

``--layout`` is tp,cp,pp,dp,vpp; ``--opt name=value`` (JSON values) are SlimPack options.
"""

from __future__ import annotations

import argparse
import json

from baselines.common.fixed_length import fixed_length_samples
from slimpack import data, sim
from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.flops import attention_flops
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Plan
from slimpack.specs import ModelSpec, ParallelSpec, hardware_preset, model_preset

CONTEXT = 65536
HARDWARE = "h800-80g"


def attention_pflops(plan: Plan, model: ModelSpec) -> float:
    """Forward attention FLOPs of every slice segment at its KV prefix, all layers (PFLOP)."""
    total = sum(attention_flops(model, seg.end - seg.start, seg.start)
                for group in plan.groups() for sl in group.slices for seg in sl.segments)
    return total * model.num_layers / 1e15


def cut_at_samples(batch: Batch) -> Batch:
    """The batch as SlimPipe's fixed-length samples leave it: a document crossing a sample
    boundary becomes independent pieces, in the same order."""
    layout = fixed_length_samples(batch, CONTEXT)
    return Batch.from_lengths([layout.sequence_lengths[seg.seq_id]
                               for sample in layout.samples for seg in sample], seed=batch.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("dataset")
    parser.add_argument("--tokens", type=int, default=512 * CONTEXT)
    parser.add_argument("--layout", required=True, help="tp,cp,pp,dp,vpp")
    parser.add_argument("--cut", action="store_true")
    parser.add_argument("--opt", nargs="*", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.opt)}
    tp, cp, pp, dp, vpp = map(int, args.layout.split(","))
    model, hardware = model_preset(args.model), hardware_preset(HARDWARE)
    cost = default_cost_model(model, hardware)
    batch = data.sample_batch(args.dataset, token_budget=args.tokens, context=CONTEXT, seed=0)
    parallel = ParallelSpec.for_world(tp * cp * pp * dp, tp=tp, cp=cp, pp=pp, vpp=vpp)
    for method in ("slimpipe", "slimpack"):
        given = cut_at_samples(batch) if args.cut and method == "slimpack" else batch
        plan = plan_method(method, given, model, hardware, parallel, cost, context=CONTEXT,
                           time_limit_s=None, **(options if method == "slimpack" else {}))
        record = sim.simulate(plan, model=model, hardware=hardware, cost=cost).record
        lengths = sorted(sum(seg.end - seg.start for seg in sl.segments)
                         for group in plan.groups() for sl in group.slices)
        info = plan.metadata.get("slimpack", {})
        print(f"{method:9s} step {record.step_time_s:.3f} s, ideal {record.ideal_step_time_s:.3f} "
              f"s, bubble {record.bubble_fraction:.3f}, slices {len(lengths)} (median "
              f"{lengths[len(lengths) // 2]}, max {lengths[-1]}), forward units "
              f"{sum(len(g.forward_units) for g in plan.groups())}, unit seconds fwd "
              f"{sum(record.unit_forward_s):.2f} bwd {sum(record.unit_backward_s):.2f}, "
              f"attention {attention_pflops(plan, model):.1f} PFLOP, offload "
              f"{max(g.offload for g in plan.groups())}, S "
              f"{info.get('slice_tokens', plan.metadata.get('slice_tokens'))}"
              + (f", backward {info['backward']}" if "backward" in info else "")
              + (", documents cut at samples" if given is not batch else ""))


if __name__ == "__main__":
    main()
