"""flashinfer's verify_backend=xqa (CPU, through the fake XQA of fakes.py; GPU at the end): a uniform chain verify on
FlashInfer's XQA speculative-decoding kernel (attnlab.backends.flashinfer_xqa), against the torch reference."""

import itertools
import sys
import types

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.backends.flashinfer import FlashInferBackend
from attnlab.backends.flashinfer_xqa import XqaPass, block_table, chain_mask, graph_width
from attnlab.errors import ConfigError
from tests.backends.cases import make_case
from tests.backends.fakes import XQA_CALLS, FakeDecode, FakePrefill
from tests.backends.test_flashinfer import backend as fi_backend
from tests.backends.test_flashinfer import capture_layers, meta_over, reference, run_all_layers

XQA = {"verify_backend": "xqa"}


def backend(case, **kw):
    return fi_backend(case, **{**XQA, **kw})


def case_of(q_lens, kv_lens, page_size=16, gqa=3, head_dim=64, num_kv_heads=2, dtype=torch.bfloat16,
            kv_dtype=None, mode=Mode.VERIFY, tree=False):
    return make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=num_kv_heads, gqa=gqa,
                     head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype, num_layers=2, mode=mode, tree_mask=tree)


def bits_of(mask: torch.Tensor) -> list[list[int]]:
    """[b, q, 2w] uint16 -> each row's first 32-bit word, as unsigned ints."""
    words = mask.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return words[..., 0].tolist()


def test_chain_mask_by_hand():
    """Row i sees draft tokens 0..i: 0b1, 0b11, 0b111 ...; two words a row past 32 tokens (row 32: all of word 0, bit 0
    of word 1); every request the same."""
    m = chain_mask(2, 4, "cpu")
    assert m.dtype == torch.uint16 and tuple(m.shape) == (2, 4, 2)
    assert bits_of(m) == [[1, 3, 7, 15]] * 2
    m = chain_mask(1, 33, "cpu")
    assert tuple(m.shape) == (1, 33, 4)
    words = m.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert words[0, 31].tolist() == [0xFFFFFFFF, 0] and words[0, 32].tolist() == [0xFFFFFFFF, 1]


