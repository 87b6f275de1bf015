"""SlimPack planner (reconstructed): components in isolation, then whole plans."""

from functools import partial

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slimpack.batch import Batch
from slimpack.compare import plan_method
from slimpack.cost import AnalyticCostModel
from slimpack.slimpack_planner import SlimPackOptions
from slimpack.slimpack_planner.assign import bin_loads, lpt_assign, milp_assign
from slimpack.slimpack_planner.estimate import WorkEstimator
from slimpack.slimpack_planner.merge import find_outliers
from slimpack.slimpack_planner.micropacks import cost_balanced_cuts, pack_replica
from slimpack.specs import ParallelSpec, hardware_preset, model_preset

plan = partial(plan_method, "slimpack")

MODEL = model_preset("llama-7b")
HW = hardware_preset("h800")
COST = AnalyticCostModel(model=MODEL, hardware=HW)
EST = WorkEstimator.from_cost(COST, tp=8, cp=1)


def long_tail_lengths(n, seed, cap=131072):
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.minimum(rng.lognormal(7.0, 1.7, size=n).astype(int) + 1, cap)]


def test_cost_balanced_cuts_equalise_forward_cost_and_shrink_later_slices():
    cuts = cost_balanced_cuts(131072, 8, EST)
    assert cuts[0] == 0 and cuts[-1] == 131072 and all(c % 128 == 0 for c in cuts)
    # Judged by the cost model itself (the simulator's prices), not the planner's estimate.
    costs = [COST.layer_times([(b - a, a)], tp=8).forward_s
             for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    # Equal up to tile rounding and the estimate's interpolation (cuts solve F(b) - F(a) on
    # the planner's fitted table): within 5%; uniform 16K cuts differ by 2.7x.
    assert max(costs) / min(costs) < 1.05
    uniform = [COST.layer_times([(16384, a)], tp=8).forward_s for a in range(0, 131072, 16384)]
    assert max(uniform) / min(uniform) > 2.5
    sizes = [b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


def test_asymmetric_backward_micropacks_balance_backward_cost_better():
    # One 64K sequence plus short filler documents in one round.
    lengths = {0: 65536, **{i: 512 for i in range(1, 257)}}
    target = sum(EST.forward(n) for n in lengths.values()) / 16

    def spread(asymmetric):
        packs = pack_replica(lengths, EST, slice_tokens=8192, round_capacity=1 << 30,
                             unit_forward_target=target, asymmetric=asymmetric)
        by_id = {s.slice_id: s for s in packs.slices}

        def cost(unit, fn):
            return sum(fn(seg.num_tokens, seg.start)
                       for sid in unit.slice_ids for seg in by_id[sid].segments)
        fwd = [cost(u, EST.forward) for u in packs.forward_units]
        bwd = [cost(u, EST.backward) for u in packs.backward_units]
        return max(fwd) / min(fwd), max(bwd) / min(bwd)

    fwd_sym, bwd_sym = spread(False)
    fwd_asym, bwd_asym = spread(True)
    assert fwd_sym < 1.15 and fwd_asym < 1.15
    assert bwd_asym < bwd_sym


def test_milp_never_worse_than_lpt_and_respects_its_time_limit():
    rng = np.random.default_rng(3)
    weights = list(rng.pareto(1.5, size=200) + 1)
    greedy = max(bin_loads(lpt_assign(weights, 8), weights))
    bins, info = milp_assign(weights, 8, time_limit_s=0.5)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert max(bin_loads(bins, weights)) <= greedy + 1e-9
    assert info["milp_seconds"] < 5.0


def test_outliers_merge_enough_replicas_to_fit_and_fill_the_cluster():
    lengths = {0: 600_000, **{i: 4096 for i in range(1, 200)}}
    # Work in arbitrary units: the outlier is 1.5x a replica's fair share (needs k >= 2 to
    # balance) and 3x what one replica's memory holds (needs k >= 3): at least k = 4.
    work = {0: 1.0, **{i: 6.5 / 199 for i in range(1, 200)}}
    decision = find_outliers(lengths, work, dp=8, max_tokens_per_replica=200_000)
    assert decision.outliers == (0,)
    # One outlier: the merge widens to the whole cluster (8), or 4 replicas would idle.
    assert decision.merge_factor == 8
    # Two such outliers: k = 4 gives two merged groups, one outlier each.
    two = {**lengths, 200: 600_000}
    decision = find_outliers(two, {**work, 200: 1.0}, dp=8, max_tokens_per_replica=200_000)
    assert set(decision.outliers) == {0, 200} and decision.merge_factor == 4
    # Nothing to merge when every sequence fits and none exceeds the fair share.
    small = {i: 4096 for i in range(16)}
    even = find_outliers(small, dict.fromkeys(small, 1.0), dp=8, max_tokens_per_replica=200_000)
    assert even.outliers == () and even.merge_factor == 1


@pytest.mark.parametrize("switch", ["no_slicing", "no_asymmetric", "no_dp_aware", "no_dp_merge"])
def test_every_ablation_switch_gives_a_valid_plan(switch):
    batch = Batch.from_lengths(long_tail_lengths(256, seed=1) + [131072])
    parallel = ParallelSpec(tp=8, pp=4, dp=4)
    result = plan(batch, MODEL, HW, parallel, COST, search=False,
                                     **{switch: True})
    result.validate()
    assert result.num_tokens == batch.num_tokens


def test_switches_change_the_plan():
    batch = Batch.from_lengths(long_tail_lengths(256, seed=2) + [131072, 100000])
    parallel = ParallelSpec(tp=8, pp=4, dp=4)
    full = plan(batch, MODEL, HW, parallel, COST, search=False)
    whole = plan(batch, MODEL, HW, parallel, COST, search=False, no_slicing=True)
    sym = plan(batch, MODEL, HW, parallel, COST, search=False, no_asymmetric=True)
    n_slices = sum(len(g.slices) for g in full.groups())
    assert sum(len(g.slices) for g in whole.groups()) < n_slices
    assert any(g.is_asymmetric for g in full.groups())
    assert not any(g.is_asymmetric for g in sym.groups())


def test_bad_options_are_clear_errors():
    batch = Batch.from_lengths([1000, 2000])
    parallel = ParallelSpec(tp=8, pp=4, dp=1)
    with pytest.raises(ValueError, match="slimpack: unknown option\\(s\\) \\['slices'\\]"):
        plan(batch, MODEL, HW, parallel, COST, slices=4)
    with pytest.raises(ValueError, match="unknown options \\['slices'\\]"):
        SlimPackOptions.from_kwargs({"slices": 4})
    with pytest.raises(ValueError, match="slice_tokens must be a positive multiple of 128"):
        SlimPackOptions(slice_tokens=1000)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=200_000), min_size=1, max_size=60),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 4]),
    cp=st.sampled_from([1, 2]),
    switches=st.sets(st.sampled_from(["no_slicing", "no_asymmetric", "no_dp_aware",
                                      "no_dp_merge"])),
)
def test_property_random_batches_always_give_valid_plans(lengths, pp, dp, cp, switches):
    parallel = ParallelSpec(tp=8, cp=cp, pp=pp, dp=dp)
    result = plan(Batch.from_lengths(lengths), MODEL, HW, parallel, COST, search=False,
                  **dict.fromkeys(switches, True))
    result.validate()
    assert result.world_size == 8 * cp * pp * dp


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=32_768), min_size=1, max_size=80),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 4]),
    search=st.booleans(),
)
def test_property_plans_fit_memory_when_any_layout_can(lengths, pp, dp, search):
    # A 32K-token sequence of llama-7b fits one tp-8 replica at any pp here (about 17 GB of
    # activations per stage at pp 1), so a plan that fits always exists: the planner must
    # find one, by the simulator's own accounting, within its time limit.
    parallel = ParallelSpec(tp=8, pp=pp, dp=dp)
    result = plan(Batch.from_lengths(lengths), MODEL, HW, parallel, COST, search=search,
                  time_limit_s=10.0)
    result.validate()
    assert result.metadata["slimpack"]["peak_bytes"] <= HW.usable_memory_bytes
    assert result.metadata["plan_seconds"] < 10.0


