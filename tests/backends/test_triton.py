"""The triton backend (attnlab.kernels) against the torch reference.

Without a CUDA GPU the kernels run under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
before any test module imports attnlab.kernels).
"""

import os

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.backends.registry import require_available
from attnlab.kernels.heuristics import plan_params
from attnlab.kernels.store_kv import store_kv
from attnlab.kvcache import KVPool
from tests.backends.cases import make_case

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TritonBackend = require_available("triton")
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (too slow or unfaithful under the interpreter)")
TOL = {torch.float32: {"atol": 2e-4, "rtol": 2e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
       torch.float16: {"atol": 4e-3, "rtol": 4e-3}}


def check(case, num_splits=None, tol_dtype=None):
    """Run the triton backend on every layer of ``case`` and compare with the reference."""
    be = case.backend(TritonBackend)
    be.num_splits = num_splits
    be.plan(case.meta)
    out = torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
    assert out.dtype == case.q.dtype and out.shape[1:] == case.q.shape
    torch.testing.assert_close(out.float(), case.reference(), **TOL[tol_dtype or case.q.dtype])
    return be


def lens(contexts, q_lens):
    """kv_len = context (prefix already in the pool) + the new tokens."""
    return [c + q for c, q in zip(contexts, q_lens)]


# context 0/1/17/300 tokens before the new ones; a q_len 0 request (padding) in the middle.
CONTEXTS = [300, 0, 17, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_splits", [None, 3], ids=["auto", "split3"])
def test_decode(page_size, gqa, head_dim, dtype, num_splits):
    q_lens = [1, 1, 0, 1] if gqa == 3 else [1, 1, 1, 1]
    batch = 4 if head_dim == 64 else 2  # batch 1..4
    q_lens = q_lens[:batch]
    case = make_case(kv_lens=lens(CONTEXTS[:batch], q_lens), q_lens=q_lens, page_size=page_size,
                     num_kv_heads=2, gqa=gqa, head_dim=head_dim, dtype=dtype, device=DEVICE, seed=gqa)
    be = check(case, num_splits)
    assert be.active_plan.params.kind == "decode"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree"])
@pytest.mark.parametrize("k", [1, 3])
def test_verify(k, tree, page_size, gqa, head_dim, dtype):
    batch = 3 if head_dim == 64 else 1
    q_lens = [k + 1] * batch
    contexts = [300, 17, 1][:batch] if head_dim == 64 else [17]
    case = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=page_size, num_kv_heads=2,
                     gqa=gqa, head_dim=head_dim, dtype=dtype, device=DEVICE, mode=Mode.VERIFY, tree_mask=tree,
                     seed=k + 10 * gqa)
    # split the long request's KV in half the cases: the merge pass must not change the result
    be = check(case, num_splits=2 if (k == 3) != tree else None)
    assert be.active_plan.params.kind == "extend"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree"])
def test_prefill_mixed(tree, page_size, gqa, dtype):
    # pure prefill (context 0), chunked prefill over a prefix, a q_len 0 request, a 1-token request
    q_lens = [40, 0, 5, 1]
    contexts = [0, 17, 300, 1]
    case = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=page_size, num_kv_heads=1,
                     gqa=gqa, head_dim=64, dtype=dtype, device=DEVICE, mode=Mode.PREFILL, tree_mask=tree,
                     seed=3)
    check(case)


@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_tiles_below_the_causal_band(page_size, head_dim):
    # long enough that whole KV tiles sit below each query block's causal band: the extend kernel runs those
    # unmasked (no select, no load mask but the head-dim one, none at all when BLOCK_D == head_dim) and only
    # the band's tiles masked; head_dim 80 pads BLOCK_D to 128 (the masked-d unmasked path)
    q_lens = [150, 70, 3]
    contexts = [0, 130, 260]
    case = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=3,
                     head_dim=head_dim, dtype=torch.float32, device=DEVICE, mode=Mode.PREFILL, seed=5)
    check(case)