def test_block_table_by_hand():
    """CSR -> [batch, width]: each request's page ids, the scratch page past them (and for a request of no pages)."""
    ptr = torch.tensor([0, 2, 5, 5], dtype=torch.int32)
    ids = torch.tensor([7, 8, 1, 2, 3], dtype=torch.int32)
    t = block_table(ptr, ids, 3, 4, 99)
    assert t.dtype == torch.int32 and t.tolist() == [[7, 8, 99, 99], [1, 2, 3, 99], [99, 99, 99, 99]]
    with pytest.raises(ValueError, match="holds 3 pages, the table 2"):
        block_table(ptr, ids, 3, 2, 99)
    empty = block_table(torch.zeros(2, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 0, 3, 5)
    assert empty.tolist() == [[5, 5, 5]]
    assert graph_width(1000, 8, 16) == 63


def table_reference(ptr: list[int], ids: list[int], width: int, pad: int) -> list[list[int]]:
    return [ids[a:b] + [pad] * (width - (b - a)) for a, b in itertools.pairwise(ptr)]


@pytest.mark.parametrize("pages,width", [([3, 0, 1], 4), ([0], 2), ([300, 5], 600), ([1] * 9, 1), ([257, 256], 257)])
def test_block_table_kernel_against_lists(pages, width):
    """The Triton kernel (the interpreter here) against the lists by hand: tables wider than one program's 256
    columns, requests of no pages, a request filling its row; written into a slot buffer's first rows with the KV
    lengths in the same launch, the rows past the batch untouched."""
    gen = torch.Generator().manual_seed(len(pages))
    ptr = [0]
    for n in pages:
        ptr.append(ptr[-1] + n)
    ids = torch.randperm(2000, generator=gen)[:ptr[-1]].to(torch.int32)
    want = table_reference(ptr, ids.tolist(), width, 7777)
    t = block_table(torch.tensor(ptr, dtype=torch.int32), ids, max(pages), width, 7777)
    assert t.dtype == torch.int32 and t.tolist() == want
    buf, lens_buf = torch.full((len(pages) + 2, width), -5, dtype=torch.int32), torch.full((len(pages) + 2,), -5,
                                                                                        dtype=torch.int32)
    lens = torch.arange(len(pages), dtype=torch.int32) * 16 + 3
    block_table(torch.tensor(ptr, dtype=torch.int32), ids, max(pages), width, 7777, out=buf[:len(pages)],
                lens=(lens, lens_buf[:len(pages)]))
    assert buf[:len(pages)].tolist() == want and buf[len(pages):].eq(-5).all()
    assert lens_buf[:len(pages)].tolist() == lens.tolist() and lens_buf[len(pages):].eq(-5).all()


def test_block_table_of_strided_views():
    """The kernel reads at unit stride: strided views of the layout and of the lengths are copied first, not misread."""
    ptr = torch.tensor([0, 9, 2, 9, 3], dtype=torch.int32)[::2]  # [0, 2, 3]
    ids = torch.tensor([10, 0, 11, 0, 12, 0], dtype=torch.int32)[::2]  # [10, 11, 12]
    lens = torch.tensor([5, 0, 7, 0], dtype=torch.int32)[::2]
    out, got = torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    block_table(ptr, ids, 2, 3, 99, out=out, lens=(lens, got))
    assert out.tolist() == [[10, 11, 99], [12, 99, 99]] and got.tolist() == [5, 7]


def test_block_table_bad_buffers():
    ptr, ids = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([4, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="width 4 into a buffer"):
        block_table(ptr, ids, 2, 4, 0, out=torch.zeros(1, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="row-contiguous"):
        block_table(ptr, ids, 2, 4, 0, out=torch.zeros(4, 1, dtype=torch.int32).t())
    with pytest.raises(ValueError, match="lens of 2 / 1"):
        block_table(ptr, ids, 2, 4, 0, out=torch.zeros(1, 4, dtype=torch.int32),
                    lens=(torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)))


@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("gqa", [1, 3])
@pytest.mark.parametrize("q_len,kv_lens", [(2, [2, 40]), (5, [5, 33, 200]), (4, [16]), (9, [48, 9])])
def test_eager_xqa_attends_the_reference(fake_fi, page_size, gqa, q_len, kv_lens):
    """Eager passes: one XQA call a layer, over a page table as wide as the longest request (max_seq_len = width x
    page size), the requests' KV lengths as uint32, the causal draft-block mask; no FlashInfer wrapper is made; equal
    to the reference's bottom-right causal verify (kv = q_len: no prefix; a request ending on a page boundary);
    kernel_info names xqa."""
    case = case_of([q_len] * len(kv_lens), kv_lens, page_size=page_size, gqa=gqa)
    be = backend(case)
    be.plan(case.meta)
    assert isinstance(be.active_plan, XqaPass)
    torch.testing.assert_close(run_all_layers(be, case), reference(case, case.meta, case.q), atol=2e-2, rtol=2e-2)
    assert not FakeDecode.created and not FakePrefill.created
    call = XQA_CALLS[-1]
    width = max(-(-n // page_size) for n in kv_lens)
    assert call["table"].shape == (len(kv_lens), width) and call["max_seq_len"] == width * page_size
    assert call["seq_lens"].to(torch.int64).tolist() == kv_lens and len(XQA_CALLS) == case.pool.num_layers
    assert be.kernel_info() == {"verify": "xqa"}


@pytest.mark.parametrize("dtype,kv_dtype,head_dim", [(torch.float16, None, 128), (torch.bfloat16, None, 256),
                                                     (torch.bfloat16, torch.float8_e4m3fn, 64)])
def test_eager_xqa_dtypes_and_head_dims(fake_fi, dtype, kv_dtype, head_dim):
    """fp16, head dim 128 and 256, and an e4m3 KV: its k_scale folds into bmm1 (with sm_scale), v_scale is bmm2."""
    case = case_of([3, 3], [70, 20], head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype)
    be = backend(case)
    be.plan(case.meta)
    out = run_all_layers(be, case)
    torch.testing.assert_close(out, reference(case, case.meta, case.q), atol=3e-2, rtol=3e-2)
    call = XQA_CALLS[-1]
    if kv_dtype is None:
        assert call["bmm1"] == case.scale and call["bmm2"] == 1.0
    else:
        assert call["bmm1"] == pytest.approx(case.scale * case.pool.k_scale) and call["bmm2"] == case.pool.v_scale


@pytest.mark.parametrize("gqa,q_len,takes", [(4, 8, True), (4, 9, False), (3, 10, True), (3, 11, False),
                                             (16, 2, True), (32, 2, False)])
def test_xqa_takes_a_verify_whose_rows_fit_its_tile(fake_fi, gqa, q_len, takes):
    """q_len x GQA group <= 32 rows (one XQA query tile) runs XQA, more runs the fa2 plan (eager; and in graph mode
    the split rule's two fa2 plans); both attend the reference."""
    case = case_of([q_len] * 2, [q_len + 30, 90], gqa=gqa, num_kv_heads=1)
    be = backend(case)
    be.plan(case.meta)
    assert isinstance(be.active_plan, XqaPass) is takes
    assert be.kernel_info()["verify"] == "xqa" if takes else be.kernel_info()["verify"].startswith("fa2")
    torch.testing.assert_close(run_all_layers(be, case), reference(case, case.meta, case.q), atol=2e-2, rtol=2e-2)
    graphs = backend(case, cuda_graph=True, max_batch_size=2, max_q_len=16, verify_split_kv="auto")
    assert graphs.graph_variants(q_len, False) == ((None,) if takes else ("split", "whole"))


def test_fp8_kv_scales_fold_into_bmm1_and_bmm2(fake_fi):
    """An e4m3 pool whose k_scale and v_scale differ (2.0, 0.5; the stored values read as value x scale by the
    reference too): XQA's scores take sm_scale x k_scale, its output v_scale; swapped scales would miss the reference."""
    case = case_of([3, 3], [70, 20], kv_dtype=torch.float8_e4m3fn)
    case.pool.k_scale, case.pool.v_scale = 2.0, 0.5
    be = backend(case)
    be.plan(case.meta)
    torch.testing.assert_close(run_all_layers(be, case), reference(case, case.meta, case.q), atol=3e-2, rtol=3e-2)
    assert XQA_CALLS[-1]["bmm1"] == pytest.approx(2.0 * case.scale) and XQA_CALLS[-1]["bmm2"] == 0.5


def test_passes_xqa_does_not_take_run_fa2_or_the_decode(fake_fi):
    """Decode (q_len 1) runs the decode wrapper; a ragged verify, a prefill of uniform length and a tree-masked
    verify run the fa2 prefill wrapper (never auto / fa3); kernel_info names each."""
    case = case_of([4, 4], [40, 70])
    be = backend(case)
    be.plan(meta_over(case, [40, 70], [1, 1]))
    assert isinstance(be.active_plan.wrapper, FakeDecode)
    for q_lens, mode in (([2, 4], Mode.VERIFY), ([4, 4], Mode.PREFILL)):
        meta = meta_over(case, [40, 70], q_lens, mode=mode)
        be.plan(meta)
        assert isinstance(be.active_plan.wrapper, FakePrefill) and be.active_plan.family == "fa2"
        q = torch.randn(sum(q_lens), case.num_q_heads, case.head_dim).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=2e-2, rtol=2e-2)
    tree = case_of([4, 4], [40, 70], tree=True)
    tb = backend(tree)
    tb.plan(tree.meta)
    assert tb.active_plan.family == "fa2" and tb.active_plan.kind == "mask"
    assert not XQA_CALLS
    assert set(be.kernel_info()) == {"decode", "verify", "prefill"} and be.kernel_info()["verify"] == "fa2"


def test_graph_mode_xqa_writes_one_slot_buffer_and_follows_new_lengths(fake_fi):
    """cuda_graph=True: every pass of a bucket writes the slot's page table / lengths in place (the pointers a graph
    captured stay the ones XQA reads), a table as wide as max_context + max_q_len (one grid), the scratch page past
    each request's pages; each pass equals the reference; graph_variants names one plan, under verify_split_kv=auto
    too."""
    case = case_of([5, 5], [300, 120])
    be = backend(case, cuda_graph=True, max_batch_size=4, max_q_len=8, max_context=320, verify_split_kv="auto")
    assert be.graph_variants(5, False) == (None,) and be.graph_variants(5, False, batch=4) == (None,)
    g = torch.Generator().manual_seed(3)
    ptrs = set()
    for kv_lens in ([300, 120], [17, 5], [64, 65], [5, 5]):
        meta = meta_over(case, kv_lens, [5, 5])
        be.plan(meta)
        q = torch.randn(10, case.num_q_heads, case.head_dim, generator=g).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=2e-2, rtol=2e-2)
        call = XQA_CALLS[-1]
        ptrs.add((call["table"].data_ptr(), call["seq_lens"].data_ptr(), call["mask"].data_ptr()))
        assert call["table"].shape == (2, graph_width(320, 8, 16))
        assert (call["table"][:, -(-max(kv_lens) // 16):] == case.pool.num_pages).all()  # past the pages: scratch
    assert len(ptrs) == 1
    assert be.kernel_info() == {"verify": "xqa"}


def test_graph_mode_past_max_q_len_runs_fa2(fake_fi):
    """Graph mode: a verify longer than max_q_len (XQA's buffers) takes the fa2 plans (the split rule's two)."""
    case = case_of([5, 5], [300, 120])
    be = backend(case, cuda_graph=True, max_batch_size=2, max_q_len=4, verify_split_kv="auto")
    assert be.graph_variants(5, False) == ("split", "whole")


@pytest.mark.parametrize("kw,match", [
    ({"page_size": 8}, "page size 8"),
    ({"page_size": 1}, "page size 1"),
    ({"kv_dtype": torch.float8_e5m2}, "KV dtype fp8_e5m2"),
])
def test_config_errors_for_what_xqa_cannot_run(fake_fi, kw, match):
    case = case_of([3], [40], **kw)
    with pytest.raises(ConfigError, match=f"verify_backend=xqa cannot run {match}.*verify_backend=fa2"):
        backend(case)


def test_config_errors_for_option_clashes(fake_fi):
    case = case_of([3], [40])
    with pytest.raises(ConfigError, match="verify_backend=xqa with verify_as_decode=auto: two plans"):
        backend(case, verify_as_decode="auto")
    with pytest.raises(ConfigError, match="verify_backend='xqb': choose from fa2, fa3, auto, xqa"):
        fi_backend(case, verify_backend="xqb")
    with pytest.raises(ConfigError, match="prefill_backend='xqa': choose from fa2, fa3, auto$"):
        fi_backend(case, prefill_backend="xqa")


@pytest.mark.parametrize("pdl", [None, True, False])
def test_xqa_pdl_reaches_the_launch(fake_fi, pdl):
    """xqa_pdl: XQA's enable_pdl as given (null: FlashInfer's default, which turns it on for sm_90+), the output the
    same."""
    case = case_of([3, 3], [70, 20])
    be = backend(case, **({} if pdl is None else {"xqa_pdl": pdl}))
    be.plan(case.meta)
    torch.testing.assert_close(run_all_layers(be, case), reference(case, case.meta, case.q), atol=2e-2, rtol=2e-2)
    assert XQA_CALLS and all(c["pdl"] is pdl for c in XQA_CALLS)


def test_xqa_pdl_is_checked(fake_fi):
    case = case_of([3], [40])
    with pytest.raises(ConfigError, match="flashinfer.xqa_pdl='yes': must be true, false or null"):
        backend(case, xqa_pdl="yes")
    with pytest.raises(ConfigError, match="xqa_pdl=false acts on XQA's launch only: add .*verify_backend=xqa"):
        fi_backend(case, xqa_pdl=False)


def test_a_flashinfer_without_xqa_is_a_config_error(fake_fi, monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer.decode", types.ModuleType("flashinfer.decode"))
    case = case_of([3], [40])
    with pytest.raises(ConfigError, match="has no xqa_batch_decode_with_kv_cache.*FlashInfer >= 0.7"):
        backend(case)


# -- GPU: the real XQA against the reference, eager and replayed from a CUDA graph ------------------------------

GPU_REASON = FlashInferBackend.available()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"flashinfer unavailable: {GPU_REASON}")
# Each (dtype, KV dtype, page size, head dim, GQA ratio, q_len) is a JIT module of its own, compiled on first use
# (experiments/xqa-verify/jit.py builds these in parallel first): SmolLM2's and Llama-8B's verify shapes at k = 4, an
# fp16, a page-64 and an e4m3 cell, SmolLM2 at q 9.
GPU_CELLS = [  # (gqa, head_dim, page_size, dtype, kv_dtype, q_len)
    (3, 64, 16, torch.bfloat16, None, 5),
    (4, 128, 16, torch.bfloat16, None, 5),
    (4, 128, 16, torch.float16, None, 5),
    (4, 128, 64, torch.bfloat16, None, 5),
    (4, 128, 16, torch.bfloat16, torch.float8_e4m3fn, 5),
    (3, 64, 16, torch.bfloat16, None, 9),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gqa,head_dim,page_size,dtype,kv_dtype,q_len", GPU_CELLS)
def test_gpu_xqa_eager_and_graph_attend_the_reference(gqa, head_dim, page_size, dtype, kv_dtype, q_len):
    """Eager: one pass of mixed lengths (kv = q_len, a page boundary, 4k) against the reference; graph mode: the pass
    captured, replayed equal to eager, then re-planned with other lengths and replayed equal to the reference."""
    kv_lens = [q_len, 4096, 33, page_size * 3]
    case = make_case(kv_lens=kv_lens, q_lens=[q_len] * 4, page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype, device="cuda", num_layers=2)
    # GPU_TOL's 2e-2 for every cell, the e4m3 one included (it passed there on an H200, 2026-12-05f, against the
    # reference on the same fp8 values: XQA's generic kernel widens the cache to the query's dtype)
    tol = 2e-2
    be = FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, dtype,
                           verify_backend="xqa")
    be.plan(case.meta)
    assert isinstance(be.active_plan, XqaPass)
    torch.testing.assert_close(run_all_layers(be, case), case.reference(), atol=tol, rtol=tol)
    gb = FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, dtype,
                           verify_backend="xqa", cuda_graph=True, max_batch_size=4, max_q_len=q_len, max_context=4200)
    q = case.q.clone()
    graph, outs = capture_layers(gb, case, q)
    assert isinstance(gb.active_plan, XqaPass)  # the graph captured XQA, not an fa2 fallback
    m2 = meta_over(case, [max(n - 7, q_len) for n in kv_lens], [q_len] * 4)
    q.copy_(torch.randn_like(q))
    gb.plan(m2)
    graph.replay()
    torch.testing.assert_close(torch.stack(outs).float(), reference(case, m2, q), atol=tol, rtol=tol)
