"""flashinfer's verify_as_decode (CPU, through the fake module; GPU at the end): a uniform causal verify / short extend
runs as FlashInfer decode requests, one a query row (attnlab.backends.flashinfer_rows), against the torch reference."""

import pytest
import torch

from attnlab.backends import flashinfer_rows as rows_mod
from attnlab.backends.base import Mode
from attnlab.backends.flashinfer import FlashInferBackend, verify_as_rows
from attnlab.backends.flashinfer_rows import rows_layout
from attnlab.errors import ConfigError
from tests.backends.cases import make_case
from tests.backends.fakes import FakeDecode, FakePrefill
from tests.backends.test_flashinfer import backend as fi_backend
from tests.backends.test_flashinfer import meta_over, reference, run_all_layers

ROWS = {"verify_as_decode": True}


def backend(case, **kw):
    return fi_backend(case, **{**ROWS, **kw})


def case_of(q_lens, kv_lens, page_size=16, gqa=3, head_dim=64, num_kv_heads=2):
    return make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=num_kv_heads, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, num_layers=2, mode=Mode.VERIFY)


def test_rows_layout_by_hand():
    """Two requests of 3 new tokens, page 4: request 0 (kv 6, pages at slots 0-1) gives rows of 4 / 5 / 6 tokens,
    request 1 (kv 3, its page at slot 2) rows of 1 / 2 / 3; each row's page ids are a prefix of its request's."""
    indptr, last, gather = rows_layout([6, 3], 3, 4)
    assert indptr.tolist() == [0, 1, 3, 5, 6, 7, 8]
    assert last.tolist() == [4, 1, 2, 1, 2, 3]
    assert gather.tolist() == [0, 0, 1, 0, 1, 2, 2, 2]
    assert indptr.dtype == last.dtype == torch.int32


def naive_rows(kv_lens, q_len, ps):
    indptr, last, gather, base = [0], [], [], 0
    for n in kv_lens:
        for i in range(q_len):
            length = n - q_len + 1 + i
            p = (length + ps - 1) // ps
            gather += [base + j for j in range(p)]
            indptr.append(indptr[-1] + p)
            last.append(length - (p - 1) * ps)
        base += (n + ps - 1) // ps
    return indptr, last, gather


@pytest.mark.parametrize("list_max", [0, 1 << 30])
def test_rows_layout_matches_a_naive_build_on_both_paths(monkeypatch, list_max):
    """The host-tensor path (large passes) and the list path (small ones) against a per-row build, over page sizes 1
    to 64, q_len 1 to 9, rows ending on a page boundary, kv_len = q_len and random batches."""
    monkeypatch.setattr(rows_mod, "LIST_MAX_IDS", list_max)
    g = torch.Generator().manual_seed(0)
    for ps in (1, 3, 4, 16, 64):
        for q in (1, 2, 5, 9):
            for _ in range(12):
                b = int(torch.randint(1, 6, (1,), generator=g))
                kv = [q + int(x) for x in torch.randint(0, 3 * ps + 5, (b,), generator=g)]
                kv[0] = q + ps - 1 if ps > 1 else q  # a row ending on a page boundary, or kv = q
                got = rows_layout(kv, q, ps)
                assert [t.tolist() for t in got] == list(naive_rows(kv, q, ps)), (ps, q, kv)


@pytest.mark.parametrize("kv_lens,q_len", [([2, 9], 3), ([5], 0)])
def test_rows_layout_refuses_a_request_without_its_new_tokens(kv_lens, q_len):
    with pytest.raises(ValueError, match="must each hold"):
        rows_layout(kv_lens, q_len, 16)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("gqa", [1, 3, 4])
