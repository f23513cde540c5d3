"""The ``fa`` backend: CPU tests with FlashAttention mocked at the module boundary, GPU parity vs torch.

The CPU fake is a module that stands in for ``flash_attn_interface`` / ``fa3_fwd_interface`` / ``flash_attn``:
its ``flash_attn_with_kvcache`` checks argument shapes and dtypes the way the real one documents them and
computes attention from exactly what it was given (page_table / block_table / cache_batch_idx,
cache_seqlens, FA's bottom-right causal rule). If the adapter builds any of those wrong, the result differs
from the torch reference.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from attnlab.backends import flash_attn as fa_mod
from attnlab.backends.base import Mode
from attnlab.backends.flash_attn import FlashAttnBackend, detect_flash_attn
from attnlab.backends.registry import require_available
from attnlab.backends.torch_ref import reference_attention
from attnlab.errors import BackendUnavailable, ConfigError
from tests.backends.cases import GPU_FULL_GRID as FULL
from tests.backends.cases import GPU_K as K
from tests.backends.cases import GPU_SHAPES as SHAPES
from tests.backends.cases import GPU_TOL as TOL
from tests.backends.cases import make_case

MODULES = {"fa3": "flash_attn_interface", "fa3_fwd": "fa3_fwd_interface", "fa2": "flash_attn"}
TABLE_ARG = {"fa3": "page_table", "fa3_fwd": "cache_batch_idx", "fa2": "block_table"}


def fake_fa_module(flavor: str, calls: list) -> types.ModuleType:
    mod = types.ModuleType(MODULES[flavor])
    mod.__version__ = f"0.0.0+fake-{flavor}"
    table_arg = TABLE_ARG[flavor]

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, softmax_scale=None,
                                causal=False, **kw):
        assert set(kw) == {table_arg}, f"{flavor} got table kwargs {sorted(kw)}"
        table = kw[table_arg]
        assert k is None and v is None, "KV is already in the pool: no append"
        assert q.dim() == 4 and k_cache.dim() == 4 and k_cache.stride(-1) == 1
        b, q_len = q.shape[:2]
        assert cache_seqlens.dtype == torch.int32 and tuple(cache_seqlens.shape) == (b,)
        assert table.dtype == torch.int32 and table.is_contiguous()
        if flavor == "fa2":
            assert k_cache.shape[1] % 256 == 0, "FA2 paged KV: page size multiple of 256"
        calls.append({"q": tuple(q.shape), "q_dtype": q.dtype, "table": table.clone(),
                      "seqlens": cache_seqlens.clone(), "causal": causal, "scale": softmax_scale})
        out = torch.zeros(q.shape, dtype=torch.float32)
        for i in range(b):
            n = int(cache_seqlens[i])
            if flavor == "fa3_fwd":  # [batch_cache, seqlen_cache, H, D], row picked by cache_batch_idx
                assert table.shape == (b,) and n <= k_cache.shape[1]
                kk, vv = k_cache[int(table[i])][:n], v_cache[int(table[i])][:n]
            else:  # [num_blocks, page, H, D] through a [b, max_blocks] table
                assert table.dim() == 2 and table.shape[0] == b
                assert table.shape[1] >= math.ceil(n / k_cache.shape[1])
                pages = table[i].long()
                kk = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]
                vv = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
            # FA's documented causal rule: query row r sees keys j <= r + seqlen_k - seqlen_q (bottom-right)
            r = torch.arange(q_len)[:, None]
            mask = torch.arange(n)[None, :] <= r + n - q_len if causal else torch.ones(q_len, n, dtype=torch.bool)
            out[i] = reference_attention(q[i], kk, vv, mask, softmax_scale)
        return out.to(q.dtype)

    mod.flash_attn_with_kvcache = flash_attn_with_kvcache
    return mod


@pytest.fixture
def use_flavor(monkeypatch):
    """use_flavor(name) installs that fake and hides the higher-priority modules; returns the call log."""

    def install(flavor: str | None) -> list:
        calls: list = []
        for name, module in MODULES.items():
            monkeypatch.setitem(sys.modules, module, fake_fa_module(name, calls) if name == flavor else None)
        return calls

    return install


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
    assert not caps.custom_mask and not caps.cuda_graph
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
