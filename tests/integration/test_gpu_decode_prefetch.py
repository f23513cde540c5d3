"""The decode kernel's early plan reads, K / V prefetch and early first tile (attnlab.kernels.decode, with PDL): the
same bits as the wait-first launch and as PDL off, eagerly and under graph replay, across page sizes (per-token page
gathers and whole-tile pages), GQA ratios, head dims, split counts (some of one tile: the early first tile), padded
rows and KV lengths from 1 to past the prefetched tiles; and with a plan written late by the launch just before the
decode (the rule the early reads rest on, broken on purpose). These act only with PDL on a Hopper GPU: nothing here
runs elsewhere (tests/backends/test_decode_early.py forces the early tile's path without PDL)."""

import pytest
import torch
import triton
import triton.language as tl

from attnlab.backends.registry import require_available
from attnlab.kernels import decode, pdl
from attnlab.kernels.decode import paged_decode
from attnlab.kernels.pdl import launch_args, pdl_start
from tests.backends.cases import make_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(pdl.unsupported("cuda") is not None,
                                                  reason=f"PDL needs a Hopper GPU: {pdl.unsupported('cuda')}")]
TritonBackend = require_available("triton")


def _outputs(case, on: bool, tiles: int, num_splits: int | None, graph: bool, fused: bool = False,
             preload: int = 0) -> torch.Tensor:
    with pdl.using(on, "cuda"), decode.kv_prefetching(tiles), decode.early_preloading(preload):
        be = case.backend(TritonBackend)
        be.num_splits, be.fused_merge = num_splits, fused
        be.plan(case.meta)
        if not graph:
            return torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
        return _replayed(be, case)


def _replayed(be, case) -> torch.Tensor:
    """Every layer's output of a planned backend, compiled eagerly, then captured in a CUDA graph and replayed twice."""
    layers = range(case.pool.num_layers)
    for layer in layers:  # compile, then capture
        be.run(case.q, layer)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.stack([be.run(case.q, layer) for layer in layers])
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("page_size,gqa,head_dim,num_splits,kv_dtype", [
    (1, 3, 64, 1, None), (16, 4, 128, 32, None), (16, 1, 64, 5, None), (128, 3, 128, 2, None), (3, 8, 64, 3, None),
    # splits of one tile: one stage, the early first tile (the last: 64 x 128 of e4m3, K and V preloaded)
    (16, 3, 64, 32, None), (16, 4, 128, 64, None), (1, 3, 64, 64, None), (128, 4, 128, 64, None),
    (16, 4, 128, 64, torch.float8_e4m3fn)])