def _exhaustive_fill(rounds, fwd_load, short_ids, short_fwd, *, unit_cap, add_round):
    """The definition of the short-document fill: every document, longest first, into the
    lightest MicroPack (ties: round, then position) whose round and cap have room, else into a
    new filler round. A full scan per document (quadratic): the oracle for the fast fill."""
    for seq_id in sorted(short_ids, key=lambda s: (-short_ids[s], s)):
        n = short_ids[seq_id]
        fits = [(fwd_load[r][u], r, u) for r, rnd in enumerate(rounds)
                for u in range(rnd.num_units)
                if rnd.tokens + n <= rnd.capacity
                and (rnd.unit_tokens[u] == 0 or rnd.unit_tokens[u] + n <= unit_cap)]
        if fits:
            _, r, u = min(fits)
        else:
            add_round()
            r, u = len(rounds) - 1, 0
        rounds[r].short_docs[u].append(seq_id)
        rounds[r].tokens += n
        rounds[r].unit_tokens[u] += n
        fwd_load[r][u] += short_fwd[seq_id]


@pytest.mark.parametrize("seed", range(12))
def test_fast_short_document_fill_makes_the_exhaustive_scans_choices(seed, monkeypatch):
    # Phase 2 in O(n log n) must not change a plan: the same MicroPacks as the full scan, on
    # long-tailed batches where rounds and MicroPacks fill up (caps bind) and filler rounds
    # are added.
    import slimpack.slimpack_planner.micropacks as mp

    rng = np.random.default_rng(seed)
    lengths = long_tail_lengths(int(rng.integers(50, 600)), seed=seed,
                                cap=int(rng.choice([16384, 65536, 131072])))
    parallel = ParallelSpec(tp=8, pp=int(rng.choice([1, 2, 4])), dp=int(rng.choice([1, 2])),
                            cp=int(rng.choice([1, 2])))
    opts = {"search": False, "no_slicing": bool(seed % 5 == 4)}
    fast = plan(Batch.from_lengths(lengths), MODEL, HW, parallel, COST, **opts)
    monkeypatch.setattr(mp, "_fill_short_documents", _exhaustive_fill)
    slow = plan(Batch.from_lengths(lengths), MODEL, HW, parallel, COST, **opts)
    assert [(g.slices, g.forward_units, g.backward_units) for g in fast.groups()] == \
        [(g.slices, g.forward_units, g.backward_units) for g in slow.groups()]