@pytest.mark.parametrize("q_len,kv_lens", [(2, [2, 40]), (5, [5, 33, 200]), (4, [17])])
def test_eager_rows_attend_the_reference(fake_fi, page_size, gqa, q_len, kv_lens):
    """Eager plans: one decode wrapper over batch x q_len rows (row i of a request: its first kv - q + 1 + i
    tokens), equal to the reference's bottom-right causal verify; no prefill wrapper is made; kernel_info names
    the rows plan (the CUDA-core decode below GQA 4, the tensor-core one from 4)."""
    case = case_of([q_len] * len(kv_lens), kv_lens, page_size=page_size, gqa=gqa)
    be = backend(case)
    be.plan(case.meta)
    plan = be.active_plan
    assert isinstance(plan.wrapper, FakeDecode) and plan.batch_size == q_len * len(kv_lens)
    torch.testing.assert_close(run_all_layers(be, case), reference(case, case.meta, case.q), atol=2e-2, rtol=2e-2)
    assert not FakePrefill.created
    assert be.kernel_info() == {"verify": ("fa2" if gqa >= 4 else "cuda-core") + ":rows"}


def test_graph_mode_rows_keep_one_wrapper_a_bucket_and_follow_new_lengths(fake_fi):
    """cuda_graph=True: a bucket's rows wrapper is built once over the slot's rows buffers (sized max_batch_size x
    max_q_len rows), re-planned every pass (lengths crossing pages, a padded request of kv = q_len), each pass equal
    to the reference; there is one plan variant even under verify_split_kv=auto."""
    case = case_of([5, 5], [900, 400])
    be = backend(case, cuda_graph=True, max_batch_size=2, max_q_len=8, max_context=1024, verify_split_kv="auto")
    assert be.graph_variants(5, False) == be.graph_variants(1, False) == be.graph_variants(5, True) == (None,)
    assert backend(case, cuda_graph=True, max_batch_size=2, max_q_len=4, verify_split_kv="auto").graph_variants(
        5, False) == ("split", "whole")  # past max_q_len: no rows, the split rule's two plans
    g = torch.Generator().manual_seed(5)
    wrappers = set()
    for kv_lens in ([900, 400], [17, 5], [300, 301], [5, 64]):
        meta = meta_over(case, kv_lens, [5, 5])
        be.plan(meta)
        wrappers.add(id(be.active_plan.wrapper))
        assert be.slot_variant(0) is None
        q = torch.randn(10, case.num_q_heads, case.head_dim, generator=g).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=2e-2, rtol=2e-2)
    assert len(wrappers) == 1 and be.plan_counts() == (4, 0)
    w = be.active_plan.wrapper
    assert w.use_cuda_graph and w.bufs["kv_indptr"].numel() == 11  # the bucket's 10 rows, in the rows buffers
    assert be._buffers(0, rows=True).kv_indptr.numel() == 2 * 8 + 1


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_graph_mode_rows_keep_plans_of_one_schedule(fake_fi, page_size):
    """Graph mode: a rows pass whose rows' schedule (the CUDA-core decode's, of their page counts) equals the one its
    wrapper holds writes only the rows' layout; lengths grow by 0-2 tokens a pass (pages crossed on the way), every
    pass equals the reference (the fake's kernel asserts no chunk starts past a row's length), most are kept, and
    every real plan agreed with the model."""
    case = case_of([5, 5, 5], [170, 60, 110], page_size=page_size)
    be = backend(case, cuda_graph=True, max_batch_size=4, max_q_len=8, max_context=200)
    g = torch.Generator().manual_seed(page_size)
    lens = [120, 10, 60]
    for _ in range(24):
        meta = meta_over(case, lens, [5, 5, 5])
        be.plan(meta)
        assert be.active_plan.family == "rows"
        q = torch.randn(15, case.num_q_heads, case.head_dim, generator=g).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=2e-2, rtol=2e-2)
        lens = [n + int(torch.randint(0, 3, (1,), generator=g)) for n in lens]
    made, kept = be.plan_counts()
    assert made + kept == 24 and kept >= 12 and be._schedule_model_ok, (made, kept)
    assert made == sum(len(w.plans) for w in FakeDecode.created)
    eager = backend(case)  # no graphs: every pass plans
    for n in range(3):
        eager.plan(meta_over(case, [100 + n, 20, 50], [5, 5, 5]))
    assert eager.plan_counts() == (3, 0)


