"""The ``fa`` backend: CPU tests with FlashAttention mocked at the module boundary (fakes.py, fixture
``use_flavor``), GPU parity and CUDA graphs vs torch. If the adapter builds the fake's arguments wrong, the result
differs from the torch reference."""

from __future__ import annotations

import sys

import pytest
import torch

from attnlab.backends import flash_attn as fa_mod
from attnlab.backends.base import Mode
from attnlab.backends.flash_attn import FlashAttnBackend, detect_flash_attn
from attnlab.backends.registry import require_available
from attnlab.backends.torch_ref import TorchBackend
from attnlab.errors import BackendUnavailable, ConfigError
from tests.backends.cases import GPU_FULL_GRID as FULL
from tests.backends.cases import GPU_K as K
from tests.backends.cases import GPU_SHAPES as SHAPES
from tests.backends.cases import GPU_TOL as TOL
from tests.backends.cases import make_case
from tests.backends.fakes import MODULES, fake_fa_module


def cpu_case(flavor, q_lens, kv_lens, page_size=16, gqa=2, head_dim=64, tree=False):
    if flavor == "fa2":
        page_size = 256
    elif flavor == "fa3_fwd":
        page_size = max(kv_lens)
    return make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, tree_mask=tree)


def run_all_layers(be, case):
    be.plan(case.meta)
    return torch.stack([be.run(case.q, layer).float() for layer in range(case.pool.num_layers)])


# -- detection and availability (CPU) ---------------------------------------------------------------------


@pytest.mark.parametrize("present,expected", [(("fa3", "fa3_fwd", "fa2"), "fa3"), (("fa3_fwd", "fa2"), "fa3_fwd"),
                                              (("fa2",), "fa2")])
def test_detect_order(monkeypatch, present, expected):
    for name, module in MODULES.items():
        monkeypatch.setitem(sys.modules, module, fake_fa_module(name, []) if name in present else None)
    flavor = detect_flash_attn()
    assert flavor.name == expected and flavor.module == MODULES[expected]
    info = FlashAttnBackend.flavor_info()
    assert info["flavor"] == expected and info["version"].endswith(expected)