@pytest.mark.parametrize("seed", range(30))
def test_fast_fill_matches_the_exhaustive_scan_under_tight_caps(seed):
    import slimpack.slimpack_planner.micropacks as mp

    rng = np.random.default_rng(100 + seed)
    docs = {i: int(n) for i, n in enumerate(rng.integers(1, 4000, size=int(rng.integers(1, 300))))}
    work = {i: n * (1 + rng.random()) for i, n in docs.items()}
    unit_cap = float(rng.choice([2000, 5000, 20000, np.inf]))
    shapes = [(int(rng.integers(1, 6)), int(rng.integers(1000, 60000))) for _ in range(rng.integers(0, 5))]

    def state():
        rounds, loads = [], []
        for units, capacity in shapes:
            rnd = mp._Round(capacity=capacity)
            rnd.add_units(units)
            rnd.unit_tokens = [int(t) for t in np.random.default_rng(units).integers(0, 1500, units)]
            rnd.tokens = sum(rnd.unit_tokens)
            rounds.append(rnd)
            loads.append([t / 1000 for t in rnd.unit_tokens])

        def add_round():
            rnd = mp._Round(capacity=20000)
            rnd.add_units(3)
            rnd.unit_tokens = [0, 0, 0]
            rounds.append(rnd)
            loads.append([0.0, 0.0, 0.0])
        return rounds, loads, add_round

    out = []
    for fill in (mp._fill_short_documents, _exhaustive_fill):
        rounds, loads, add_round = state()
        fill(rounds, loads, docs, work, unit_cap=unit_cap, add_round=add_round)
        out.append([r.short_docs for r in rounds])
    assert out[0] == out[1]