def test_prefetch_changes_no_bit(page_size, gqa, head_dim, num_splits, kv_dtype, graph):
    q_lens = [1, 0, 1, 1, 1, 0]  # padded rows among them and at the end (its page range ends the table)
    kv_lens = [1, 0, 700, 4096, 130, 0]
    case = make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=gqa, head_dim=head_dim,
                     dtype=torch.bfloat16, kv_dtype=kv_dtype, device="cuda", num_layers=2, seed=page_size + gqa)
    ref = _outputs(case, False, decode.KV_PREFETCH_TILES, num_splits, graph)
    for tiles, preload in ((4, 0), (1, 0), (1, 1), (1, 2), (0, 0)):  # 4 (the first version), 1 with each preload (2:
        # the default), none
        out = _outputs(case, True, tiles, num_splits, graph, preload=preload)
        assert torch.equal(out, ref), (tiles, preload, (out.float() - ref.float()).abs().max().item())
    torch.testing.assert_close(ref.float(), case.reference().float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("gate,kv_dtype,preload", [(128 * 64, None, 0), (decode.EARLY_TILE_MAX_ELEMS, None, 0),
                                                   (decode.EARLY_TILE_MAX_ELEMS, torch.float8_e4m3fn, 0),
                                                   (decode.EARLY_TILE_MAX_ELEMS, None, 1),
                                                   (decode.EARLY_TILE_MAX_ELEMS, torch.float8_e4m3fn, 1)],
                         ids=["gate-128x64", "gate-default", "gate-default-fp8-kv", "preload-k", "preload-k-fp8-kv"])
@pytest.mark.parametrize("fused", [False, True], ids=["merge-launch", "fused-merge"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_the_heuristics_128_token_tile_changes_no_bit(graph, fused, gate, kv_dtype, preload, monkeypatch):
    """Splits of two 64-token tiles at head dim 128 with few programs run as one 128-token tile of 8 warps in one
    stage (heuristics.decode_params): 4 requests of up to 4,096 tokens x 2 kv heads, 32 splits on 132 SMs (an
    H100 SXM's count, set here so the plan is the same on any card). PDL on equals off, bit for bit, with the merge
    launch and the fused merge, and both the reference; with the early-tile gate at 128 x 128 (``gate``, the default
    since 2026-12-07) PDL on takes the early first tile at that tile, at the earlier 128 x 64 it does not; an e4m3 KV
    (128-byte rows, whole L2 lines) takes it too; and with the tile's rows loaded before the wait (``preload``)."""
    from attnlab.kernels import heuristics

    monkeypatch.setattr(heuristics, "sm_count", lambda device_index=0: 132)
    case = make_case(kv_lens=[4096, 3000, 1, 130], q_lens=[1, 1, 1, 1], page_size=16, num_kv_heads=2, gqa=4,
                     head_dim=128, dtype=torch.bfloat16, kv_dtype=kv_dtype, device="cuda", num_layers=2, seed=11)
    be = case.backend(TritonBackend)
    be.fused_merge = fused
    be.plan(case.meta)
    params = be.active_plan.params
    assert (params.block_n, params.num_warps, params.num_stages, params.num_splits) == (128, 8, 1, 32), params
    with decode.early_tile_limit(gate):
        with pdl.using(True, "cuda"), decode.early_preloading(preload):
            early = decode.early_launch(case.q, case.pool.slots_view(0)[0], params)[1]
            assert early["EARLY_TILE"] is (gate >= 128 * 128)
            assert early["PRELOAD"] == (preload if early["EARLY_TILE"] else 0)  # (2, the default, is K only here)
        ref = _outputs(case, False, decode.KV_PREFETCH_TILES, None, graph, fused)
        out = _outputs(case, True, decode.KV_PREFETCH_TILES, None, graph, fused, preload)
    assert torch.equal(out, ref), (out.float() - ref.float()).abs().max().item()
    torch.testing.assert_close(ref.float(), case.reference().float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("head_dim,gqa,tiles,on", [(128, 4, None, False), (128, 4, None, True), (64, 3, None, True),
                                                   (128, 4, "32x4x1", False), (128, 4, "32x4x1", True),
                                                   (64, 3, "64x4x1", False), (64, 3, "64x4x1", True)])
def test_v_first_changes_no_bit(head_dim, gqa, tiles, on, monkeypatch):
    """One-stage launches with V's load before K's (decode.set_v_first(1); K first by default): the same bits, compiled,
    under graph replay, at the heuristic's one-tile launches on 132 SMs (head dim 128: the two-tile rule's 128-token
    tile of 8 warps; 64: 128-token tiles that take the early tile with PDL on) and at ``decode_tiles`` overrides of one
    stage whose splits loop over several tiles; with the fused merge, the default there. (Head dim 64's one-tile
    launch without PDL runs 3 stages, where V_FIRST never applies: not a case.)"""
    from attnlab.kernels import heuristics

    monkeypatch.setattr(heuristics, "sm_count", lambda device_index=0: 132)
    case = make_case(kv_lens=[4096, 3000, 1, 130], q_lens=[1, 1, 1, 1], page_size=16, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, device="cuda", num_layers=2, seed=head_dim + gqa)
    outs = []
    for first in (0, 1):
        with decode.v_first_order(first), pdl.using(on, "cuda"), decode.early_preloading(0):  # (a preloaded tile's
            # order is its own)
            be = TritonBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                               case.q.dtype, decode_tiles=tiles, fused_merge="auto" if tiles is None else True)
            be.plan(case.meta)
            stages = decode.early_launch(case.q, case.pool.slots_view(0)[0], be.active_plan.params)[0]
            assert stages == 1, be.active_plan.params  # the launch V_FIRST acts on
            outs.append(_replayed(be, case))
    assert torch.equal(outs[0], outs[1]), (outs[0].float() - outs[1].float()).abs().max().item()
    torch.testing.assert_close(outs[1].float(), case.reference(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("head_dim,gqa,tiles,on,page_size", [
    (128, 4, "64x4x3", False, 16), (128, 4, "64x4x3", True, 16), (128, 4, "64x4x4", True, 16),
    (64, 3, "128x4x3", True, 16), (128, 4, "128x8x2", False, 16), (128, 4, "64x4x3", True, 64)])
def test_page_ahead_changes_no_bit(head_dim, gqa, tiles, on, page_size):
    """The split loop's page ids a tile ahead (decode.set_page_ahead(1); in their own tile by default): the same bits,
    compiled, under graph replay, on launches of several stages whose splits loop over several tiles (where the page
    ids ahead let Triton's pipeliner keep more copies in flight: experiments/decode-regcap/stages.py), PDL off and on,
    the merge launch and fused, per-token page gathers (page 16) and whole-tile pages (page 64, where the default
    loads one page id a tile and the page ids ahead gather per lane), a KV length of 1 and a request ending mid-page
    among them."""
    case = make_case(kv_lens=[4096, 3000, 1, 130], q_lens=[1, 1, 1, 1], page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, device="cuda", num_layers=2, seed=head_dim + gqa)
    for fused in (False, True):
        outs = []
        for ahead in (0, 1):
            with decode.page_ahead_order(ahead), pdl.using(on, "cuda"):
                be = TritonBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                                   case.q.dtype, decode_tiles=tiles, num_splits=8, fused_merge=fused)
                be.plan(case.meta)
                assert decode.early_launch(case.q, case.pool.slots_view(0)[0], be.active_plan.params)[0] > 1
                outs.append(_replayed(be, case))
        assert torch.equal(outs[0], outs[1]), (outs[0].float() - outs[1].float()).abs().max().item()
        torch.testing.assert_close(outs[1].float(), case.reference(), atol=2e-2, rtol=2e-2)


@triton.jit
def _late_writer(SRC, DST, n, spins, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """Lets the next PDL kernel launch at once (pdl_start), spins, then copies SRC's n int32 to DST."""
    pdl_start(USE_PDL)
    x = tl.program_id(0).to(tl.float32) + 1.0
    for _ in range(spins):
        x = x * 1.0000001 + 1e-7
    offs = tl.arange(0, BLOCK)
    for start in range(0, n, BLOCK):
        m = start + offs < n
        tl.store(DST + start + offs, tl.load(SRC + start + offs, mask=m) + (x < 0).to(tl.int32), mask=m)


@triton.jit
def _early_probe(DST, OUT, USE_PDL: tl.constexpr):
    """DST[0] read before and after the wait, into OUT[0] and OUT[1]."""
    early = tl.load(DST)
    pdl_start(USE_PDL)
    tl.store(OUT, early)
    tl.store(OUT + 1, tl.load(DST))


def _write_late(src: torch.Tensor, dst: torch.Tensor) -> None:
    # ~5 ms of dependent FMAs: the next launch (the host's Python, tens of us) starts long before the copy
    _late_writer[(1,)](src, dst, src.numel(), 2_000_000, BLOCK=1024, **launch_args(src))


def _raced(decode_after, probed: torch.Tensor, reset, write_late) -> tuple[torch.Tensor, list[int]]:
    """The race tests' frame: ``decode_after(True)`` (the launch before the decode writes late) equals
    ``decode_after(False)`` three times; then ``reset()``, ``write_late()`` and a probe launched after it the same way:
    ``probed``'s first int32 read before and after the probe's wait. Returns the decode's output and those two reads."""
    ref = decode_after(False)
    for _ in range(3):
        assert torch.equal(decode_after(True), ref)
    probe = torch.zeros(2, dtype=torch.int32, device="cuda")
    _early_probe[(1,)](probed, probe, **launch_args(probe))  # compiled before the race
    reset()
    torch.cuda.synchronize()
    write_late()
    _early_probe[(1,)](probed, probe, **launch_args(probe))
    torch.cuda.synchronize()
    return ref, probe.tolist()


@pytest.mark.parametrize("change", ["lengths", "pages"])
@pytest.mark.parametrize("page_size,fused,preload", [(16, False, 0), (16, True, 0), (1, False, 0), (128, True, 0),
                                                     (16, False, 2), (128, True, 1)])
def test_a_plan_written_just_before_is_read_after_the_wait(page_size, fused, preload, change):
    """The rule the early reads rest on (the launch before an attention kernel never writes its plan) broken on
    purpose: the launch before the decode lets it start, spins, then writes its plan's page ids and lengths (``pages``:
    the page ids only, so the re-read page ids alone must catch it). The output is still the new plan's, the same bits
    as with no race: the early first tile is taken only when every value read after the wait equals its early read. A
    probe launched the same way checks that an early read does see the old plan (the race is real; the decode's own
    early reads cannot be observed). ``preload``: the early tile's K / V rows loaded before the wait, from the old
    plan's pages."""
    case = make_case(kv_lens=[700, 4096, 130], q_lens=[1, 1, 1], page_size=page_size, num_kv_heads=2, gqa=4,
                     head_dim=128, dtype=torch.bfloat16, device="cuda", num_layers=1, seed=5)
    with pdl.using(True, "cuda"), decode.early_preloading(preload):
        be = case.backend(TritonBackend)
        be.num_splits = 64  # 64 tokens a split: one tile (BLOCK_N 64 at head dim 128), so one stage, the early tile
        be.plan(case.meta)
        plan = be.active_plan
        assert plan.params.one_tile and plan.params.block_n == 64, plan.params
        stages, early = decode.early_launch(case.q, case.pool.slots_view(0)[0], plan.params)  # decided per launch
        assert stages == 1 and early["PRELOAD"] == preload, early
        if fused:
            plan.counters = torch.zeros(8, dtype=torch.int32, device="cuda")  # >= batch x kv heads
        k, v = case.pool.slots_view(0)
        new = torch.cat([plan.kv_lens, plan.kv_indices])
        lens_old = plan.kv_lens - 3 if change == "lengths" else plan.kv_lens
        old = torch.cat([lens_old, plan.kv_indices.roll(1)])  # the pages in another order
        both = torch.empty_like(new)  # plan.kv_lens and kv_indices as views of one buffer the writer fills
        lens, idx = both[:plan.kv_lens.numel()], both[plan.kv_lens.numel():]

        def decode_after(write: bool) -> torch.Tensor:
            both.copy_(old if write else new)
            torch.cuda.synchronize()
            out = torch.zeros_like(case.q)
            if write:
                _write_late(new, both)
            paged_decode(case.q, k, v, out, plan.qo_indptr, plan.kv_indptr, idx, lens, page_size=page_size,
                         scale=case.scale, params=plan.params, o_part=plan.o_part, lse_part=plan.lse_part,
                         counters=plan.counters)
            torch.cuda.synchronize()
            return out

        ref, probe = _raced(decode_after, idx, lambda: both.copy_(old), lambda: _write_late(new, both))  # page ids
    first = plan.kv_lens.numel()
    assert probe == [int(old[first]), int(new[first])], "the early read did not race the writer: void test"
    torch.testing.assert_close(ref.float(), case.reference()[0], atol=2e-2, rtol=2e-2)  # [layers, T, H, D]


@triton.jit
def _late_rows(SRC_K, SRC_V, K, V, SLOTS, n, row, spins, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """Lets the next PDL kernel launch at once (pdl_start), spins, then copies n rows of ``row`` elements from
    SRC_K / SRC_V into K / V at pool slots SLOTS (a KV store, late)."""
    pdl_start(USE_PDL)
    x = tl.program_id(0).to(tl.float32) + 1.0
    for _ in range(spins):
        x = x * 1.0000001 + 1e-7
    offs = tl.arange(0, BLOCK)
    m = offs < row
    for r in range(n):
        slot = tl.load(SLOTS + r).to(tl.int64)
        keep = m & (x >= 0)  # always: keeps the spin
        tl.store(K + slot * row + offs, tl.load(SRC_K + r * row + offs, mask=m), mask=keep)
        tl.store(V + slot * row + offs, tl.load(SRC_V + r * row + offs, mask=m), mask=keep)


@pytest.mark.parametrize("preload", [0, 1, 2], ids=["after-wait", "preload-k", "preload-kv"])
@pytest.mark.parametrize("head_dim,gqa,fused", [(128, 4, False), (128, 4, True), (64, 3, True)])
def test_the_current_tokens_kv_stored_just_before_is_read_after_the_wait(head_dim, gqa, fused, preload, monkeypatch):
    """What the early tile's preload rests on: of a request's K / V only the current token's row (position
    kv_len - 1) may be stored by the launch before the decode. Here that launch lets the decode start, spins, then
    stores every request's current row (old values before it): the output is still the new rows', the same bits as
    with no race, with the early tile's rows loaded after the wait and before it (``preload``). A probe launched the
    same way checks that an early read does see the old row (the race is real)."""
    from attnlab.kernels import heuristics

    monkeypatch.setattr(heuristics, "sm_count", lambda device_index=0: 132)
    case = make_case(kv_lens=[4096, 3000, 1, 130], q_lens=[1, 1, 1, 1], page_size=16, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, device="cuda", num_layers=1, seed=head_dim + gqa)
    with pdl.using(True, "cuda"), decode.early_preloading(preload):
        be = case.backend(TritonBackend)
        be.fused_merge = fused
        be.plan(case.meta)
        plan = be.active_plan
        early = decode.early_launch(case.q, case.pool.slots_view(0)[0], plan.params)[1]
        small = plan.params.block_n * plan.params.block_d <= decode.EARLY_TILE_SMALL_ELEMS  # K and V, else K at most
        assert early["EARLY_TILE"] and early["PRELOAD"] == min(preload, 2 if small else 1), (plan.params, early)
        k, v = case.pool.slots_view(0)
        assert k.is_contiguous() and v.is_contiguous()
        lens, starts = plan.kv_lens.long(), plan.kv_indptr[:-1].long()
        last = lens - 1
        slots = (plan.kv_indices.long()[starts + last // 16] * 16 + last % 16).to(torch.int32)
        new_k, new_v = k[slots.long()].clone(), v[slots.long()].clone()
        old_k, old_v = new_k + 1.0, new_v + 1.0

        def store_late() -> None:  # ~5 ms of FMAs first, as _write_late
            _late_rows[(1,)](new_k, new_v, k, v, slots, slots.numel(), k[0].numel(), 2_000_000,
                             BLOCK=triton.next_power_of_2(k[0].numel()), **launch_args(k))

        def decode_after(write: bool) -> torch.Tensor:
            k[slots.long()], v[slots.long()] = (old_k, old_v) if write else (new_k, new_v)
            torch.cuda.synchronize()
            if write:
                store_late()
            out = be.run(case.q, 0)  # the decode directly after the writer (run allocates with torch.empty)
            torch.cuda.synchronize()
            return out

        row0 = k[slots[0].long()].view(-1)[:2].view(torch.int32)  # the first request's current K row, first 4 bytes
        ref, probe = _raced(decode_after, row0, lambda: k.index_put_((slots.long(),), old_k), store_late)
    bits = [int(t.view(-1)[:2].view(torch.int32)) for t in (old_k[0], new_k[0])]
    assert probe == bits, "the early read did not race the store: void test"
    torch.testing.assert_close(ref.float(), case.reference()[0], atol=2e-2, rtol=2e-2)
