"""The ``flashinfer`` backend: CPU tests through the fake flashinfer module of fakes.py (fixture ``fake_fi``),
GPU parity and CUDA graphs."""

from __future__ import annotations

import sys

import pytest
import torch

from attnlab.backends.base import AttnMeta, Mode
from attnlab.backends.flashinfer import (
    FlashInferBackend,
    decode_uses_tensor_cores,
    prefill_family,
    wrapper_kind,
)
from attnlab.backends.registry import get_backend_class, require_available
from attnlab.backends.torch_ref import TorchBackend, causal_mask
from attnlab.errors import BackendUnavailable, ConfigError
from attnlab.kvcache import build_layout
from tests.backends.cases import GPU_FULL_GRID as FULL
from tests.backends.cases import GPU_K as K
from tests.backends.cases import GPU_SHAPES as SHAPES
from tests.backends.cases import GPU_TOL as TOL
from tests.backends.cases import make_case
from tests.backends.fakes import FakeDecode, FakePrefill

SMALL_WS = 1 << 16  # the fake never touches the workspace


def cpu_case(q_lens, kv_lens, page_size=16, gqa=4, tree=False, mode=None, num_layers=2):
    return make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=gqa, head_dim=64,
                     dtype=torch.bfloat16, tree_mask=tree, mode=mode, num_layers=num_layers)


def backend(case, **kw):
    return FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                             case.q.dtype, workspace_bytes=kw.pop("workspace_bytes", SMALL_WS), **kw)


def run_all_layers(be, case, q=None):
    q = case.q if q is None else q
    return torch.stack([be.run(q, layer).float() for layer in range(case.pool.num_layers)])


def meta_over(case, kv_lens, q_lens, mode=None, custom_mask=None) -> AttnMeta:
    """A new pass over the same pool and page tables with other lengths (a rollback, a later draft step)."""
    lay = case.meta.layout
    ptr, idx = lay.kv_indptr.tolist(), lay.kv_indices.tolist()
    tables = [idx[ptr[i]:ptr[i + 1]] for i in range(len(kv_lens))]  # the first len(kv_lens) requests
    dev = lay.kv_indices.device
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    mode = mode or (Mode.DECODE if all(n == 1 for n in q_lens) else Mode.VERIFY)
    return AttnMeta(mode, torch.tensor(qo, dtype=torch.int32, device=dev),
                    build_layout(tables, kv_lens, case.meta.page_size, dev), list(q_lens), list(kv_lens),
                    case.meta.page_size, custom_mask)


def reference(case, meta, q):
    ref = case.backend(TorchBackend)
    ref.plan(meta)
    return torch.stack([ref.run(q.float(), layer) for layer in range(case.pool.num_layers)])


# -- availability and configuration (CPU) ------------------------------------------------------------------