def _unit_errors(p, model, cost):
    """|estimate / simulator - 1| of every forward and backward MicroPack of ``p``: the
    estimate is the planner's (``WorkEstimator.unit_forward``/``unit_backward`` for the
    group's CP degree), the truth the simulator's rule (``unit_layer_seconds`` on the
    per-rank pieces of the unit's slices), per layer."""
    from slimpack.cost.cp_sharding import shard_pieces
    from slimpack.sim.costs import unit_layer_seconds

    out = []
    for g in p.groups():
        est = WorkEstimator.from_cost(cost, tp=g.tp, cp=g.cp, cp_sharding=g.cp_sharding)
        for units, which in ((g.forward_units, 0), (g.backward_units, 1)):
            for unit in units:
                pieces = [(s.num_tokens, s.start) for sid in unit.slice_ids
                          for s in g.slice(sid).segments]
                per_rank = [[] for _ in range(g.cp)]
                for sid in unit.slice_ids:
                    shards = shard_pieces([(s.num_tokens, s.start) for s in g.slice(sid).segments],
                                          g.cp, g.cp_sharding)
                    for r in range(g.cp):
                        per_rank[r].extend(shards[r])
                truth = unit_layer_seconds(per_rank, model=model, cost=cost, tp=g.tp, cp=g.cp,
                                           cp_kind=g.cp_kind, cp_intra=g.cp * g.tp <= 8)[which]
                mine = est.unit_backward(pieces) if which else est.unit_forward(pieces)
                out.append((g.cp, abs(mine / truth - 1)))
    return out


def test_planner_unit_estimates_match_the_simulators_prices():
    # Random long-tail batches, cp 1 and 2, and one with outliers so DP-Merge groups (cp 4)
    # are priced too. The estimate is affine (a fixed part per MicroPack + marginal parts per
    # document, long-sequence segments priced on their real per-rank pieces). Measured: max
    # 1.0%, p95 0.3% over 684 MicroPacks; before (per-document costs from 8K-token probe
    # units, a per-pair fit for KV prefixes) max 12%, p95 11% here, and up to 97% too low on
    # thin MicroPacks of paper-scale batches.
    errors = []
    for seed, cp, dp in ((0, 1, 2), (1, 1, 1), (2, 2, 2), (3, 2, 1)):
        batch = Batch.from_lengths(long_tail_lengths(200, seed=seed, cap=131072))
        p = plan(batch, MODEL, HW, ParallelSpec(tp=8, cp=cp, pp=2, dp=dp), COST, search=False)
        errors += _unit_errors(p, MODEL, COST)
    outliers = Batch.from_lengths(long_tail_lengths(150, seed=9, cap=32768) + [400_000, 380_000])
    p = plan(outliers, MODEL, HW, ParallelSpec(tp=8, cp=1, pp=2, dp=4), COST, search=False)
    assert p.metadata["slimpack"]["outliers"], "the batch must exercise DP-Merge"
    errors += _unit_errors(p, MODEL, COST)
    assert {cp for cp, _ in errors} >= {1, 2, 4}
    assert max(e for _, e in errors) < 0.05
    assert float(np.percentile([e for _, e in errors], 95)) < 0.02


def test_slices_keep_a_minimum_length_per_cp_rank():
    from slimpack.slimpack_planner.micropacks import MIN_TOKENS_PER_CP_RANK, slice_sequence

    est = WorkEstimator.from_cost(COST, tp=8, cp=8, cp_sharding="per-sequence")
    length, s = 524288, 16384
    target = est.forward(length) / 200  # a tight budget: 200 cost-balanced pieces
    free = slice_sequence(length, est, slice_tokens=s, target=target)
    sizes = [b - a for a, b in zip(free[:-1], free[1:], strict=True)]
    floor = MIN_TOKENS_PER_CP_RANK * 8
    assert min(sizes) < floor  # the constraint binds here
    held = slice_sequence(length, est, slice_tokens=s, target=target, min_tokens=floor)
    sizes = [b - a for a, b in zip(held[:-1], held[1:], strict=True)]
    assert held[0] == 0 and held[-1] == length
    assert min(sizes) >= floor


