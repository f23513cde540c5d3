"""The contiguous causal prefill kernel (kernels/prefill_contig.py) against a per-request causal SDPA reference with
GQA: varlen batches with requests of 0, 1 and tile-crossing lengths, head dims 64 and 128, GQA ratios 1 and 3, tiles
smaller than the requests, K / V as slices of one fused qkv tensor (strided rows). CPU under the interpreter (fp32
dots), bf16 on the GPU."""

import os

import pytest
import torch
import torch.nn.functional as F

from attnlab.kernels.extend import query_blocks
from attnlab.kernels.prefill_contig import prefill_contig

CUDA = torch.cuda.is_available()
# triton on CPU tensors: the interpreter only (CI's CPU machine); a machine whose Triton compiles for a GPU skips them
interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="triton on CPU tensors needs "
                            "TRITON_INTERPRET=1 (CPU-only machines)")


def reference(q, k, v, q_lens, scale):
    out, start = torch.zeros_like(q, dtype=torch.float32), 0
    group = q.shape[1] // k.shape[1]
    for n in q_lens:
        if n:
            qq, kk, vv = (t[start:start + n].float().transpose(0, 1) for t in (q, k, v))
            kk, vv = kk.repeat_interleave(group, 0), vv.repeat_interleave(group, 0)
            out[start:start + n] = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True,
                                                                  scale=scale).transpose(0, 1)
        start += n
    return out