def test_unmasked_tiles_give_the_bits_of_the_masked_path():
    # the causal pass (tiles below the band unmasked) against the same pass with its causal mask given as a custom
    # mask (every tile through the masked loop): the same values in the same order, so the same bits
    import dataclasses

    from attnlab.backends.torch_ref import causal_mask

    q_lens, contexts = [150, 70], [0, 130]
    case = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=16, num_kv_heads=2, gqa=3,
                     head_dim=64, dtype=torch.float32, device=DEVICE, mode=Mode.PREFILL, seed=7)
    outs = []
    for mask in (None, torch.cat([causal_mask(q, k).reshape(-1) for q, k in zip(q_lens, lens(contexts, q_lens))])):
        be = case.backend(TritonBackend)
        be.plan(dataclasses.replace(case.meta, custom_mask=None if mask is None else mask.to(DEVICE)))
        outs.append(be.run(case.q, 0))
    assert torch.equal(outs[0], outs[1])


def test_prefill_tiles_option_overrides_the_prefill_launch_only():
    from attnlab.errors import ConfigError

    cls = require_available("triton", {"prefill_tiles": "32x16x4x2"})
    q_lens = [150, 3]
    case = make_case(kv_lens=lens([0, 260], q_lens), q_lens=q_lens, page_size=16, num_kv_heads=2, gqa=3,
                     head_dim=64, dtype=torch.float32, device=DEVICE, mode=Mode.PREFILL, seed=6)
    be = case.backend(cls)
    be.plan(case.meta)
    out = torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
    torch.testing.assert_close(out.float(), case.reference(), **TOL[torch.float32])
    assert "BLOCK_M=32 BLOCK_N=16 " in be.kernel_info()["prefill"] and "warps=4 stages=2" in be.kernel_info()["prefill"]
    verify = make_case(kv_lens=[40, 9], q_lens=[5, 5], page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                       dtype=torch.float32, device=DEVICE)
    be = verify.backend(cls)
    be.plan(verify.meta)
    assert "BLOCK_N=16 " not in be.kernel_info()["verify"]  # a verify keeps the heuristic's launch
    for bad in ("128x64x8", "96x64x8x3", "128x64x8x0", "axbxcxd"):
        with pytest.raises(ConfigError, match="prefill_tiles"):
            require_available("triton", {"prefill_tiles": bad})


@pytest.mark.parametrize("page_size,tiles", [(16, "16x2x2"), (3, "32x4x1"), (16, "64x8x4")])
def test_decode_tiles_option_overrides_the_decode_launch_only(page_size, tiles):
    """decode_tiles (the batch-1 decode floor's sweep): the decode kernel's KV tile, warps and stages, the split count
    following that tile (batch 1 x 300 tokens on the interpreter's two SMs: two splits of whole tiles), equal to the
    reference; a verify keeps the heuristic's launch; bad specs are one line."""
    from attnlab.errors import ConfigError
    from attnlab.kernels.heuristics import parse_decode_tiles

    bn, warps, stages = parse_decode_tiles(tiles)
    cls = require_available("triton", {"decode_tiles": tiles})
    case = make_case(kv_lens=[300], q_lens=[1], page_size=page_size, num_kv_heads=2, gqa=3, head_dim=64,
                     dtype=torch.float32, device=DEVICE, mode=Mode.DECODE, seed=7)
    be = case.backend(cls)
    be.plan(case.meta)
    out = torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
    torch.testing.assert_close(out.float(), case.reference(), **TOL[torch.float32])
    info = be.kernel_info()["decode"]
    assert f"BLOCK_N={bn} " in info and "splits=2 " in info and f"warps={warps} stages={stages}" in info, info
    verify = make_case(kv_lens=[40, 9], q_lens=[5, 5], page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                       dtype=torch.float32, device=DEVICE)
    be = verify.backend(cls)
    be.plan(verify.meta)
    assert f"warps={warps} stages={stages}" not in be.kernel_info()["verify"] or (warps, stages) == (4, 3)
    for bad in ("64x4", "48x4x3", "512x4x3", "64x16x3", "64x4x0", "axbxc"):
        with pytest.raises(ConfigError, match="decode_tiles"):
            require_available("triton", {"decode_tiles": bad})
    with pytest.raises(ConfigError, match="decode_tiles does not apply with engine.invariant"):
        TritonBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.float32,
                      invariant=True, decode_tiles=tiles)


