"""SlimPipe's attention redistribution executed by the runtime (slimpack/runtime/
redistribution.py): the moves are the plan's (``Group.attention_moves``, chosen at plan time
for llama3.2-1b on an H100, where long prefixes make them pay), executed on the tiny model
over CPU gloo in fp32, gradient-exact against the unsliced single-process reference. Also
under recompute (the rerun reuses the light rank's partials), with tp > 1 (each tp lane ships
its heads) and ring CP (each cp lane ships its query pieces against the gathered prefix, both
cp_sharding values)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost.kernel_model import default_cost_model
from slimpack.plan import Phase
from slimpack.runtime.block_attention import block_backward, block_forward, merge
from slimpack.runtime.config import RuntimeConfig
from slimpack.runtime.cp_layout import shard_slice
from slimpack.runtime.layout import GroupLayout
from slimpack.runtime.many import run_plans
from slimpack.runtime.parity import parity
from slimpack.runtime.reference import reference_step
from slimpack.runtime.validate import check_runtime_plan
from slimpack.sim import simulate
from slimpack.sim.redistribution import with_attention_moves
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

TINY = model_preset("tiny")
PRICED, H100 = model_preset("llama3.2-1b"), hardware_preset("h100")
COST = default_cost_model(PRICED, H100)
LENGTHS = (8192, 200, 300, 100)
"""One long document among short ones: its later slices carry long KV prefixes."""


def _plan(pp: int, vpp: int, dp: int, context: int, slices: int, *, tp: int = 1, cp: int = 1,
          lengths: tuple[int, ...] = LENGTHS, **group_fields):
    """SlimPipe's plan; ``group_fields`` replaced on every group, its moves then chosen again
    under the planner's prices (a recompute mode changes the ops' times, so the moves that
    pay off)."""
    plan = plan_method("slimpipe", Batch.from_lengths(lengths), PRICED, H100,
                       ParallelSpec(pp=pp, vpp=vpp, dp=dp, tp=tp, cp=cp), COST, context=context,
                       num_slices=slices)
    replaced = dataclasses.replace(plan, phases=tuple(
        Phase(groups=tuple(dataclasses.replace(g, **group_fields) for g in ph.groups))
        for ph in plan.phases))
    return with_attention_moves(replaced, model=PRICED, cost=COST)


def test_split_attention_equals_whole_attention():
    """Local causal part plus a fully visible prefix block, merged by log-sum-exp, is the
    whole attention; the two blocks' backwards (given the whole lse) add up to its gradient."""
    gen = torch.Generator().manual_seed(0)
    q_lens, prefix = (5, 7), (6, 9)
    k_lens = tuple(p + n for p, n in zip(prefix, q_lens, strict=True))
    q = torch.randn(sum(q_lens), 4, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(k_lens), 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(k_lens), 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    whole, lse = block_forward(q, k, v, q_lens, k_lens, causal=True)
    ship = (4, 9)  # the first keys of each segment's prefix
    starts = (0, k_lens[0])
    far = torch.cat([torch.arange(s, s + d) for s, d in zip(starts, ship, strict=True)])
    near = torch.cat([torch.arange(s + d, s + n) for s, d, n
                      in zip(starts, ship, k_lens, strict=True)])
    local = block_forward(q, k[near], v[near], q_lens,
                          [n - d for n, d in zip(k_lens, ship, strict=True)], causal=True)
    remote = block_forward(q, k[far], v[far], q_lens, ship, causal=False)
    out, merged_lse = merge([local, remote])
    torch.testing.assert_close(out, whole)
    torch.testing.assert_close(merged_lse, lse)
    d_out = torch.randn(whole.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad(whole, (q, k, v), d_out)
    delta = (d_out * whole).sum(-1)
    with torch.no_grad():
        dq1, dk1, dv1 = block_backward(q, k[near], v[near], d_out, lse, delta, q_lens,
                                       [n - d for n, d in zip(k_lens, ship, strict=True)],
                                       causal=True)
        dq2, dk2, dv2 = block_backward(q, k[far], v[far], d_out, lse, delta, q_lens, ship,
                                       causal=False)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    dk[near], dk[far], dv[near], dv[far] = dk1, dk2, dv1, dv2
    for got, exp in zip((dq1 + dq2, dk, dv), want, strict=True):
        torch.testing.assert_close(got, exp)


LONG_AND_SHORT = (12288, 4096)
"""A long document beside a shorter one in one 16K sample: at cp2 the simulator pairs
backward ops (with the default lengths it pairs forward ones only)."""

BOTH, FORWARD, BACKWARD = {False, True}, {False}, {True}
CASES = {
    "pp2 vpp2": ((2, 2, 1, 8192, 4), {}, BOTH),
    "pp4": ((4, 1, 1, 16384, 8), {}, BOTH),
    "pp2 vpp2 recompute full": ((2, 2, 1, 8192, 4), {"recompute": "full"}, BOTH),
    "pp2 vpp2 recompute selective": ((2, 2, 1, 8192, 4), {"recompute": "selective"}, BOTH),
    "pp2 vpp2 tp2": ((2, 2, 1, 8192, 4), {"tp": 2}, BOTH),
    "pp2 vpp2 tp4 replicated kv heads": ((2, 2, 1, 8192, 4), {"tp": 4}, BACKWARD),
    "pp2 vpp2 cp2": ((2, 2, 1, 8192, 4), {"cp": 2}, FORWARD),
    "pp2 vpp2 cp2 long and short": (
        (2, 2, 1, 16384, 4), {"cp": 2, "lengths": LONG_AND_SHORT}, BACKWARD),
    "pp2 vpp2 cp2 per-document long and short": (
        (2, 2, 1, 16384, 4), {"cp": 2, "cp_sharding": "per-document",
                              "lengths": LONG_AND_SHORT}, BACKWARD),
    "pp2 vpp2 tp2 cp2 recompute full long and short": (
        (2, 2, 1, 16384, 4), {"tp": 2, "cp": 2, "recompute": "full", "lengths": LONG_AND_SHORT},
        BACKWARD),
}
"""name -> ((pp, vpp, dp, context, slices), tp, cp, lengths and group fields, the move
directions the simulator keeps there)."""


@pytest.fixture(scope="module", params=list(CASES))
def executed(request):
    shape, fields, _ = CASES[request.param]
    plan = _plan(*shape, **fields)
    rplan = check_runtime_plan(plan, TINY)
    (result,) = run_plans([plan], TINY, RuntimeConfig(seed=3), return_grads=True,
                          timeout_s=600)
    return request.param, plan, rplan, result


@pytest.mark.slow
def test_slimpipe_plan_with_redistribution_runs_gradient_exact(executed):
    name, plan, _, result = executed
    shape, fields, _ = CASES[name]
    assert plan.attention_redistribution and plan.parallel.pp == shape[0]
    for group in plan.groups():
        assert (group.tp, group.cp) == (fields.get("tp", 1), fields.get("cp", 1))
        assert group.recompute == fields.get("recompute", "none")
    ref = reference_step(TINY, plan.sequence_lengths, seed=3)
    got = parity(result.loss, result.grads(), ref.loss, ref.grads)
    assert got.ok, f"{name}: {got.describe()}"


@pytest.mark.slow
def test_the_runtime_executes_the_plans_moves(executed):
    """The runtime executes the plan's moves as they are (the simulator, choosing them itself
    under the plan's prices, keeps as many pairs), both directions where it pairs backward ops
    too, and every layer of every shipping slice sent and answered one request."""
    name, plan, rplan, result = executed
    groups = {g.group_id: g for g in plan.groups()}
    assert rplan.moves == {g.group_id: g.attention_moves for g in plan.groups()
                           if g.attention_moves}
    moves = [(groups[gid], m) for gid, ms in rplan.moves.items() for m in ms]
    unchosen = dataclasses.replace(plan, phases=tuple(
        Phase(groups=tuple(dataclasses.replace(g, attention_moves=None) for g in ph.groups))
        for ph in plan.phases))
    stats = simulate(unchosen, model=PRICED, hardware=H100, cost=COST).record.extra
    assert len(moves) == stats["attention_redistribution"]["pairs"] > 0
    assert {m.backward for _, m in moves} == CASES[name][2]
    expected = 0
    for group, m in moves:
        layers = TINY.num_layers // (group.pp * group.vpp)
        units = group.backward_units if m.backward else group.forward_units
        ships = {sid for sid, _, _ in m.shipped(group)}
        # One request per layer per lane (tp*cp of them) whose rows hold a shipped segment.
        lanes = group.tp * sum(_cp_ranks_shipping(group, m, sid) for sid in
                               ships & set(units[m.heavy_unit].slice_ids))
        expected += layers * lanes
    sent = sum(r.redistribution_sent for r in result.ranks)
    served = sum(r.redistribution_served for r in result.ranks)
    assert sent == served == expected > 0


def _cp_ranks_shipping(group, move, slice_id) -> int:
    """cp ranks holding query rows of a segment ``move`` ships of ``slice_id`` (the
    simulator's sharding rule; 1 at cp = 1)."""
    if group.cp == 1:
        return 1
    lay = GroupLayout(group)[slice_id]
    segs = {j for sid, j, _ in move.shipped(group) if sid == slice_id}
    count = 0
    for index in range(group.cp):
        shard = shard_slice(lay, cp=group.cp, cp_index=index, sharding=group.cp_sharding)
        count += any(p.segment in segs for p in shard.pieces)
    return count