def test_fuzz_random_batches_and_layouts_validate_within_their_time_limit():
    # 150 random batches x random (tp, cp, pp, dp) and switches, a fifth in search mode with
    # 0.2-0.5 s limits: every plan validates, holds every token, and returns within its
    # limit +10% (or, when the heuristic candidate alone overruns it, returns that at once).
    # The 10^4-case run: `python -m slimpack.slimpack_planner.fuzz --cases 10000`.
    from slimpack.slimpack_planner.fuzz import run

    # The +10% target is measured by the standalone 10^4-case run on a quiet machine (a
    # benchmark, not a unit test); here, on a shared CI machine, a 0.2-0.5 s limit gets 0.5 s
    # of grace so scheduler noise cannot fail the build (seen: 0.41 s under a 0.23 s limit),
    # while a search that ignores its deadline (seconds over) still does.
    result = run(150, seed=1, slack=1.1, grace_s=0.5)
    assert result.failures == []
    assert result.searched > 10


def test_search_skips_only_candidates_the_simulator_finds_out_of_memory():
    # A 1M-token outlier on llama-7b, tp8 pp2 dp4: merged (DP-Merge) plans fit, unmerged ones
    # need ~280 GiB. Once a fitting plan is held, the search stops building an over-memory
    # candidate at its first overflowing group and never simulates it; rebuilt in full and
    # simulated, every such candidate must be out of memory, and the plan kept must be the
    # fastest of all candidates.
    from slimpack.sim import simulate
    from slimpack.slimpack_planner.assemble import BuildContext, build_plan

    rng = np.random.default_rng(0)
    lengths = [1_000_000] + [int(x) for x in np.minimum(
        rng.lognormal(7.5, 1.5, size=400).astype(int) + 1, 65536)]
    batch, parallel = Batch.from_lengths(lengths), ParallelSpec(tp=8, pp=2, dp=4)
    result = plan(batch, MODEL, HW, parallel, COST, search=True, time_limit_s=600,
                  search_candidates=3)
    # The slice-length candidates; SlimPipe's mechanisms, tried on the chosen plan after
    # them, are listed too (without a slice length).
    tried = [t for t in result.metadata["search"] if "slice_tokens" in t]
    skipped = [t for t in tried if t.get("simulated") is False]
    assert skipped and all(t["oom"] and not t["merge"] for t in skipped)
    # Each slice length is tried with asymmetric and with mirrored backward MicroPacks.
    contexts = {mirrored: BuildContext(batch=batch, model=MODEL, hardware=HW, parallel=parallel,
                                       cost=COST, options=SlimPackOptions(
                                           search_candidates=3, no_asymmetric=mirrored))
                for mirrored in (False, True)}
    assert {t["mirrored"] for t in tried} == {False, True}
    steps = {}
    for t in tried:
        record = simulate(build_plan(contexts[t["mirrored"]], t["slice_tokens"],
                                     use_merge=t["merge"]),
                          model=MODEL, hardware=HW, cost=COST).record
        assert record.oom == t["oom"]
        if not record.oom:
            steps[(t["slice_tokens"], t["merge"], t["mirrored"])] = record.step_time_s
    kept = simulate(result, model=MODEL, hardware=HW, cost=COST).record.step_time_s
    chosen = result.with_attention_redistribution(False)
    assert simulate(chosen, model=MODEL, hardware=HW, cost=COST).record.step_time_s == min(
        steps.values())
    assert kept <= min(steps.values())  # redistribution is kept only when it is faster


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 300_000), min_size=1, max_size=40),
       pp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]))