def test_unavailable_without_flashinfer(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    reason = FlashInferBackend.available()
    assert "pip install 'attnlab[gpu]'" in reason
    with pytest.raises(BackendUnavailable, match="attnlab\\[gpu\\]"):
        require_available("flashinfer")
    assert FlashInferBackend.flavor_info()["version"] is None


def test_flavor_info(fake_fi):
    assert FlashInferBackend.flavor_info() == {"module": "flashinfer", "version": "0.7.2+fake"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_unavailable_without_cuda(fake_fi):
    assert "CUDA" in FlashInferBackend.available()


def test_capabilities():
    caps = FlashInferBackend.capabilities()
    assert caps.devices == {"cuda"} and caps.custom_mask and caps.page_sizes == "any"
    assert caps.cuda_graph == {Mode.DECODE, Mode.VERIFY} and caps.head_dims == {64, 128, 256}
    assert "dtype 'fp32'" in caps.problems(device="cuda", dtype="fp32", kv_dtype="bf16", head_dim=128,
                                             page_size=16, max_context=4096)[0]


def test_config_errors(fake_fi):
    case = cpu_case([1], [5])
    with pytest.raises(ConfigError, match="head_dim 96"):
        FlashInferBackend(case.pool, 8, 2, 96, 0.1, torch.bfloat16)
    with pytest.raises(ConfigError, match="fp32"):
        FlashInferBackend(case.pool, 8, 2, 64, 0.1, torch.float32)
    with pytest.raises(ConfigError, match="KV must match"):
        FlashInferBackend(case.pool, 8, 2, 64, 0.1, torch.float16)
    with pytest.raises(ConfigError, match="max_batch_size"):
        backend(case, cuda_graph=True)
    with pytest.raises(ConfigError, match="GQA ratio 5"):
        FlashInferBackend(case.pool, 10, 2, 64, 0.1, torch.bfloat16, decode_tensor_cores=False)


@pytest.mark.parametrize("hq,hkv,kv_dtype,override,expected", [
    (8, 8, torch.bfloat16, None, False), (6, 2, torch.bfloat16, None, False), (8, 2, torch.bfloat16, None, True),
    (32, 4, torch.float16, None, True), (8, 8, torch.float8_e4m3fn, None, True), (32, 4, torch.float16, False, False),
    (8, 8, torch.bfloat16, True, True),
])
def test_tensor_core_rule(hq, hkv, kv_dtype, override, expected):
    assert decode_uses_tensor_cores(hq, hkv, kv_dtype, override) is expected


# -- plan arguments and results through the fake (CPU) ----------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("kind,q_lens,kv_lens", [
    ("decode", [1, 1, 1], [1, 19, 40]),
    ("causal", [4, 4], [4, 33]),  # chain verify
    ("mask", [4, 4, 2], [4, 33, 9]),  # tree verify
    ("causal", [5, 1, 0, 3], [5, 20, 6, 3]),  # ragged prefill, one request without new tokens
])
def test_matches_reference_through_fake(fake_fi, page_size, gqa, kind, q_lens, kv_lens):
    case = cpu_case(q_lens, kv_lens, page_size=page_size, gqa=gqa, tree=kind == "mask",
                    mode=Mode.PREFILL if 0 in q_lens else None)
    be = backend(case)
    be.plan(case.meta)
    assert wrapper_kind(case.meta) == kind and be.active_plan.kind == kind
    out = run_all_layers(be, case)
    torch.testing.assert_close(out, case.reference(), atol=2e-2, rtol=2e-2)  # bf16 q and output
    created = FakeDecode.created if kind == "decode" else FakePrefill.created
    assert len(created) == 1 and not (FakePrefill.created if kind == "decode" else FakeDecode.created)
    p = created[0].plans[-1]
    assert (p["hq"], p["hkv"], p["d"], p["ps"]) == (2 * gqa, 2, 64, page_size)
    assert p["causal"] == (kind == "causal") and p["mask"] == (kind == "mask")
    assert p["q_dtype"] == p["kv_dtype"] == torch.bfloat16
    if kind == "decode":
        assert created[0].use_tensor_cores == (gqa >= 4)


def test_wrappers_kept_per_slot_and_reused(fake_fi):
    case = cpu_case([1, 1], [12, 30], num_layers=1)
    be = backend(case)
    lens = [[9, 27], [10, 28], [11, 29]]
    metas = [meta_over(case, kv, [1, 1]) for kv in lens]
    for _ in range(2):  # two speculative iterations: the same k+1 wrappers are re-planned
        be.plan(case.meta)
        be.plan_steps(metas)
        for i, m in enumerate(metas):
            be.use_step(i)
            torch.testing.assert_close(run_all_layers(be, case), reference(case, m, case.q), atol=2e-2, rtol=2e-2)
    assert len(FakeDecode.created) == 4 and all(len(w.plans) == 2 for w in FakeDecode.created)
    assert len({id(w.workspace) for w in FakeDecode.created}) == 1, "one workspace per backend"
    be.use_step(0)  # switching steps does no planning
    assert sum(len(w.plans) for w in FakeDecode.created) == 8


