"""The cp token layout and the cross-rank attention exchanges alone (gloo processes): each
rank's attention output and its rows' dQ/dK/dV equal single-process attention over the whole
packed buffer with document masks.

Tolerance: fp32, O(1) inputs; the sharded path only splits each document's softmax rows into
pieces and sums dK/dV over ranks, 1e-5 as in tests/test_runtime_attention.py.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slimpack.cost.cp_sharding import shard_pieces
from slimpack.plan import Group, Segment, Slice, Unit
from slimpack.runtime.attention import dense_reference_attention, varlen_causal_attention
from slimpack.runtime.context_parallel import CpGroups, make_exchange
from slimpack.runtime.cp_layout import shard_slice
from slimpack.runtime.launch import free_port
from slimpack.runtime.layout import GroupLayout

HEADS, KV_HEADS, DIM = 4, 2, 8
DOCS = (37, 3, 1, 18, 9)  # very different lengths, one shorter than 2*cp


def _group(cp: int, ranks: tuple[int, ...], sharding: str, kind: str) -> Group:
    segs = tuple(Segment(seq_id=i, start=0, end=n) for i, n in enumerate(DOCS))
    return Group(group_id=0, ranks=ranks, cp=cp, slices=(Slice(slice_id=0, segments=segs),),
                 forward_units=(Unit(slice_ids=(0,)),), backward_units=(Unit(slice_ids=(0,)),),
                 cp_sharding=sharding, cp_kind=kind)


def _inputs() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(11)
    total = sum(DOCS)
    return (torch.randn(total, HEADS, DIM, generator=gen),
            torch.randn(total, KV_HEADS, DIM, generator=gen),
            torch.randn(total, KV_HEADS, DIM, generator=gen),
            torch.randn(total, HEADS, DIM, generator=gen))  # upstream gradient of the output


def _worker(rank: int, world: int, init: str, cases: list[tuple[tuple[int, ...], str, str]],
            out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        for i, (ranks, sharding, kind) in enumerate(cases):
            torch.save(_attend(rank, ranks, sharding, kind), Path(out) / f"{i}-{rank}.pt")
    finally:
        dist.destroy_process_group()


def _attend(rank: int, ranks: tuple[int, ...], sharding: str, kind: str) -> dict:
    group = _group(len(ranks), ranks, sharding, kind)
    layout = GroupLayout(group)
    exchange = make_exchange(group, layout, cp=CpGroups.build([group], rank=rank).of(0))
    shard = exchange.shard(0)
    q, k, v, d_out = (t.index_select(0, shard.rows) for t in _inputs())
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ex = exchange.exchange(0, q, k, v, [])
    lay = layout[0]
    ks = [ex.k[lay.segments[p.segment].offset:p.hi] for p in ex.pieces]
    vs = [ex.v[lay.segments[p.segment].offset:p.hi] for p in ex.pieces]
    o = varlen_causal_attention(ex.q, torch.cat(ks), torch.cat(vs), ex.varlen, backend="sdpa")
    o = exchange.finish(0, o)
    o.backward(d_out)
    return {"rows": shard.rows, "o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
            "cached": tuple(ex.cache[0].shape)}


CASES = [
    ((0, 1), "per-sequence", "ring"),
    ((1, 0, 3, 2), "per-document", "ring"),  # plan cp order differs from global rank order
    ((0, 1, 2, 3), "per-sequence", "ring"),
    ((0, 1), "per-document", "ulysses"),
    ((2, 0, 3, 1), "per-sequence", "ulysses"),  # 4 ranks > 2 K/V heads: heads repeated
]


class _Runs:
    """Every case of one world size in one job of processes, run on first use."""

    def __init__(self) -> None:
        self.results: dict[int, list[dict]] = {}

    def __getitem__(self, case: int) -> list[dict]:
        if case not in self.results:
            world = len(CASES[case][0])
            ids = [i for i, c in enumerate(CASES) if len(c[0]) == world]
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            with tempfile.TemporaryDirectory() as tmp:
                mp.spawn(_worker, nprocs=world, join=True,
                         args=(world, f"tcp://127.0.0.1:{free_port()}",
                               [CASES[i] for i in ids], tmp))
                for j, i in enumerate(ids):
                    self.results[i] = [torch.load(Path(tmp) / f"{j}-{r}.pt")
                                       for r in range(world)]
        return self.results[case]


@pytest.fixture(scope="module")
def runs() -> _Runs:
    return _Runs()


def _reference() -> tuple[torch.Tensor, ...]:
    q, k, v, d_out = _inputs()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    layout = _group(1, (0,), "per-sequence", "ring")
    o = dense_reference_attention(q, k, v, GroupLayout(layout)[0].varlen)
    o.backward(d_out)
    return o.detach(), q.grad, k.grad, v.grad


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{k}-{s}-{len(r)}" for r, s, k in CASES])
def test_sharded_attention_equals_whole_buffer_attention(runs, case):
    want_o, want_dq, want_dk, want_dv = _reference()
    results = runs[case]
    seen = torch.cat([r["rows"] for r in results])
    assert sorted(seen.tolist()) == list(range(sum(DOCS)))  # every row on exactly one rank
    heads_per_rank = (KV_HEADS if KV_HEADS % len(results) == 0 else HEADS) // len(results)
    for r in results:
        rows = r["rows"]
        # What a slice keeps for later slices: ring its own rows (tokens/cp, the simulator's
        # KV-cache memory), Ulysses its head shard of every row (also 1/cp of the whole).
        kind = CASES[case][2]
        assert r["cached"] == ((len(rows), KV_HEADS, DIM) if kind == "ring"
                               else (sum(DOCS), heads_per_rank, DIM))
        for got, want in ((r["o"], want_o), (r["dq"], want_dq), (r["dk"], want_dk),
                          (r["dv"], want_dv)):
            torch.testing.assert_close(got, want[rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sharding", ["per-sequence", "per-document"])
@pytest.mark.parametrize("cp", [2, 3, 4])
def test_rank_rows_are_the_simulators_pieces(cp, sharding):
    # A continuation segment (kv prefix 40) packed with short documents.
    segs = (Segment(seq_id=0, start=40, end=72), Segment(seq_id=1, start=0, end=5),
            Segment(seq_id=2, start=0, end=2), Segment(seq_id=3, start=0, end=19))
    group = Group(group_id=0, ranks=tuple(range(cp)), cp=cp,
                  slices=(Slice(slice_id=0, segments=segs),),
                  forward_units=(Unit(slice_ids=(0,)),), backward_units=(Unit(slice_ids=(0,)),),
                  cp_sharding=sharding)
    lay = GroupLayout(group)[0]
    priced = shard_pieces([(s.num_tokens, s.start) for s in segs], cp, sharding)
    for r in range(cp):
        shard = shard_slice(lay, cp=cp, cp_index=r, sharding=sharding)
        # The pieces the simulator prices for rank r: (query tokens, keys before them).
        held = [(p.hi - p.lo, lay.segments[p.segment].start + p.lo
                 - lay.segments[p.segment].offset) for p in shard.pieces]
        assert held == priced[r]
        assert shard.num_local == sum(n for n, _ in priced[r])
        assert shard.varlen(lay).k_lens == tuple(pre + n for n, pre in priced[r])


def test_zigzag_pairs_an_early_chunk_with_a_late_one():
    # 16 tokens, one document, cp 2: chunks of 4; rank 0 holds chunks 0 and 3.
    group = Group(group_id=0, ranks=(0, 1), cp=2,
                  slices=(Slice(slice_id=0, segments=(Segment(seq_id=0, start=0, end=16),)),),
                  forward_units=(Unit(slice_ids=(0,)),), backward_units=(Unit(slice_ids=(0,)),))
    lay = GroupLayout(group)[0]
    assert shard_slice(lay, cp=2, cp_index=0, sharding="per-sequence").rows.tolist() == \
        [0, 1, 2, 3, 12, 13, 14, 15]
    assert shard_slice(lay, cp=2, cp_index=1, sharding="per-document").rows.tolist() == \
        list(range(4, 12))