def test_unavailable_without_any_build(use_flavor):
    use_flavor(None)
    assert detect_flash_attn() is None
    reason = FlashAttnBackend.available()
    assert "pip install 'attnlab[gpu]'" in reason and "flash_attn_interface" in reason
    with pytest.raises(BackendUnavailable, match="attnlab\\[gpu\\]"):
        require_available("fa")
    assert FlashAttnBackend.flavor_info()["flavor"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_unavailable_without_cuda(use_flavor):
    use_flavor("fa3")
    assert "CUDA" in FlashAttnBackend.available()


@pytest.mark.parametrize("flavor,page_sizes,dtypes", [("fa3", "any", {"fp16", "bf16"}),
                                                      ("fa3_fwd", "contiguous", {"bf16"}),
                                                      ("fa2", "multiple:256", {"fp16", "bf16"})])
def test_capabilities_follow_flavor(use_flavor, flavor, page_sizes, dtypes):
    use_flavor(flavor)
    caps = FlashAttnBackend.capabilities()
    assert caps.page_sizes == page_sizes and caps.dtypes == dtypes and caps.devices == {"cuda"}
    assert not caps.custom_mask and caps.cuda_graph == {Mode.DECODE, Mode.VERIFY}
    assert caps.problems(device="cuda", dtype="bf16", kv_dtype="bf16", head_dim=128, page_size=256,
                         max_context=256) == []


# -- the adapter's index construction, checked through the fake (CPU) ------------------------------------


@pytest.mark.parametrize("flavor", ["fa3", "fa3_fwd", "fa2"])
@pytest.mark.parametrize("q_lens,kv_lens", [
    ([1, 1, 1], [1, 37, 300]),  # decode
    ([4, 4], [4, 290]),  # chain verify, k = 3
    ([5, 1, 3, 0, 1], [5, 40, 260, 7, 1]),  # ragged: groups by q_len, a request with no new token
])
@pytest.mark.parametrize("gqa", [1, 4])
def test_matches_reference_through_fake(use_flavor, flavor, q_lens, kv_lens, gqa):
    calls = use_flavor(flavor)
    case = cpu_case(flavor, q_lens, kv_lens, gqa=gqa)
    be = case.backend(FlashAttnBackend)
    assert be.flavor.name == flavor
    out = run_all_layers(be, case)
    torch.testing.assert_close(out, case.reference(), atol=2e-2, rtol=2e-2)  # bf16 q and output
    assert all(c["causal"] and c["scale"] == case.scale for c in calls)
    distinct = {n for n in q_lens if n}
    assert len(calls) == len(distinct), "one FA call per distinct q_len"


def test_page_table_contents(use_flavor):
    calls = use_flavor("fa3")
    case = cpu_case("fa3", [1, 1], [17, 40], page_size=16)
    run_all_layers(case.backend(FlashAttnBackend), case)
    lay = case.meta.layout
    idx, ptr = lay.kv_indices.tolist(), lay.kv_indptr.tolist()
    table = calls[0]["table"]
    assert table.shape == (2, 3)
    assert table[0, :2].tolist() == idx[ptr[0]:ptr[1]] and table[1].tolist() == idx[ptr[1]:ptr[2]]
    assert table[0, 2] == case.pool.num_pages  # padding points at the scratch page
    assert calls[0]["seqlens"].tolist() == [17, 40]


def test_contiguous_batch_idx_is_each_requests_page(use_flavor):
    calls = use_flavor("fa3_fwd")
    case = cpu_case("fa3_fwd", [1, 1, 1], [3, 64, 20])
    run_all_layers(case.backend(FlashAttnBackend), case)
    lay = case.meta.layout
    assert calls[0]["table"].tolist() == lay.kv_indices.tolist()  # one page per request, in order


def test_mode_prefill_is_causal(use_flavor):
    use_flavor("fa3")
    case = make_case(kv_lens=[9, 30], q_lens=[9, 30], page_size=4, num_kv_heads=1, gqa=3, head_dim=64,
                     dtype=torch.bfloat16, mode=Mode.PREFILL)
    out = run_all_layers(case.backend(FlashAttnBackend), case)
    torch.testing.assert_close(out, case.reference(), atol=2e-2, rtol=2e-2)


def test_errors_name_the_problem(use_flavor):
    use_flavor("fa3_fwd")
    case = make_case(kv_lens=[40], q_lens=[1], page_size=16, num_kv_heads=2, gqa=1, head_dim=64,
                     dtype=torch.bfloat16)
    be = case.backend(FlashAttnBackend)
    with pytest.raises(ConfigError, match="page_size >= max context"):
        be.plan(case.meta)
    with pytest.raises(ConfigError, match="dtype fp16"):
        make_case(kv_lens=[4], q_lens=[1], page_size=4, num_kv_heads=2, gqa=1, head_dim=64,
                  dtype=torch.float16).backend(FlashAttnBackend)
    use_flavor("fa3")
    tree = cpu_case("fa3", [3], [10], tree=True)
    with pytest.raises(ConfigError, match="tree"):
        tree.backend(FlashAttnBackend).plan(tree.meta)
    with pytest.raises(ConfigError, match="head_dim 80"):
        make_case(kv_lens=[4], q_lens=[1], page_size=4, num_kv_heads=2, gqa=1, head_dim=80,
                  dtype=torch.bfloat16).backend(FlashAttnBackend)
    use_flavor("fa2")
    with pytest.raises(ConfigError, match="multiple of 256"):
        make_case(kv_lens=[4], q_lens=[1], page_size=64, num_kv_heads=2, gqa=1, head_dim=64,
                  dtype=torch.bfloat16).backend(FlashAttnBackend)


# -- CUDA-graph mode: static buffers per (slot, batch, q_len) (CPU, through the fake) -------------------------


def padded_meta(case, reqs, q_len, pad_to, mode=Mode.VERIFY, device="cpu"):
    """A pass over requests ``reqs`` = [(request index in the case, kv_len)], padded to ``pad_to`` requests as
    ModelRunner.prepare pads a CUDA-graph bucket: dummy requests of q_len new tokens on the scratch page."""
    from attnlab.backends.base import AttnMeta
    from attnlab.kvcache import build_layout, pages_needed

    lay, ps = case.meta.layout, case.meta.page_size
    ptr, idx = lay.kv_indptr.tolist(), lay.kv_indices.tolist()
    tables = [idx[ptr[i]:ptr[i + 1]] for i, _ in reqs]
    n_pad = pad_to - len(reqs)
    tables += [[case.pool.num_pages] * pages_needed(q_len, ps)] * n_pad
    kv = [n for _, n in reqs] + [q_len] * n_pad
    qo = [i * q_len for i in range(pad_to + 1)]
    return AttnMeta(mode, torch.tensor(qo, dtype=torch.int32, device=device), build_layout(tables, kv, ps, device),
                    [q_len] * pad_to, kv, ps)


def torch_reference(case, meta, q):
    ref = case.backend(TorchBackend)
    ref.plan(meta)
    return torch.stack([ref.run(q.float(), layer) for layer in range(case.pool.num_layers)])


@pytest.mark.parametrize("flavor", ["fa3", "fa3_fwd", "fa2"])
@pytest.mark.parametrize("q_len", [1, 4])
def test_graph_mode_reuses_static_buffers(use_flavor, flavor, q_len):
    """Graph mode: a padded bucket of 4 plans into static buffers; a later pass (other lengths and requests)
    rewrites the same buffers, every call reads them, and both passes match the reference on the real rows."""
    calls = use_flavor(flavor)
    kv_lens = [q_len + 40, q_len + 290, q_len + 7]
    case = cpu_case(flavor, [q_len] * 3, kv_lens)
    max_context = case.meta.page_size if flavor == "fa3_fwd" else 512
    be = FlashAttnBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                          torch.bfloat16, cuda_graph=True, max_batch_size=4, max_q_len=8, max_context=max_context)
    mode = Mode.DECODE if q_len == 1 else Mode.VERIFY
    q = torch.randn(4 * q_len, case.num_q_heads, case.head_dim, generator=torch.Generator().manual_seed(1)).bfloat16()
    for reqs in ([(0, kv_lens[0]), (1, kv_lens[1])], [(2, kv_lens[2]), (0, kv_lens[0] - 3), (1, kv_lens[1])]):
        be.plan(padded_meta(case, reqs, q_len, 4, mode))
        out = torch.stack([be.run(q, layer).float() for layer in range(case.pool.num_layers)])
        assert torch.isfinite(out).all()  # dummy rows read the scratch page: finite, ignored
        rows = len(reqs) * q_len
        ref = torch_reference(case, padded_meta(case, reqs, q_len, len(reqs), mode), q[:rows])
        torch.testing.assert_close(out[:, :rows], ref, atol=2e-2, rtol=2e-2)
    assert len({c["ptrs"] for c in calls}) == 1, "every call reads the same static table / seqlens buffers"
    assert calls[-1]["seqlens"].tolist() == [kv_lens[2], kv_lens[0] - 3, kv_lens[1], q_len]
    if flavor != "fa3_fwd":  # the table's width is fixed by max_context, not by this pass
        assert calls[-1]["table"].shape == (4, -(-512 // case.meta.page_size))


def test_graph_mode_ragged_and_prefill_passes_plan_as_usual(use_flavor):
    calls = use_flavor("fa3")
    case = cpu_case("fa3", [5, 1, 3], [5, 40, 260])
    be = FlashAttnBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale,
                          torch.bfloat16, cuda_graph=True, max_batch_size=4, max_context=512)
    out = run_all_layers(be, case)
    torch.testing.assert_close(out, case.reference(), atol=2e-2, rtol=2e-2)
    assert not be._static and len(calls) == 3 * case.pool.num_layers  # one call per q_len group, nothing static


# -- GPU parity vs the torch reference --------------------------------------------------------------------

GPU_REASON = FlashAttnBackend.available()


def fa_gpu_grid():
    """(shape, page_size, gqa, head_dim, dtype) points. Default: every (page size, gqa, head_dim, dtype) on
    b4_mixed plus every shape at one point; ATTNLAB_GPU_GRID=full for the whole product."""
    combos = [(g, hd, dt) for g in (1, 3, 4, 8) for hd in (64, 128) for dt in ("bf16", "fp16")]
    pts = []
    for shape in SHAPES:
        for ps in ("p1", "p16", "p64"):
            for g, hd, dt in combos:
                if FULL or shape == "b4_mixed" or (g, hd, dt) == (4, 128, "bf16"):
                    pts.append((shape, ps, g, hd, dt))
    return pts


def flavor_page_size(flavor, ps_name, kv_lens):
    if flavor.page_sizes == "contiguous":
        return max(kv_lens)
    if flavor.page_sizes.startswith("multiple:"):
        return int(flavor.page_sizes.split(":")[1])
    return int(ps_name[1:])


@pytest.mark.gpu
@pytest.mark.skipif(GPU_REASON is not None, reason=f"fa backend unavailable: {GPU_REASON}")
@pytest.mark.parametrize("mode", ["decode", "verify", "prefill_ragged"])
@pytest.mark.parametrize("shape,ps_name,gqa,head_dim,dtype_name", fa_gpu_grid())
def test_gpu_parity(mode, shape, ps_name, gqa, head_dim, dtype_name):
    flavor = detect_flash_attn()
    if dtype_name not in flavor.dtypes:
        pytest.skip(f"{flavor.module} has no {dtype_name}")
    if flavor.page_sizes != "any" and ps_name != "p16":
        pytest.skip(f"{flavor.name}: one page size only ({flavor.page_sizes})")
    kv_lens = SHAPES[shape]
    if mode == "decode":
        q_lens = [1] * len(kv_lens)
    elif mode == "verify":
        kv_lens = [max(n, K + 1) for n in kv_lens]
        q_lens = [K + 1] * len(kv_lens)
    else:  # a prefill chunk per request, lengths differ: exercises the q_len grouping
        if shape in ("b1_32k", "b64"):
            pytest.skip("ragged prefill: b1_short / b4_mixed suffice")
        q_lens = [min(n, 1 + i % 3 * 7) for i, n in enumerate(kv_lens)]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    case = make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=flavor_page_size(flavor, ps_name, kv_lens),
                     num_kv_heads=2, gqa=gqa, head_dim=head_dim, dtype=dtype, device="cuda", num_layers=2,
                     mode=Mode.PREFILL if mode == "prefill_ragged" else None)
    out = run_all_layers(case.backend(FlashAttnBackend), case)
    torch.testing.assert_close(out, case.reference(), atol=TOL[dtype], rtol=TOL[dtype])