@pytest.mark.parametrize("kind", ["decode", "causal", "mask"])
def test_cuda_graph_mode_uses_caller_buffers(fake_fi, kind):
    q_lens = [1, 1, 1] if kind == "decode" else [3, 3, 3]
    case = cpu_case(q_lens, [20, 7, 33], tree=kind == "mask")
    be = backend(case, cuda_graph=True, max_batch_size=8, max_q_len=4, max_context=64)
    be.plan(case.meta)
    w = be.active_plan.wrapper
    assert w.use_cuda_graph
    assert len(w.bufs["kv_indptr"]) == 4 and len(w.bufs["last"]) == 3
    assert len(w.bufs["indices"]) == case.pool.num_pages + 1 + 8  # + 8 padded requests x 1 scratch page
    torch.testing.assert_close(run_all_layers(be, case), case.reference(), atol=2e-2, rtol=2e-2)
    # re-plan a shorter pass with the same batch size: same wrapper, same buffers
    kv2 = [17, 5, 30]
    mask2 = None
    if kind == "mask":
        mask2 = torch.cat([causal_mask(3, n).reshape(-1) for n in kv2])
    m2 = meta_over(case, kv2, q_lens, custom_mask=mask2)
    be.plan(m2)
    assert be.active_plan.wrapper is w
    torch.testing.assert_close(run_all_layers(be, case), reference(case, m2, case.q), atol=2e-2, rtol=2e-2)
    # another batch size is another bucket
    m3 = meta_over(case, kv2[:2], q_lens[:2], custom_mask=None if mask2 is None else mask2[:3 * 17 + 3 * 5])
    be.plan(m3)
    assert be.active_plan.wrapper is not w


def test_graph_mode_plans_ragged_passes_on_plain_wrappers(fake_fi):
    """A graph-mode backend still prefills ragged batches (plain wrappers); each uniform q_len gets its own
    graph wrapper, so a longer verify never re-plans a wrapper sized for a shorter one (H200 failure)."""
    case = cpu_case([2, 2], [20, 33])
    be = backend(case, cuda_graph=True, max_batch_size=4, max_q_len=8, max_context=64)
    prefill = meta_over(case, [20, 33], [20, 33], mode=Mode.PREFILL)
    q = torch.randn(53, case.num_q_heads, case.head_dim, generator=torch.Generator().manual_seed(0)).bfloat16()
    be.plan(prefill)
    assert not be.active_plan.wrapper.use_cuda_graph
    torch.testing.assert_close(run_all_layers(be, case, q), reference(case, prefill, q), atol=2e-2, rtol=2e-2)
    be.plan(case.meta)  # q_len 2 per request: a graph wrapper
    w2 = be.active_plan.wrapper
    assert w2.use_cuda_graph
    be.plan(meta_over(case, [20, 33], [5, 5]))  # q_len 5: another graph wrapper, no row-count error
    assert be.active_plan.wrapper is not w2 and be.active_plan.wrapper.use_cuda_graph


def test_graph_mask_capacity_error(fake_fi):
    case = cpu_case([3, 3], [20, 33], tree=True)
    be = backend(case, cuda_graph=True, max_batch_size=2, max_q_len=2, max_context=16)
    with pytest.raises(ConfigError, match="max_q_len / max_context"):
        be.plan(case.meta)


# -- kernel family per pass (fa2 for verify / short extends, auto for long prefills), options ---------------


@pytest.mark.parametrize("kind,max_q_len,expected", [
    ("causal", 5, "fa2"), ("causal", 511, "fa2"), ("causal", 512, "auto"), ("mask", 5, "fa2"), ("mask", 4096, "fa2"),
])
def test_prefill_family_rule(kind, max_q_len, expected):
    assert prefill_family(kind, max_q_len) == expected
    assert prefill_family("causal", max_q_len, verify_backend="auto", prefill_backend="fa2",
                          prefill_min_q_len=100) == ("fa2" if max_q_len >= 100 else "auto")


def test_verify_runs_fa2_long_prefill_auto_and_kernel_info(fake_fi):
    """Verify and a short prefill plan fa2 wrappers, a long prefill an auto one (the fake resolves it to fa3 as
    an H200 does); kernel_info says what each pass label resolved to."""
    case = cpu_case([3, 3], [20, 33])
    be = backend(case, prefill_min_q_len=16)
    be.plan(case.meta)  # verify, q_len 3
    assert be.active_plan.family == "fa2" and be.active_plan.wrapper._backend == "fa2"
    torch.testing.assert_close(run_all_layers(be, case), case.reference(), atol=2e-2, rtol=2e-2)
    long_ = meta_over(case, [20, 33], [20, 33], mode=Mode.PREFILL)  # max q_len 33 >= 16: long
    be.plan(long_)
    assert be.active_plan.family == "auto" and be.active_plan.wrapper._backend == "fa3"
    q = torch.randn(53, case.num_q_heads, case.head_dim, generator=torch.Generator().manual_seed(0)).bfloat16()
    torch.testing.assert_close(run_all_layers(be, case, q), reference(case, long_, q), atol=2e-2, rtol=2e-2)
    be.plan(meta_over(case, [20, 33], [4, 9], mode=Mode.PREFILL))  # short prefill (chunk): fa2
    assert be.active_plan.family == "fa2"
    be.plan(meta_over(case, [20, 33], [1, 1]))
    # GQA 4: tensor cores; the verify's KV (<= 33 tokens) is short for its grid: verify_split_kv=auto plans it whole
    assert be.kernel_info() == {"decode": "fa2", "prefill": "fa2+fa3", "verify": "fa2:whole"}
    gqa2 = cpu_case([1, 1], [20, 33], gqa=2)
    be2 = backend(gqa2)
    be2.plan(gqa2.meta)
    assert be2.kernel_info() == {"decode": "cuda-core"}  # GQA 2, bf16 KV: the CUDA-core decode kernel
    assert [w.init_kw for w in FakePrefill.created] and {w._backend for w in FakePrefill.created} == {"fa2", "fa3"}