def test_query_blocks_heaviest_first():
    from attnlab.kernels.extend import query_blocks

    reqs, starts = query_blocks([5, 0, 3], 2)
    assert (reqs, starts) == ([0, 0, 0, 2, 2], [0, 2, 4, 0, 2])  # without lengths: request order
    # with kv lengths: the most KV positions to read first (prefix + the block's last token), ties in order
    reqs, starts = query_blocks([5, 0, 3], 2, kv_lens=[5, 0, 103])
    assert list(zip(reqs, starts)) == [(2, 2), (2, 0), (0, 4), (0, 2), (0, 0)]
    # no cached prefix (kv_len = q_len: the contiguous prefill's tiles): every tile once, the most keys first
    q_lens = [70, 0, 20, 129]
    reqs, starts = query_blocks(q_lens, 32, q_lens)
    assert sorted(zip(reqs, starts)) == [(0, 0), (0, 32), (0, 64), (2, 0), (3, 0), (3, 32), (3, 64), (3, 96), (3, 128)]
    work = [min(s + 32, q_lens[r]) for r, s in zip(reqs, starts)]
    assert work == sorted(work, reverse=True)


@pytest.mark.parametrize("page_size", [3, 64, 512])
def test_other_page_sizes(page_size):
    # odd page size (gather path), page == BLOCK_N (one page id per tile), contiguous layout
    for q_lens, ctx in [([1, 1], [300, 40]), ([4, 2], [300, 0])]:
        case = make_case(kv_lens=lens(ctx, q_lens), q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=2,
                         head_dim=32, dtype=torch.float32, device=DEVICE, num_layers=2)
        check(case, num_splits=2)


@pytest.mark.parametrize("head_dim", [16, 80, 256])
def test_other_head_dims(head_dim):
    for q_lens in ([1, 1], [3, 2]):
        case = make_case(kv_lens=lens([30, 70], q_lens), q_lens=q_lens, page_size=16, num_kv_heads=1, gqa=2,
                         head_dim=head_dim, dtype=torch.float32, device=DEVICE)
        check(case)


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("q_lens", [[1, 1], [4, 2]], ids=["decode", "verify"])
def test_fp8_kv(kv_dtype, q_lens):
    case = make_case(kv_lens=lens([100, 7], q_lens), q_lens=q_lens, page_size=16, num_kv_heads=2, gqa=2,
                     head_dim=64, dtype=torch.bfloat16, kv_dtype=kv_dtype, device=DEVICE)
    case.pool.k_scale, case.pool.v_scale = 0.5, 2.0
    check(case, num_splits=2)