def test_rows_buckets_and_decode_passes_share_the_schedule_model_and_slot_buffers(fake_fi):
    """Graph mode: rows passes of 15, 10 and 3 rows (3 x 5, 2 x 5, 1 x 3) and decode passes of batch 3 (3 rows, the
    model learned for 3 rows is theirs and the 1 x 3 rows') interleave over growing lengths: every pass equals the
    reference (the rows' buckets rewrite the slot's shared rows buffers between kept passes), the model agrees with
    every real plan, and each wrapper keeps plans."""
    case = case_of([5, 5, 5], [170, 60, 110])
    be = backend(case, cuda_graph=True, max_batch_size=4, max_q_len=8, max_context=200)
    g = torch.Generator().manual_seed(11)
    lens = [100, 30, 60]
    passes = [(3, 5), (2, 5), (3, 1), (1, 3)]
    for i in range(32):
        batch, q = passes[i % 4]
        meta = meta_over(case, lens[:batch], [q] * batch, Mode.DECODE if q == 1 else Mode.VERIFY)
        be.plan(meta)
        assert be.active_plan.family == ("decode" if q == 1 else "rows")
        x = torch.randn(batch * q, case.num_q_heads, case.head_dim, generator=g).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, x), reference(case, meta, x), atol=2e-2, rtol=2e-2)
        lens = [n + int(torch.randint(0, 2, (1,), generator=g)) for n in lens]
    made, kept = be.plan_counts()
    assert be._schedule_model_ok and set(be._schedules) == {15, 10, 3} and kept >= 16, (made, kept)


def test_graph_mode_rows_on_the_tensor_core_decode_plan_every_pass(fake_fi):
    """GQA 4 (the tensor-core decode plans on token lengths): graph-mode rows never keep a plan."""
    case = case_of([5, 5], [170, 60], gqa=4)
    be = backend(case, cuda_graph=True, max_batch_size=2, max_q_len=8, max_context=200)
    for n in range(4):
        be.plan(meta_over(case, [100 + n, 30], [5, 5]))
        assert be.active_plan.family == "rows"
    assert be.use_tensor_cores and be.plan_counts() == (4, 0)


def test_rows_leave_other_passes_to_their_plans(fake_fi):
    """Decode passes, uniform prefills, a q_len-1 verify-mode pass, a pass of prefill_min_q_len tokens (a long
    prefill's), tree masks and (graph mode) a q_len past max_q_len keep FlashInfer's own plans."""
    case = case_of([5, 5], [400, 400])
    eager = backend(case, prefill_min_q_len=32)
    graph = backend(case, cuda_graph=True, max_batch_size=2, max_q_len=4, max_context=1024, prefill_min_q_len=32)
    for be in (eager, graph):
        for meta in (meta_over(case, [40, 30], [1, 1]), meta_over(case, [40, 30], [1, 1], mode=Mode.VERIFY),
                     meta_over(case, [40, 40], [20, 20], mode=Mode.PREFILL),
                     meta_over(case, [40, 40], [32, 32], mode=Mode.VERIFY)):
            be.plan(meta)
            assert be.active_plan.family != "rows", (be.cuda_graph, meta.mode, meta.q_lens)
        be.plan(meta_over(case, [40, 40], [31, 31] if be is eager else [4, 4], mode=Mode.VERIFY))
        assert be.active_plan.family == "rows"  # the bounds themselves: the longest q_len that is rows
    graph.plan(meta_over(case, [40, 30], [5, 5]))  # q_len 5 > max_q_len 4: no rows buffers for it
    assert graph.active_plan.family == "fa2"
    tree = make_case(kv_lens=[40, 30], q_lens=[5, 5], page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                     dtype=torch.bfloat16, tree_mask=True, mode=Mode.VERIFY)
    be = backend(tree)
    be.plan(tree.meta)
    assert be.active_plan.kind == "mask"


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("graphs", [False, True])
def test_rows_over_fp8_kv_attend_the_reference(fake_fi, kv_dtype, graphs):
    """fp8 KV: the rows plan names the pool's KV dtype and the run passes its scales (the tensor-core decode)."""
    case = make_case(kv_lens=[40, 21], q_lens=[5, 5], page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                     dtype=torch.bfloat16, kv_dtype=kv_dtype, num_layers=2, mode=Mode.VERIFY)
    kw = {"cuda_graph": True, "max_batch_size": 2, "max_context": 64} if graphs else {}
    be = backend(case, **kw)
    be.plan(case.meta)
    assert be.active_plan.family == "rows" and be.active_plan.wrapper.plans[-1]["kv_dtype"] == kv_dtype
    torch.testing.assert_close(run_all_layers(be, case), reference(case, case.meta, case.q), atol=2e-2, rtol=2e-2)
    assert be.kernel_info() == {"verify": "fa2:rows"}