def test_tree_mask_runs_fa2_even_when_verify_backend_is_auto(fake_fi):
    case = cpu_case([3, 3], [20, 33], tree=True)
    be = backend(case, verify_backend="auto")
    be.plan(case.meta)
    assert be.active_plan.family == "fa2" and be.kernel_info() == {"verify_tree": "fa2"}
    torch.testing.assert_close(run_all_layers(be, case), case.reference(), atol=2e-2, rtol=2e-2)


def test_old_mode_verify_backend_auto_resolves_like_before(fake_fi):
    case = cpu_case([3, 3], [20, 33])
    be = backend(case, verify_backend="auto")
    be.plan(case.meta)
    assert be.kernel_info() == {"verify": "fa3"}  # what attnlab ran before (FA3 template on Hopper)


@pytest.mark.parametrize("kind", ["decode", "causal", "mask"])
def test_graph_mode_passes_uniform_q_len_to_fa2(fake_fi, kind):
    q_lens = [1, 1, 1] if kind == "decode" else [3, 3, 3]
    case = cpu_case(q_lens, [20, 7, 33], tree=kind == "mask")
    be = backend(case, cuda_graph=True, max_batch_size=4, max_q_len=4, max_context=64)
    be.plan(case.meta)
    p = be.active_plan.wrapper.plans[-1]
    if kind != "decode":
        assert p["uniform_q_len"] == 3 and p["backend"] == "fa2"
    eager = backend(case)
    eager.plan(case.meta)
    if kind == "causal":
        assert eager.active_plan.wrapper.plans[-1]["uniform_q_len"] is None  # the hint is for graph mode only
    if kind == "mask":  # a uniform tree pass always runs a fixed-buffer (graph-mode) wrapper: its mask is ours
        assert eager.active_plan.wrapper.use_cuda_graph
        assert eager.active_plan.wrapper.plans[-1]["uniform_q_len"] == 3


def test_graph_mode_prefill_uses_plain_wrappers_without_hint(fake_fi):
    case = cpu_case([3, 3], [20, 33])
    be = backend(case, cuda_graph=True, max_batch_size=4, max_q_len=4, max_context=64)
    be.plan(meta_over(case, [20, 33], [20, 20], mode=Mode.PREFILL))  # uniform, but a prefill: never captured
    w = be.active_plan.wrapper
    assert not w.use_cuda_graph and w.plans[-1]["uniform_q_len"] is None


def test_fp8_kv_through_the_fake(fake_fi):
    """fp8 KV: kv_data_type is the pool's fp8 dtype, k_scale / v_scale reach run(), tensor-core decode."""
    for q_lens, kv_lens in (([1, 1], [20, 33]), ([3, 3], [20, 33])):
        case = make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=16, num_kv_heads=2, gqa=1, head_dim=64,
                         dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn)
        case.pool.k_scale, case.pool.v_scale = 0.5, 2.0
        be = backend(case)
        be.plan(case.meta)
        assert be.active_plan.wrapper.plans[-1]["kv_dtype"] == torch.float8_e4m3fn
        if q_lens[0] == 1:
            assert be.use_tensor_cores  # fp8 KV: the tensor-core decode, whatever the GQA ratio
        torch.testing.assert_close(run_all_layers(be, case), case.reference(), atol=2e-2, rtol=2e-2)


def test_capabilities_include_fp8_kv():
    caps = FlashInferBackend.capabilities()
    assert {"fp8_e4m3", "fp8_e5m2"} <= caps.kv_dtypes
    assert caps.problems(device="cuda", dtype="bf16", kv_dtype="fp8_e4m3", head_dim=128, page_size=16,
                         max_context=4096) == []