def test_module_imports_without_flash_attn(use_flavor):
    use_flavor(None)
    assert fa_mod.FlashAttnBackend.name == "fa"


@pytest.mark.gpu
@pytest.mark.skipif(GPU_REASON is not None, reason=f"fa backend unavailable: {GPU_REASON}")
@pytest.mark.parametrize("q_len", [1, K + 1], ids=["decode", "verify"])
def test_gpu_cuda_graph_replay_equals_eager(q_len):
    """Capture run() of every layer for a padded bucket of 8 after one plan; replay == eager bit for bit; plan a
    later pass (other lengths, same bucket) outside the graph, replay == the torch reference."""
    flavor = detect_flash_attn()
    dtype = torch.bfloat16
    kv_lens = [37, 1000, 5, 260, 64, 9, 130, 17]
    kv_lens = [max(n, q_len) for n in kv_lens]
    ps = flavor_page_size(flavor, "p16", [1024])  # contiguous: one 1024-token page per request
    case = make_case(kv_lens=kv_lens, q_lens=[q_len] * 8, page_size=ps, num_kv_heads=2, gqa=4, head_dim=128,
                     dtype=dtype, device="cuda", num_layers=3, mode=Mode.DECODE if q_len == 1 else Mode.VERIFY)
    be = FlashAttnBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, dtype,
                          cuda_graph=True, max_batch_size=8, max_q_len=K + 1, max_context=1024)
    q = case.q.clone()  # static input buffer
    be.plan(case.meta)
    eager = torch.stack([be.run(q, layer).float() for layer in range(case.pool.num_layers)])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture (lazy allocations, FA's scheduler metadata)
        for layer in range(case.pool.num_layers):
            be.run(q, layer)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [be.run(q, layer) for layer in range(case.pool.num_layers)]
    graph.replay()
    torch.testing.assert_close(torch.stack(outs).float(), eager, atol=0, rtol=0)  # same kernels, same plan
    mode = Mode.DECODE if q_len == 1 else Mode.VERIFY
    reqs = [(i, max(n - 1 - i % 3, q_len)) for i, n in enumerate(kv_lens)]
    m2 = padded_meta(case, reqs, q_len, 8, mode, device="cuda")
    q.copy_(torch.randn_like(q))
    be.plan(m2)
    graph.replay()
    tol = TOL[dtype]
    torch.testing.assert_close(torch.stack(outs).float(), torch_reference(case, m2, q), atol=tol, rtol=tol)