def test_a_graph_bucket_past_the_rows_buffers_is_refused(fake_fi):
    case = case_of([3, 3, 3], [30, 30, 30])
    be = backend(case, cuda_graph=True, max_batch_size=2, max_q_len=4)
    with pytest.raises(ConfigError, match="batch 9 > max_batch_size 2 x max_q_len 4 decode rows"):
        be.plan(case.meta)


@pytest.mark.parametrize("value", ["yes", 1, None, "Auto"])
def test_verify_as_decode_takes_a_bool_or_auto(fake_fi, value):
    for ok in (True, False, "auto"):
        FlashInferBackend.check_options({"verify_as_decode": ok}, "verify.options")
    with pytest.raises(ConfigError, match="verify.options.verify_as_decode=.*must be auto, true or false"):
        FlashInferBackend.check_options({"verify_as_decode": value}, "verify.options")


def test_the_auto_rule_by_hand():
    """verify_as_rows: the rows read q_len x the batch's kv tokens x head_dim elements, at most 512K, at batch <= 4 and
    the longest request >= 256 tokens: SmolLM2 (head_dim 64) at batch 1 and q 5 up to 1,638 tokens, at q 9 up to 910;
    Llama-8B (128) at q 5 up to 819; two requests share the bound; none past batch 4 or under 256 tokens."""
    assert verify_as_rows(1638, 64, 1, 5, 1638) and not verify_as_rows(1639, 64, 1, 5, 1639)
    assert verify_as_rows(910, 64, 1, 9, 910) and not verify_as_rows(911, 64, 1, 9, 911)
    assert verify_as_rows(819, 128, 1, 5, 819) and not verify_as_rows(820, 128, 1, 5, 820)
    assert verify_as_rows(2 * 819, 64, 2, 5, 819) and not verify_as_rows(2 * 819 + 1, 64, 2, 5, 820)
    assert verify_as_rows(256, 64, 1, 5, 256) and not verify_as_rows(255, 64, 1, 5, 255)  # ROWS_MIN_KV
    assert verify_as_rows(300 + 3 * 5, 64, 4, 5, 300)  # a bucket of 4: one request, three dummies of q_len
    assert not verify_as_rows(5 * 256, 64, 5, 5, 256)  # past ROWS_MAX_BATCH: never


def test_auto_takes_the_rows_where_the_batch_k_is_small(fake_fi):
    """verify_as_decode=auto, eager: the rows where the rule says so (5 x 1,638 tokens x 64 at most, a request of
    >= 256), verify_split_kv's fa2 plans elsewhere (here split, then whole), every pass equal to the reference;
    kernel_info names the plans the passes took."""
    case = case_of([5, 5], [2000, 400])
    be = backend(case, verify_as_decode="auto")
    g = torch.Generator().manual_seed(2)
    for kv_lens, family in (([300, 21], "rows"), ([1617, 21], "rows"), ([1618, 21], "fa2"), ([255, 21], "fa2"),
                            ([1200, 400], "rows"), ([2000, 21], "fa2")):
        meta = meta_over(case, kv_lens, [5, 5])
        be.plan(meta)
        assert be.active_plan.family == family and be.slot_variant(0) is None, kv_lens
        q = torch.randn(10, case.num_q_heads, case.head_dim, generator=g).bfloat16()
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=2e-2, rtol=2e-2)
    assert be.kernel_info() == {"verify": "cuda-core:rows+fa2+fa2:whole"}