def test_options_bind_and_fail_one_line(fake_fi):
    cls = get_backend_class("flashinfer", {"verify_backend": "auto", "prefill_min_q_len": 64}, "verify.options")
    assert issubclass(cls, FlashInferBackend) and cls.name == "flashinfer"
    case = cpu_case([3, 3], [20, 33])
    be = cls(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.bfloat16,
             workspace_bytes=SMALL_WS)
    assert (be.verify_backend, be.prefill_min_q_len, be.prefill_backend) == ("auto", 64, "auto")
    for options, needle in [({"verify_backend": "fa4"}, "verify.options.verify_backend='fa4': choose from fa2, fa3"),
                            ({"prefil_backend": "fa2"}, "verify.options.prefil_backend: unknown option"),
                            ({"prefill_min_q_len": 0}, "verify.options.prefill_min_q_len=0: must be an int"),
                            ({"decode_tensor_cores": "yes"}, "decode_tensor_cores='yes'"),
                            ({"verify_split_kv": "no"},
                             "verify.options.verify_split_kv='no': must be auto, true or false")]:
        with pytest.raises(ConfigError) as e:
            get_backend_class("flashinfer", options, "verify.options")
        assert needle in str(e.value) and "\n" not in str(e.value)
    fp8 = make_case(kv_lens=[5], q_lens=[1], page_size=16, num_kv_heads=2, gqa=1, head_dim=64,
                    dtype=torch.bfloat16, kv_dtype=torch.float8_e5m2)
    with pytest.raises(ConfigError, match="fa3 with fp8 KV"):
        backend(fp8, prefill_backend="fa3")


@pytest.mark.parametrize("split", [True, False, "auto"])
def test_verify_split_kv_option_reaches_the_fa2_plan(fake_fi, split):
    """verify_split_kv=false (and auto, for a verify over 20-33 tokens): fa2 verify plans pass disable_split_kv
    (decode plans never do); the second graph-mode pass keeps the first's plan (a plan without split-KV has one
    schedule per rows and q_len; with it, the page counts are the same); the output is the reference's."""
    case = cpu_case([4, 4], [20, 33])
    be = backend(case, verify_split_kv=split, cuda_graph=True, max_batch_size=2)
    for _ in range(2):
        be.plan(case.meta)
        plan = be.active_plan.wrapper.plans[-1]
        assert plan["backend"] == "fa2" and plan["disable_split_kv"] is (split is not True)
    assert be.plan_counts() == (1, 1)
    assert be.active_plan.variant == ("whole" if split == "auto" else None)  # a graph per choice under auto only
    torch.testing.assert_close(run_all_layers(be, case), case.reference(), atol=2e-2, rtol=2e-2)


# -- GPU: parity vs the torch reference, CUDA graphs --------------------------------------------------------

GPU_REASON = FlashInferBackend.available()
needs_flashinfer_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"flashinfer unavailable: {GPU_REASON}")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def gpu_grid():
    """(shape, page_size, gqa, head_dim, dtype) points. Default: every (page size, gqa, head_dim, dtype) on
    b4_mixed plus every shape at (gqa 4, head_dim 128, bf16); ATTNLAB_GPU_GRID=full for the whole product."""
    combos = [(g, hd, dt) for g in (1, 3, 4, 8) for hd in (64, 128) for dt in DTYPES]
    return [(shape, ps, g, hd, dt) for shape in SHAPES for ps in (1, 16, 64) for g, hd, dt in combos
            if FULL or shape == "b4_mixed" or (g, hd, dt) == (4, 128, "bf16")]


