"""The ``flashinfer`` backend: CPU tests through a fake flashinfer module, GPU parity and CUDA graphs.

The fake wrappers check plan() arguments the way FlashInfer documents them and attend with exactly what
was planned (indptr / indices / last_page_len, causal bottom-right or the flattened custom mask); in CUDA-graph
mode they copy the plan into the caller-owned buffers and read it back from there, as the real ones do.
"""

from __future__ import annotations

import sys
import types
from typing import ClassVar

import pytest
import torch

from attnlab.backends.base import AttnMeta, Mode
from attnlab.backends.flashinfer import FlashInferBackend, decode_uses_tensor_cores, wrapper_kind
from attnlab.backends.registry import require_available
from attnlab.backends.torch_ref import TorchBackend, causal_mask, reference_attention
from attnlab.errors import BackendUnavailable, ConfigError
from attnlab.kvcache import build_layout
from tests.backends.cases import GPU_FULL_GRID as FULL
from tests.backends.cases import GPU_K as K
from tests.backends.cases import GPU_SHAPES as SHAPES
from tests.backends.cases import GPU_TOL as TOL
from tests.backends.cases import make_case

SMALL_WS = 1 << 16  # the fake never touches the workspace


class _FakeWrapper:
    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, **kw):
        assert workspace.dtype == torch.uint8 and kv_layout == "NHD"
        self.workspace, self.use_cuda_graph, self.init_kw = workspace, use_cuda_graph, kw
        self.plans = []
        self.created.append(self)

    def _store(self, qo, kv_indptr, indices, last, hq, hkv, d, ps, causal, mask, q_dtype, kv_dtype, scale):
        for t in (qo, kv_indptr, indices, last):
            assert t.dtype == torch.int32
        assert len(kv_indptr) == len(last) + 1 == len(qo) and len(indices) == int(kv_indptr[-1])
        if self.use_cuda_graph:  # as FlashInfer: copy into the caller's buffers (fixed batch), read from them
            b = self.bufs
            assert len(b["kv_indptr"]) == len(kv_indptr) and len(b["last"]) == len(last)
            b["kv_indptr"].copy_(kv_indptr)
            b["last"].copy_(last)
            b["indices"][:len(indices)].copy_(indices)
            if "qo" in b:
                b["qo"].copy_(qo)
            kv_indptr, last, indices = b["kv_indptr"], b["last"], b["indices"]
            qo = b.get("qo", qo)
            if mask is not None:
                assert self.init_kw.get("custom_mask_buf") is not None, "graph mode mask needs custom_mask_buf"
        self.plans.append({"hq": hq, "hkv": hkv, "d": d, "ps": ps, "causal": causal, "mask": mask is not None,
                           "q_dtype": q_dtype, "kv_dtype": kv_dtype})
        self.state = (qo, kv_indptr, indices, last, ps, causal, mask, q_dtype, scale)

    def run(self, q, paged_kv_cache, k_scale=None, v_scale=None):
        qo, kv_indptr, indices, last, ps, causal, mask, q_dtype, scale = self.state
        k_cache, v_cache = paged_kv_cache
        assert k_cache.dim() == 4 and k_cache.shape[1] == ps and q.dtype == q_dtype
        out = torch.zeros(q.shape, dtype=torch.float32)
        mask_off = 0
        for i in range(len(last)):
            pages = indices[int(kv_indptr[i]):int(kv_indptr[i + 1])].long()
            n = (len(pages) - 1) * ps + int(last[i]) if len(pages) else 0
            q0, q1 = int(qo[i]), int(qo[i + 1])
            kk = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]
            vv = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
            if mask is not None:
                m = mask[mask_off:mask_off + (q1 - q0) * n].view(q1 - q0, n)
                mask_off += (q1 - q0) * n
            elif causal:
                m = torch.arange(n)[None] <= torch.arange(q1 - q0)[:, None] + n - (q1 - q0)  # bottom-right
            else:
                m = torch.ones(q1 - q0, n, dtype=torch.bool)
            out[q0:q1] = reference_attention(q[q0:q1], kk, vv, m, scale)
        return out.to(q.dtype)


class FakeDecode(_FakeWrapper):
    created: ClassVar[list] = []

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None):
        super().__init__(workspace, kv_layout, use_cuda_graph)
        self.use_tensor_cores = use_tensor_cores
        self.bufs = {"kv_indptr": paged_kv_indptr_buffer, "indices": paged_kv_indices_buffer,
                     "last": paged_kv_last_page_len_buffer}

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode="NONE", q_data_type="float16", kv_data_type=None, sm_scale=None):
        qo = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
        self._store(qo, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                    False, None, q_data_type, kv_data_type, sm_scale)


class FakePrefill(_FakeWrapper):
    created: ClassVar[list] = []

    def __init__(self, workspace, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None):
        super().__init__(workspace, kv_layout, use_cuda_graph, custom_mask_buf=custom_mask_buf,
                         mask_indptr_buf=mask_indptr_buf)
        self.bufs = {"qo": qo_indptr_buf, "kv_indptr": paged_kv_indptr_buf, "indices": paged_kv_indices_buf,
                     "last": paged_kv_last_page_len_buf}

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, *, causal=False, custom_mask=None, q_data_type="float16",
             kv_data_type=None, sm_scale=None):
        if self.use_cuda_graph:  # as FlashInfer: a graph-mode prefill wrapper's row count is fixed by its first plan
            rows = int(qo_indptr[-1])
            self.rows = getattr(self, "rows", rows)
            if rows > self.rows:
                raise ValueError(f"The total number of rows in qo_indptr {rows} in cuda graph mode cannot exceed "
                                 f"the number of rows set during initialization {self.rows}.")
        self._store(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                    num_kv_heads, head_dim_qk, page_size, causal, custom_mask, q_data_type, kv_data_type, sm_scale)


@pytest.fixture
def fake_fi(monkeypatch):
    mod = types.ModuleType("flashinfer")
    mod.__version__ = "0.0.0+fake"
    FakeDecode.created, FakePrefill.created = [], []
    mod.BatchDecodeWithPagedKVCacheWrapper = FakeDecode
    mod.BatchPrefillWithPagedKVCacheWrapper = FakePrefill
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    return mod


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
    assert FlashInferBackend.flavor_info() == {"module": "flashinfer", "version": "0.0.0+fake"}


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
    be.plan(case.meta)
    eager = run_all_layers(be, case, q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture (JIT, lazy allocations)
        run_all_layers(be, case, q)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [be.run(q, layer) for layer in range(case.pool.num_layers)]
    graph.replay()
    torch.testing.assert_close(torch.stack(outs).float(), eager, atol=0, rtol=0)  # same kernels, same plan
    # next pass: same batch size, other lengths and queries -> re-plan outside the graph, replay
    kv2 = [n - (i % 3) for i, n in enumerate(kv_lens)]
    kv2 = [max(n, q_len) for n in kv2]
    m2 = meta_over(case, kv2, [q_len] * 8)
    q.copy_(torch.randn_like(q))
    be.plan(m2)
    graph.replay()
    torch.testing.assert_close(torch.stack(outs).float(), reference(case, m2, q), atol=2e-2, rtol=2e-2)