def test_auto_in_graph_mode_is_a_plan_variant_of_the_small_buckets(fake_fi):
    """CUDA-graph mode: "rows" is a third plan variant (a graph each) in buckets where the rule can hold; a capture
    forces each variant whatever the lengths; a pass takes the one its lengths say. verify_as_decode=true has one
    variant, and with verify_split_kv fixed the fa2 plan is the "prefill" variant."""
    case = case_of([5, 5], [3000, 21])
    kw = {"cuda_graph": True, "max_batch_size": 16, "max_q_len": 8, "max_context": 4096}
    be = backend(case, verify_as_decode="auto", **kw)
    assert be.graph_variants(5, False, 1) == be.graph_variants(5, False) == ("split", "whole", "rows")
    assert be.graph_variants(5, False, 8) == ("split", "whole")  # past ROWS_MAX_BATCH
    fixed = backend(case, verify_as_decode="auto", verify_split_kv=False, **kw)
    assert fixed.graph_variants(5, False, 4) == ("prefill", "rows") and fixed.graph_variants(5, False, 8) == (
        "prefill",)  # the fa2 plan is a named variant in every bucket, as make_plan names it
    assert be.graph_variants(1, False, 1) == be.graph_variants(5, True, 1) == (None,)  # decode, tree masks
    assert be.graph_variants(9, False, 1) == ("split", "whole")  # past max_q_len: no rows buffers for it
    assert backend(case, verify_as_decode=True, **kw).graph_variants(5, False, 1) == (None,)
    short, long = meta_over(case, [300, 21], [5, 5]), meta_over(case, [3000, 21], [5, 5])
    for variant in ("split", "whole", "rows"):
        for meta in (short, long):
            with be.forcing(variant):
                be.plan(meta)
            assert be.slot_variant(0) == variant
            assert be.active_plan.family == ("rows" if variant == "rows" else "fa2")
    assert be.kernel_info() == {}  # forced plans are a capture's, not a pass's
    be.plan(short)
    assert be.slot_variant(0) == "rows"
    be.plan(long)
    assert be.slot_variant(0) == "split"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("gqa,head_dim,page_size", [(3, 64, 16), (4, 128, 16), (3, 64, 1)])
def test_gpu_rows_attend_the_reference(gqa, head_dim, page_size):
    """The real FlashInfer: graph-mode rows wrappers (the CUDA-core decode at GQA 3, the tensor-core one at 4) over
    lengths that cross pages and a request of kv = q_len, each pass equal to the reference."""
    if why := FlashInferBackend.available():
        pytest.skip(why)
    from tests.backends.cases import GPU_TOL

    case = make_case(kv_lens=[1500, 1500, 1500], q_lens=[5] * 3, page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, device="cuda", num_layers=2, mode=Mode.VERIFY)
    be = FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                           torch.bfloat16, cuda_graph=True, max_batch_size=3, max_context=2048, **ROWS)
    g = torch.Generator(device="cuda").manual_seed(gqa)
    for kv_lens in ([100, 7, 300], [1500, 5, 900], [250, 240, 9]):
        meta = meta_over(case, kv_lens, [5] * 3)
        be.plan(meta)
        assert be.active_plan.family == "rows"
        q = torch.randn(15, case.num_q_heads, case.head_dim, device="cuda", generator=g).bfloat16()
        tol = GPU_TOL[torch.bfloat16]
        torch.testing.assert_close(run_all_layers(be, case, q), reference(case, meta, q), atol=tol, rtol=tol)
    assert be.use_tensor_cores == (gqa >= 4)
    assert be.kernel_info() == {"verify": ("fa2" if gqa >= 4 else "cuda-core") + ":rows"}