def test_plan_steps_keep_separate_buffers():
    # multi-step draft: k plans alive at once, each with its own scratch, each still correct
    cases = [make_case(kv_lens=[200 + i, 50 + i], q_lens=[1, 1], page_size=16, num_kv_heads=2, gqa=2,
                       head_dim=32, dtype=torch.float32, device=DEVICE, seed=0) for i in range(3)]
    be = cases[0].backend(TritonBackend, torch.float32)
    be.num_splits = 2
    be.plan_steps([c.meta for c in cases])
    steps = [be._slots[i + 1] for i in range(len(cases))]
    ptrs = {s.o_part.data_ptr() for s in steps} | {s.lse_part.data_ptr() for s in steps}
    assert len(ptrs) == 6
    for i, c in enumerate(cases):
        be.use_step(i)
        torch.testing.assert_close(be.run(c.q, 0), c.reference()[0], **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_store_kv_matches_pool_store(dtype):
    slots = torch.tensor([0, 5, -1, 19, 7, -1, 3], device=DEVICE)
    a = KVPool(2, 5, 4, 3, 64, dtype, DEVICE)
    b = KVPool(2, 5, 4, 3, 64, dtype, DEVICE)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(7, 3, 64, generator=g).to(DEVICE, torch.bfloat16)
    v = torch.randn(7, 3, 64, generator=g).to(DEVICE, torch.bfloat16)
    a.store(1, k, v, slots)
    store_kv(b, 1, k, v, slots.to(torch.int32))
    real = slice(0, 5)  # KVPool.store sends -1 to the scratch page; store_kv skips the token entirely
    assert torch.equal(a.kv[:, :, real], b.kv[:, :, real])
    assert not b.kv[:, :, 5].any()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_store_kv_fp8(kv_dtype):
    # the interpreter's fp32 -> fp8 conversion does not round like torch (or the GPU): GPU only
    pool = KVPool(1, 5, 4, 3, 64, kv_dtype, DEVICE, k_scale=0.5, v_scale=2.0)
    k, v = (torch.randn(3, 3, 64, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    store_kv(pool, 0, k, v, torch.tensor([2, -1, 9], device=DEVICE))
    flat = pool.kv[0].view(2, -1, 3, 64)
    assert torch.equal(flat[0, [2, 9]].float(), (k[[0, 2]].float() / 0.5).to(kv_dtype).float())
    assert torch.equal(flat[1, [2, 9]].float(), (v[[0, 2]].float() / 2.0).to(kv_dtype).float())


def test_capabilities_and_availability():
    caps = TritonBackend.capabilities()
    assert TritonBackend.available() is None
    assert "cuda" in caps.devices and caps.custom_mask and caps.page_sizes == "any"
    assert ("cpu" in caps.devices) == (os.environ.get("TRITON_INTERPRET") == "1")
    assert caps.cuda_graph == {Mode.DECODE, Mode.VERIFY}


@pytest.mark.parametrize("cap,e4m3", [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)])
def test_fp8_e4m3_kv_needs_sm89(monkeypatch, cap, e4m3):
    """Triton lowers e4m3 ("fp8e4nv") on sm_89+ only (attnlab.kernels.aot --arch 80 shows the compile error);
    e5m2 compiles on sm_80. The capability follows the GPU, so config validation refuses e4m3 on an A100."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cap)
    kv = TritonBackend.capabilities().kv_dtypes
    assert ("fp8_e4m3" in kv) == e4m3 and "fp8_e5m2" in kv and "bf16" in kv


def test_heuristic_splits_for_bandwidth():
    kw = {"num_kv_heads": 8, "group": 4, "head_dim": 128, "has_mask": False, "sms": 132}
    small = plan_params(q_lens=[1] * 8, kv_lens=[4096] * 8, **kw)
    assert small.kind == "decode" and small.num_splits > 1 and 8 * 8 * small.num_splits >= 2 * 132
    big = plan_params(q_lens=[1] * 64, kv_lens=[512] * 64, **kw)
    assert big.num_splits == 1  # 512 programs already
    short = plan_params(q_lens=[1], kv_lens=[100], **kw)
    assert short.num_splits == 1  # too short to be worth a second pass
    verify = plan_params(q_lens=[5] * 2, kv_lens=[8192] * 2, **kw)
    assert verify.kind == "extend" and verify.tokens_per_block >= 5 and verify.num_splits > 1
    prefill = plan_params(q_lens=[2048], kv_lens=[2048], **kw)
    assert prefill.num_splits == 1 and prefill.block_m >= 64


@pytest.mark.parametrize("hkv,group,d,block_n", [(3, 3, 64, 128), (8, 4, 128, 128)], ids=["smollm2", "llama8b"])
def test_small_batch_decode_splits_fill_two_programs_per_sm(hkv, group, d, block_n):
    """Batch 1 x 4k on 132 SMs: the 256-token split floor gave 16 splits (48 / 128 programs); the split now
    shrinks (down to one BLOCK_N tile) while batch x kv_heads x splits < 2 x SMs. (Llama-8B's splits, chosen over
    64-token tiles, hold two of them: they run as one 128-token tile.)"""
    kw = {"num_kv_heads": hkv, "group": group, "head_dim": d, "has_mask": False, "sms": 132}
    p = plan_params(q_lens=[1], kv_lens=[4096], **kw)
    assert p.block_n == block_n
    # smollm2: 3 x 88 wanted, capped at one 128-token tile per split (32); llama8b: 8 x 33 = 264 wanted, whose
    # 128-token chunks cover 4096 tokens in 32 splits (the 33rd would be empty)
    assert p.num_splits == 32
    # every split holds work: the kernel's chunk (a multiple of BLOCK_N) times the splits covers the KV once
    per_split = -(-4096 // p.num_splits)
    chunk = -(-per_split // block_n) * block_n
    assert (p.num_splits - 1) * chunk < 4096 <= p.num_splits * chunk
    # already enough programs, long contexts and short ones keep their old counts
    assert plan_params(q_lens=[1] * 8, kv_lens=[4096] * 8, **kw).num_splits == (16 if hkv == 3 else 8)
    assert plan_params(q_lens=[1], kv_lens=[32768], **kw).num_splits == 64  # MAX_SPLITS
    assert plan_params(q_lens=[1], kv_lens=[256], **kw).num_splits == 1  # one 256-token piece: never split
    assert plan_params(q_lens=[1] * 64, kv_lens=[4096] * 64, **kw).num_splits <= 2
    # verify keeps its own rule (no shrinking below 256 tokens per split)
    assert plan_params(q_lens=[5], kv_lens=[4096], **kw).num_splits <= 16


def test_shrunk_splits_stay_correct(monkeypatch):
    """Under the interpreter, with the heuristic told there are 132 SMs: batch 1 decode over 1100 tokens gets
    one-tile splits (plus a shorter request whose later splits are empty), and still matches the reference."""
    from attnlab.kernels import heuristics

    monkeypatch.setattr(heuristics, "sm_count", lambda device_index=0: 132)
    case = make_case(kv_lens=[1100, 70], q_lens=[1, 1], page_size=16, num_kv_heads=2, gqa=2, head_dim=64,
                     dtype=torch.float32, device=DEVICE)
    be = check(case)
    assert be.active_plan.params.num_splits == -(-1100 // be.active_plan.params.block_n)


@pytest.mark.parametrize("hkv,group,head_dim,batch,ctx,tiles,one_tile", [
    (3, 3, 64, 1, 4096, None, True),  # SmolLM2, batch 1 x 4k: 32 splits of one 128-token tile
    (8, 4, 128, 1, 16384, None, False),  # Llama-8B x 16k: 64 splits of four 64-token tiles
    (8, 4, 128, 4, 512, None, True),  # batch 4 x 512: 8 splits of one 64-token tile
    (3, 3, 64, 16, 4096, None, False),  # batch 16: 11 splits of three tiles
    (3, 3, 64, 1, 100, None, True),  # one tile, unsplit
    (3, 3, 64, 1, 4096, "128x4x3", False),  # decode_tiles is taken as given
    (8, 4, 128, 1, 4096, "64x4x3", False),  # the same at head dim 128: two 64-token tiles a split, as asked
])
def test_decode_splits_of_one_tile(hkv, group, head_dim, batch, ctx, tiles, one_tile):
    """The heuristic marks a launch whose splits hold one tile each (``one_tile``); its stages stay the heuristic's
    (one is taken per launch, where the early tile applies: decode.early_launch)."""
    from attnlab.kernels.heuristics import decode_params

    p = decode_params(batch=batch, num_kv_heads=hkv, group=group, head_dim=head_dim, max_kv_len=ctx, sms=132,
                      tiles=tiles)
    assert p.one_tile is one_tile, p
    assert p.num_stages == 3, p
    if tiles is None:
        assert (-(-ctx // p.num_splits) <= p.block_n) == one_tile, p
    assert p.stages_text() == "stages=3" + (" (1 where the early tile applies)" if one_tile else "")


@pytest.mark.parametrize("batch,ctx,splits", [(1, 4096, 32), (1, 3000, 24), (2, 2048, 16), (16, 128, 1),
                                              (8, 512, 4), (33, 128, 1)])
def test_decode_two_tile_splits_at_head_dim_128_take_one_128_token_tile(batch, ctx, splits):
    """Where the heuristic's splits at head dim 128 hold two 64-token tiles and its programs fill at most two a SM
    (batch 33 x 128: 264 programs on 132 SMs), the launch is one 128-token tile of 8 warps in one stage over the same
    splits (decode-early/ calls 9-11); longer contexts keep 64-token tiles. With PDL it takes the early tile (128 x 128
    of 8 warps is inside the early tile's gates since 2026-12-07; not under the gate before, +early8192): one stage
    either way."""
    from attnlab.kernels import decode, pdl
    from attnlab.kernels.heuristics import decode_params

    p = decode_params(batch=batch, num_kv_heads=8, group=4, head_dim=128, max_kv_len=ctx, sms=132)
    assert (p.block_n, p.num_warps, p.num_stages, p.num_splits) == (128, 8, 1, splits), p
    assert p.one_tile and p.stages_text() == "stages=1", p
    for other in (4 * ctx, 16384):  # four 64-token tiles a split or more splits; 16k: four or more
        q = decode_params(batch=batch, num_kv_heads=8, group=4, head_dim=128, max_kv_len=other, sms=132)
        assert (q.block_n, q.num_warps) == (64, 4), q
    q, k = torch.zeros(batch, 32, 128, dtype=torch.bfloat16), torch.zeros(64, 8, 128, dtype=torch.bfloat16)
    with pdl.forced_for_compile():
        stages, args = decode.early_launch(q, k, p)
        assert stages == 1 and args["EARLY_TILE"] is True, args
        with decode.early_tile_limit(128 * 64):
            stages, args = decode.early_launch(q, k, p)
    assert stages == 1 and args["EARLY_TILE"] is False, args


@pytest.mark.parametrize("batch,ctx,head_dim,num_splits,why", [
    (16, 320, 128, None, "3 splits x 16 x 8 = 384 programs on 132 SMs: 1.10x slower with it (call 11)"),
    (34, 128, 128, None, "unsplit, 272 programs: past two a SM"),
    (1, 4096, 128, 32, "a forced split count (tuning sweeps) keeps the heuristic's tile"),
    (1, 4096, 96, None, "head dim 96 (BLOCK_D 128): measured at 128 only"),
])
def test_decode_two_tile_rule_not_taken(batch, ctx, head_dim, num_splits, why):
    """The shapes the two-tile rule leaves to the heuristic's 64-token tiles, 4 warps, 3 stages."""
    from attnlab.kernels.heuristics import decode_params

    p = decode_params(batch=batch, num_kv_heads=8, group=4, head_dim=head_dim, max_kv_len=ctx, sms=132,
                      num_splits=num_splits)
    assert (p.block_n, p.num_warps, p.num_stages) == (64, 4, 3), (why, p)


@pytest.mark.parametrize("head_dim,kv_dtype,pdl_on,prefetch,stages", [
    (64, torch.bfloat16, False, 4, 3),  # PDL off (engine.pdl's default): one stage measured 2-8% slower (call 7)
    (64, torch.bfloat16, True, 4, 1),  # PDL on: one stage and the early first tile
    (64, torch.bfloat16, True, 0, 3),  # the KV prefetch off: no early reads at all
    (64, torch.float8_e4m3fn, True, 4, 3),  # 64-byte rows: not whole L2 lines, no early reads
    (512, torch.bfloat16, True, 4, 2),  # 32 x 512 tiles of 4 warps: 128 elements a thread (the heuristic's 2)
])
def test_one_tile_launches_take_one_stage_with_the_early_tile(head_dim, kv_dtype, pdl_on, prefetch, stages):
    """A one-tile decode runs one stage exactly where its early first tile applies at the launch (PDL and the KV
    prefetch as set then, whole L2 lines, the size gates), so a plan made under other settings launches as these are."""
    import contextlib

    from attnlab.kernels import decode, pdl
    from attnlab.kernels.heuristics import decode_params

    p = decode_params(batch=1, num_kv_heads=3, group=3, head_dim=head_dim, max_kv_len=30, sms=132)
    assert p.one_tile
    q = torch.zeros(1, 9, head_dim, dtype=torch.bfloat16)
    k = torch.zeros(64, 3, head_dim, dtype=kv_dtype)
    with pdl.forced_for_compile() if pdl_on else contextlib.nullcontext(), decode.kv_prefetching(prefetch):
        got, args = decode.early_launch(q, k, p)
    assert got == stages
    assert args.get("EARLY_TILE", False) is (stages == 1)


@pytest.mark.parametrize("tiles,head_dim,early", [("128x4x1", 64, True), ("64x4x1", 128, True),
                                                  ("128x2x1", 64, True), ("64x2x1", 128, True),
                                                  ("128x8x1", 128, True), ("128x4x1", 128, False),
                                                  ("128x4x3", 64, False)])
def test_early_tile_takes_one_stage_and_small_tiles(tiles, head_dim, early):
    """The decode's early first tile (with PDL): launches of one stage with tiles of at most 128 x 64 elements (at any
    warps, 2 too, as before 2026-12-07), or of at most 128 x 128 at 64 elements a thread (8 warps); a pipelined loop
    and 128 x 128 tiles of 4 warps measured slower with it (experiments/decode-early/)."""
    from attnlab.kernels import decode, pdl
    from attnlab.kernels.heuristics import decode_params

    p = decode_params(batch=1, num_kv_heads=2, group=4, head_dim=head_dim, max_kv_len=4096, sms=132, tiles=tiles)
    q = torch.zeros(1, 8, head_dim, dtype=torch.bfloat16)
    k = torch.zeros(64, 2, head_dim, dtype=torch.bfloat16)
    assert decode.early_launch(q, k, p) == (p.num_stages, {})  # no PDL: no early reads at all
    with pdl.forced_for_compile():
        _, args = decode.early_launch(q, k, p)
    assert args["PREFETCH"] == decode.KV_PREFETCH_TILES and args["EARLY_TILE"] is early, args


@pytest.mark.parametrize("gate,head_dim,tiles,early,stages", [
    (16384, 128, None, True, 1),  # the two-tile rule's 128 x 128 tile of 8 warps: the early tile (the default gate)
    (8192, 128, None, False, 1),  # the gate before 2026-12-07 (bench +early8192): one stage, no early tile
    (16384, 128, "128x8x1", True, 1),  # a decode_tiles override of that size and warps too
    (16384, 128, "128x4x1", False, 1),  # at 4 warps: 128 elements a thread, never early (measured slower)
    (32768, 128, "128x4x1", False, 1),  # whatever the gate
    (0, 64, None, False, 3),  # no early tile: a one-tile split keeps the heuristic's 3 stages
    (0, 128, "64x4x1", False, 1),  # an override keeps its own stages, without the early tile
])
def test_early_tile_gate_is_a_process_switch(gate, head_dim, tiles, early, stages):
    """decode.early_tile_limit (a bench arm's ``+early<elems>``): the early first tile's size gate for a block, so an
    A/B of the gate runs in one process; the default gate restored after."""
    from attnlab.kernels import decode, pdl
    from attnlab.kernels.heuristics import decode_params

    ctx = 4096 if head_dim == 128 else 30
    p = decode_params(batch=1, num_kv_heads=8, group=4, head_dim=head_dim, max_kv_len=ctx, sms=132, tiles=tiles)
    q, k = torch.zeros(1, 32, head_dim, dtype=torch.bfloat16), torch.zeros(64, 8, head_dim, dtype=torch.bfloat16)
    with pdl.forced_for_compile(), decode.early_tile_limit(gate):
        got, args = decode.early_launch(q, k, p)
    assert (got, args["EARLY_TILE"]) == (stages, early), (p, args)
    assert decode.early_tile_max() == decode.EARLY_TILE_MAX_ELEMS
    with pdl.forced_for_compile():
        assert decode.early_launch(q, k, p)[1]["EARLY_TILE"] is (tiles != "128x4x1")  # the default gate
    for bad in (-1, 32769, True, 1.5):
        with pytest.raises(ValueError, match="early tile gate"):
            decode.set_early_tile_max(bad)


def test_warmup_runs_every_variant():
    case = make_case(kv_lens=[9], q_lens=[1], page_size=16, num_kv_heads=1, gqa=2, head_dim=32,
                     dtype=torch.float32, device=DEVICE)
    be = case.backend(TritonBackend)
    records = be.warmup(batch_sizes=(1, 4), q_lens=(1, 4), kv_lens=(16, 1024), custom_mask=True)
    kinds = {(r["params"].kind, r["custom_mask"], r["params"].num_splits > 1) for r in records}
    assert ("decode", False, False) in kinds and ("extend", True, False) in kinds
    assert ("decode", False, True) in kinds  # batch 1 x 1024 tokens splits even with 2 "SMs"


# ---------------------------------------------------------------- GPU scale (compiled kernels)

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("batch,context", [(1, 4096), (1, 32768), (8, 32768), (64, 4096), (16, 8192)])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("heads", [(9, 3, 64), (32, 8, 128)], ids=["smollm2", "llama8b"])
def test_gpu_decode_scale(batch, context, page_size, heads):
    hq, hkv, d = heads
    case = make_case(kv_lens=[context - 37 * i for i in range(batch)], q_lens=[1] * batch,
                     page_size=page_size, num_kv_heads=hkv, gqa=hq // hkv, head_dim=d, dtype=torch.bfloat16,
                     device="cuda")
    check(case)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("batch,context", [(1, 32768), (16, 8192)])
@pytest.mark.parametrize("k,tree", [(4, False), (8, False), (4, True)])
def test_gpu_verify_scale(batch, context, k, tree):
    q_lens = [k + 1] * batch
    case = make_case(kv_lens=[context - 11 * i for i in range(batch)], q_lens=q_lens, page_size=16,
                     num_kv_heads=8, gqa=4, head_dim=128, dtype=torch.bfloat16, device="cuda", tree_mask=tree)
    check(case)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("q_lens,contexts", [([4096], [0]), ([1024, 512, 0, 77], [0, 3000, 5, 9000])])
def test_gpu_prefill_scale(q_lens, contexts):
    case = make_case(kv_lens=lens(contexts, q_lens), q_lens=q_lens, page_size=16, num_kv_heads=8, gqa=4,
                     head_dim=128, dtype=torch.bfloat16, device="cuda", mode=Mode.PREFILL)
    check(case)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("q_len", [1, 5], ids=["decode", "verify"])
def test_gpu_run_is_graph_safe(q_len):
    # no host sync in run(), and a captured run replays correctly after the pool changes
    case = make_case(kv_lens=[4000, 900], q_lens=[q_len, q_len], page_size=16, num_kv_heads=8, gqa=4,
                     head_dim=128, dtype=torch.bfloat16, device="cuda")
    be = case.backend(TritonBackend)
    be.plan(case.meta)
    be.run(case.q, 0)  # compile outside capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        be.run(case.q, 0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = be.run(case.q, 0)
    case.pool.kv.normal_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), case.reference()[0], **TOL[torch.bfloat16])


@pytest.mark.parametrize("q_len", [1, 3])
def test_graph_mode_plans_reuse_buffers_and_stay_correct(q_len):
    """cuda_graph=True: one static plan per (slot, batch, q_len), launch parameters sized for max_context,
    buffers rewritten in place; outputs still match the reference for shorter, changing lengths."""
    first = make_case(kv_lens=[200 + q_len, 5 + q_len], q_lens=[q_len] * 2, page_size=4, num_kv_heads=1, gqa=6,
                      head_dim=64, dtype=torch.float32, device=DEVICE, seed=1)
    be = TritonBackend(first.pool, 6, 1, 64, first.scale, torch.float32, cuda_graph=True, max_batch_size=2,
                       max_q_len=4, max_context=2000)
    be.plan(first.meta)
    plan = be.active_plan
    torch.testing.assert_close(be.run(first.q, 0).float(), first.reference()[0], **TOL[torch.float32])
    assert plan.params.num_splits > 1  # chosen for 2000 tokens, not 205
    # a later pass over another pool layout: same plan object and buffers, new values
    second = make_case(kv_lens=[9 + q_len, 70 + q_len], q_lens=[q_len] * 2, page_size=4, num_kv_heads=1, gqa=6,
                       head_dim=64, dtype=torch.float32, device=DEVICE, seed=2)
    be.pool = second.pool
    be.plan(second.meta)
    assert be.active_plan is plan
    torch.testing.assert_close(be.run(second.q, 0).float(), second.reference()[0], **TOL[torch.float32])


@pytest.mark.skipif(CUDA, reason="CPU runners (interpreter); GPU pairs run in tests/integration/test_gpu_engine.py")
@pytest.mark.parametrize("kind", ["self", "ngram"])
def test_speculative_triton_pair_equals_torch_pair(kind):
    """End to end, fp32: backend=triton verify=triton emits exactly the tokens of the torch pair."""
    from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
    from attnlab.spec.drafters import ModelDrafter, NgramDrafter
    from tests.spec.tiny import prompts, runner, tiny_config, tiny_model

    cfg = tiny_config(vocab=64, layers=2, heads=6, kv_heads=2, head_dim=32, hidden=48)
    model = tiny_model(cfg, seed=0)
    ps = prompts(4, cfg.vocab_size, lengths=(1, 6, 13, 3))
    outs = []
    for backend in ("torch", "triton"):
        def side(name, layers=None, backend=backend):
            return runner(model, cfg, page_size=4, backend=backend, max_context=64, layers=layers, name=name)
        drafter = ModelDrafter(side("draft", [0]), "self") if kind == "self" else NgramDrafter("cpu")
        outs.append(SpeculativeDecoder(side("target"), drafter, SpecParams(3)).generate(ps, 12))
    assert [r.output_ids for r in outs[1].requests] == [r.output_ids for r in outs[0].requests]
    assert [r.accept_lens for r in outs[1].requests] == [r.accept_lens for r in outs[0].requests]



def test_prefill_tiles_narrower_than_the_gqa_group_still_cover_every_head():
    # an override with BLOCK_M below the group (wide GQA / MQA) would leave heads unwritten: it is widened to the
    # group, one token's whole group per program
    cls = require_available("triton", {"prefill_tiles": "16x16x4x2"})
    case = make_case(kv_lens=[70], q_lens=[70], page_size=16, num_kv_heads=1, gqa=32, head_dim=16,
                     dtype=torch.float32, device=DEVICE, mode=Mode.PREFILL, seed=8)
    be = case.backend(cls)
    be.plan(case.meta)
    assert be.active_plan.params.block_m == 32 and be.active_plan.params.tokens_per_block == 1
    out = torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
    torch.testing.assert_close(out.float(), case.reference(), **TOL[torch.float32])