@pytest.mark.gpu
@needs_flashinfer_gpu
@pytest.mark.parametrize("mode", ["decode", "verify", "tree"])
@pytest.mark.parametrize("shape,page_size,gqa,head_dim,dtype_name", gpu_grid())
def test_gpu_parity(mode, shape, page_size, gqa, head_dim, dtype_name):
    kv_lens = SHAPES[shape]
    if mode == "decode":
        q_lens = [1] * len(kv_lens)
    else:
        kv_lens = [max(n, K + 1) for n in kv_lens]
        q_lens = [K + 1] * len(kv_lens)
    dtype = DTYPES[dtype_name]
    case = make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=dtype, device="cuda", num_layers=2, tree_mask=mode == "tree")
    be = case.backend(FlashInferBackend)
    be.plan(case.meta)
    out = run_all_layers(be, case)
    torch.testing.assert_close(out, case.reference(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.gpu
@needs_flashinfer_gpu
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_gpu_draft_steps(tensor_cores):
    case = make_case(kv_lens=[40, 300, 7], q_lens=[1, 1, 1], page_size=16, num_kv_heads=2, gqa=4, head_dim=128,
                     dtype=torch.bfloat16, device="cuda")
    be = FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                           torch.bfloat16, decode_tensor_cores=tensor_cores)
    metas = [meta_over(case, [n - 3 + i for n in (40, 300, 7)], [1, 1, 1]) for i in range(4)]
    be.plan_steps(metas)
    for i, m in enumerate(metas):
        be.use_step(i)
        torch.testing.assert_close(run_all_layers(be, case), reference(case, m, case.q), atol=2e-2, rtol=2e-2)


def capture_layers(be, case, q):
    """Plan ``case.meta``, run every layer eagerly, warm up on a side stream (JIT, lazy allocations), capture run() of
    every layer with ``q`` a static buffer and replay it: the replay must equal eager bit for bit (same kernels, same
    plan). Returns (graph, the captured outputs)."""
    be.plan(case.meta)
    eager = run_all_layers(be, case, q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_all_layers(be, case, q)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [be.run(q, layer) for layer in range(case.pool.num_layers)]
    graph.replay()
    torch.testing.assert_close(torch.stack(outs).float(), eager, atol=0, rtol=0)
    return graph, outs


@pytest.mark.gpu
@needs_flashinfer_gpu
@pytest.mark.parametrize("mode", ["decode", "verify"])
@pytest.mark.parametrize("gqa", [1, 4])
def test_gpu_cuda_graph_capture_replay(mode, gqa):
    """Plan, capture run() of every layer, replay == eager; re-plan (same batch size) + replay == reference."""
    q_len = 1 if mode == "decode" else K + 1
    kv_lens = [37, 1000, 5, 260, 64, 9, 130, 17]
    case = make_case(kv_lens=kv_lens, q_lens=[q_len] * 8, page_size=16, num_kv_heads=2, gqa=gqa, head_dim=128,
                     dtype=torch.bfloat16, device="cuda", num_layers=3)
    be = FlashInferBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                           torch.bfloat16, cuda_graph=True, max_batch_size=8)
    q = case.q.clone()  # static input buffer
    graph, outs = capture_layers(be, case, q)
    # next pass: same batch size, other lengths and queries -> re-plan outside the graph, replay
    kv2 = [n - (i % 3) for i, n in enumerate(kv_lens)]
    kv2 = [max(n, q_len) for n in kv2]
    m2 = meta_over(case, kv2, [q_len] * 8)
    q.copy_(torch.randn_like(q))
    be.plan(m2)
    graph.replay()
    torch.testing.assert_close(torch.stack(outs).float(), reference(case, m2, q), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_flashinfer_gpu
def test_gpu_kernel_families():
    """On the GPU: verify and tree masks run fa2, a long prefill auto (fa3 on Hopper); each matches the
    reference; kernel_info reports what the wrappers resolved to."""
    case = make_case(kv_lens=[700, 1200], q_lens=[4, 4], page_size=16, num_kv_heads=2, gqa=4, head_dim=128,
                     dtype=torch.bfloat16, device="cuda", num_layers=2)
    be = case.backend(FlashInferBackend)
    be.plan(case.meta)
    torch.testing.assert_close(run_all_layers(be, case), case.reference(), atol=TOL[torch.bfloat16],
                               rtol=TOL[torch.bfloat16])
    prefill = meta_over(case, [700, 1200], [600, 1200], mode=Mode.PREFILL)
    q = torch.randn(1800, case.num_q_heads, case.head_dim, device="cuda").bfloat16()
    be.plan(prefill)
    torch.testing.assert_close(run_all_layers(be, case, q), reference(case, prefill, q), atol=TOL[torch.bfloat16],
                               rtol=TOL[torch.bfloat16])
    hopper = torch.cuda.get_device_capability()[0] == 9
    assert be.kernel_info() == {"verify": "fa2", "prefill": "fa3" if hopper else "fa2"}, be.kernel_info()