def test_peak_floor_never_exceeds_a_groups_simulated_peak(lengths, pp, vpp, cp):
    # The floor the search stops over-memory candidates on must be a true lower bound of the
    # peak the simulator reports for the group holding the longest sequence.
    from slimpack.sim.memory import schedule_peak_bytes
    from slimpack.slimpack_planner.assemble import BuildContext, _peak_floor_bytes

    vpp = vpp if pp > 1 else 1
    parallel = ParallelSpec(tp=8, cp=cp, pp=pp, vpp=vpp, dp=1)
    result = plan(Batch.from_lengths(lengths), MODEL, HW, parallel, COST, search=False)
    ctx = BuildContext(batch=Batch.from_lengths(lengths), model=MODEL, hardware=HW,
                       parallel=parallel, cost=COST, options=SlimPackOptions())
    (group,) = result.groups()
    floor = _peak_floor_bytes(ctx, max(lengths), 1, None)
    assert floor <= max(schedule_peak_bytes(group, MODEL, 1)) * (1 + 1e-12)


@pytest.mark.parametrize("cp, sharding, kind", [(1, "per-sequence", "ring"),
                                                 (4, "per-sequence", "ring"),
                                                 (4, "per-document", "ring"),
                                                 (2, "per-sequence", "ulysses")])
@pytest.mark.parametrize("cost_kind", ["analytic", "kernel"])
def test_batched_segment_prices_equal_one_by_one_pricing(cp, sharding, kind, cost_kind):
    # The planner prefetches a plan's long-segment prices in one batched pass; every price
    # must be the one-by-one price to the bit, so plans do not depend on the prefetch.
    from slimpack.cost.kernel_model import KernelCostModel

    cost = COST if cost_kind == "analytic" else KernelCostModel(model=MODEL, hardware=HW)
    rng = np.random.default_rng(cp)
    pieces = sorted({(int(t), int(p)) for t, p in zip(rng.integers(1, 20000, 300),
                                                       rng.integers(1, 500_000, 300),
                                                       strict=True)})
    batched = WorkEstimator.from_cost(cost, tp=8, cp=cp, cp_sharding=sharding, cp_kind=kind)
    single = WorkEstimator.from_cost(cost, tp=8, cp=cp, cp_sharding=sharding, cp_kind=kind)
    batched.prefetch_segments(pieces)
    assert len(batched._memo) == len(pieces)
    for t, p in pieces:
        assert batched.forward(t, p) == single.forward(t, p)
        assert batched.backward(t, p) == single.backward(t, p)


@pytest.mark.parametrize("model_name,dataset,sequences,context,tp,pp,dp", [
    ("llama-13b", "commoncrawl", 16384, 65536, 8, 4, 1),  # the 16K benchmark batch
    ("llama-7b", "github", 2048, 131072, 4, 4, 2),
    ("llama-7b", "commoncrawl", 1024, 262144, 8, 8, 1),
])
def test_no_micropack_holds_more_than_s_tokens_of_long_sequences(model_name, dataset, sequences,
                                                                 context, tp, pp, dp):
    """Two long sequences may share MicroPacks (their segments stacked) only while each
    MicroPack holds at most S tokens of long work: the round capacity and the per-MicroPack
    token cap are sized on S, and stacked MicroPacks of up to 1.1 S (the 16K batch, before)
    put the group's last rounds over memory, so its first layout had to be redone."""
    data = pytest.importorskip("slimpack.data")
    model = model_preset(model_name)
    batch = data.sample_batch(dataset, num_sequences=sequences, context=context, seed=0)
    result = plan(batch, model, HW, ParallelSpec(tp=tp, pp=pp, dp=dp),
                  AnalyticCostModel(model=model, hardware=HW), search=False)
    s = result.metadata["slimpack"]["slice_tokens"]
    lengths = result.sequence_lengths
    for group in result.groups():
        for unit in group.forward_units:
            segs = [seg for sid in unit.slice_ids for seg in group.slice(sid).segments
                    if lengths[seg.seq_id] > s]
            assert sum(seg.end - seg.start for seg in segs) <= s