@pytest.mark.parametrize("device,dtype", [pytest.param("cpu", torch.float32, marks=interp), pytest.param("cuda", torch.bfloat16, marks=[
    pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")])])
@pytest.mark.parametrize("head_dim,hkv,group", [(64, 2, 3), (128, 1, 1)])
@pytest.mark.parametrize("q_lens,block_m,block_n", [([37, 0, 1, 16], 16, 16), ([5, 50], 32, 16)])
def test_matches_causal_reference(device, dtype, head_dim, hkv, group, q_lens, block_m, block_n):
    g = torch.Generator().manual_seed(sum(q_lens) + head_dim)
    T, hq = sum(q_lens), hkv * group
    if device == "cuda":  # the GPU's tiles: the launch the bench sweeps
        block_m, block_n = 128, 64
    qkv = torch.randn(T, hq + 2 * hkv, head_dim, generator=g).to(device, dtype)  # one fused projection output
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    req, q0 = (torch.tensor(x, dtype=torch.int32, device=device) for x in query_blocks(q_lens, block_m, q_lens))
    scale = head_dim ** -0.5
    out = prefill_contig(q, k, v, cu, req, q0, scale=scale, block_m=block_m, block_n=block_n)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    torch.testing.assert_close(out.float(), reference(q, k, v, q_lens, scale), atol=tol, rtol=tol)


def test_bad_layouts_say_what_is_wrong():
    q = torch.zeros(4, 3, 48)
    with pytest.raises(ValueError, match="head_dim 48"):
        prefill_contig(q, q[:, :1], q[:, :1], torch.tensor([0, 4], dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), scale=1.0)
    q = torch.zeros(4, 2, 64).transpose(0, 1)  # heads outermost: a token's row is not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        prefill_contig(q, q[:, :1], q[:, :1], torch.tensor([0, 2], dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), scale=1.0)


# -- wired into the triton backend (run_new) and the engine ------------------------------------------------------


def _new_kv(case, layer=0):
    """The new tokens' K / V as a projection would hand them ([T, Hkv, D]): read back from their pool slots."""
    lay, ps = case.meta.layout, case.meta.page_size
    k_cache, v_cache = case.pool.slots_view(layer)
    slots = []
    for i, n in enumerate(case.meta.kv_lens_host):
        pages = lay.kv_indices[lay.kv_indptr[i]:lay.kv_indptr[i + 1]].tolist()
        slots += [pages[t // ps] * ps + t % ps for t in range(n)]
    idx = torch.tensor(slots, dtype=torch.long)
    return k_cache[idx], v_cache[idx]


@pytest.mark.parametrize("device,dtype,head_dim", [
    pytest.param("cpu", torch.float32, 64, marks=interp),
    pytest.param("cuda", torch.bfloat16, 128, marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="GPU")])])
@pytest.mark.parametrize("contig", [True, False])
def test_triton_backend_runs_a_prefill_without_prefix_on_the_new_kv(contig, device, dtype, head_dim):
    from attnlab.backends.base import Mode
    from attnlab.backends.triton import TritonBackend
    from tests.backends.cases import make_case

    case = make_case(kv_lens=[70, 0, 1, 300], q_lens=[70, 0, 1, 300], page_size=16, num_kv_heads=2, gqa=3,
                     head_dim=head_dim, dtype=dtype, mode=Mode.PREFILL, device=device)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    be = TritonBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, case.q.dtype,
                        prefill_contig=contig)
    be.plan(case.meta)
    k, v = _new_kv(case)
    got = be.run_new(case.q, k, v, 0)
    torch.testing.assert_close(got.float(), case.reference()[0], atol=tol, rtol=tol)
    assert be.kernel_info()["prefill"].startswith("contig" if contig else "extend")
    torch.testing.assert_close(be.run(case.q, 0).float(), got.float(), atol=tol, rtol=tol)  # run: the paged kernel
    assert be.kernel_info()["prefill"].startswith("extend")  # the label says what ran last


@interp
@pytest.mark.parametrize("kv_lens,q_lens,why,kw", [
    ([100, 40], [70, 40], "a cached prefix", {}),
    ([30, 40], [30, 40], "fewer than 65 new tokens", {}),
    ([70, 40], [70, 40], "an fp8 pool: attention reads its values", {"kv_dtype": torch.float8_e5m2}),
    ([70, 40], [70, 40], "a prefill_tiles sweep times the paged kernel", {"prefill_tiles": "64x64x4x3"}),
    ([70, 40], [70, 40], "a verify pass", {"mode": "verify"}),
])
def test_prefills_it_cannot_serve_keep_the_paged_kernel(kv_lens, q_lens, why, kw):
    from attnlab.backends.base import Mode
    from attnlab.backends.triton import TritonBackend
    from tests.backends.cases import make_case

    mode = Mode.VERIFY if kw.get("mode") == "verify" else Mode.PREFILL
    case = make_case(kv_lens=kv_lens, q_lens=q_lens, page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                     dtype=torch.float32, mode=mode, kv_dtype=kw.get("kv_dtype"))
    be = TritonBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.float32,
                       prefill_tiles=kw.get("prefill_tiles"))
    be.plan(case.meta)
    assert be.active_plan.contig is None, why
    got = be.run_new(case.q, *_new_kv(case), 0)  # falls back to the paged kernel
    torch.testing.assert_close(got, be.run(case.q, 0))


def test_the_launch_must_fit_the_gpus_shared_memory(monkeypatch):
    """contig_config, the one rule for plans and warmup: 128 x 128 x 3 stages at head dim 128 takes ~230 KB, which
    Hopper's 227 KiB holds and an A100's 164 KiB does not; head dim 64 fits both; fp32, an fp8 pool, an unmeasured
    head dim or an unreadable limit keep the paged kernel."""
    from attnlab.kernels import prefill_contig as pc

    monkeypatch.setattr(pc, "interpreter_on", lambda: False)
    cuda, bf16 = torch.device("cuda", 0), torch.bfloat16
    for limit, want128 in ((232448, True), (166912, False), (0, False)):
        monkeypatch.setattr(pc, "max_shared_mem", lambda _i, limit=limit: limit)
        assert (pc.contig_config(128, bf16, bf16, cuda) is not None) == want128, limit
        assert (pc.contig_config(64, bf16, bf16, cuda) is not None) == (limit > 0), limit
    monkeypatch.setattr(pc, "max_shared_mem", lambda _i: 232448)
    assert pc.contig_config(64, torch.float32, torch.float32, cuda) is None
    assert pc.contig_config(64, bf16, torch.float8_e4m3fn, cuda) is None and pc.contig_config(96, bf16, bf16, cuda) is None


def test_one_kv_head_with_any_head_stride_needs_no_copy():
    from attnlab.kernels.prefill_contig import descriptor_ready

    t = torch.zeros(8, 4, 64)[:, 1:2]  # [8, 1, 64]: stride(1) 64 but one head
    assert descriptor_ready(torch.as_strided(t, (8, 1, 64), (256, 7, 1)))


@interp
def test_engine_prefill_on_the_contiguous_kernel_decodes_as_the_paged_one():
    """A tiny decoder at head dim 64 on triton (interpreter, fp32): prompts of 70 and 80 tokens prefill on the
    contiguous kernel (through AttnContext.attend -> run_new); the prefill's logits equal the paged kernel's and the
    torch reference backend's, and so do the greedy outputs after it."""
    from attnlab.backends.base import Mode
    from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
    from attnlab.spec.drafters import NoDrafter
    from tests.spec.tiny import prompts, runner, tiny_config, tiny_model

    cfg = tiny_config(heads=6, kv_heads=2, head_dim=64, hidden=96)
    model = tiny_model(cfg, seed=3)
    ps = prompts(2, cfg.vocab_size, lengths=(70, 80))
    outs, logits = [], []
    for backend, contig in (("triton", True), ("triton", False), ("torch", None)):
        r = runner(model, cfg, backend=backend)
        if contig is not None:
            r.backend.prefill_contig = contig
        ids = torch.tensor([t for p in ps for t in p])
        with torch.inference_mode():
            logits.append(r.run(["a", "b"], [0, 0], [len(p) for p in ps], ids, Mode.PREFILL))
        if contig:
            assert r.backend.kernel_info()["prefill"].startswith("contig")
        for q in ("a", "b"):
            r.release(q)
        dec = SpeculativeDecoder(r, NoDrafter("cpu"), SpecParams(0))
        outs.append([o.output_ids for o in dec.generate(ps, 6).requests])
    torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[0], logits[2], atol=1e-4, rtol=1e-4)
    assert outs[0] == outs[1] == outs[2]


def test_bench_new_kv_reads_the_new_tokens_slots():
    """backends.cases.new_kv (what bench.kernels' prefill cells and kernel parity hand run_new): the new tokens' K / V, prefix or not."""
    from attnlab.backends.base import Mode
    from attnlab.backends.cases import new_kv
    from tests.backends.cases import make_case

    case = make_case(kv_lens=[40, 9, 33], q_lens=[40, 9, 33], page_size=4, num_kv_heads=2, gqa=2, head_dim=16,
                     dtype=torch.float32, mode=Mode.PREFILL, num_layers=2)
    for layer in range(2):
        for got, want in zip(new_kv(case.pool, case.meta, layer), _new_kv(case, layer)):
            assert torch.equal(got, want)


@interp
def test_triton_warmup_compiles_the_contiguous_prefill():
    from attnlab.backends.base import Mode
    from attnlab.backends.triton import TritonBackend
    from tests.backends.cases import make_case

    case = make_case(kv_lens=[3], q_lens=[3], page_size=16, num_kv_heads=2, gqa=3, head_dim=64,
                     dtype=torch.float32, mode=Mode.PREFILL)
    for contig in (True, False):
        be = TritonBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, torch.float32,
                           prefill_contig=contig)
        kinds = {r["params"].kind for r in be.warmup(q_lens=(1, 100), kv_lens=(100,))}
        assert ("contig" in kinds) == contig and {"decode", "extend"} <= kinds
