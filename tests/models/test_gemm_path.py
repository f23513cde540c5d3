"""The decoder on attnlab's small-M GEMM (engine.gemm=triton -> AttnContext.fused_ops == "gemm") against the
unfused layers, on a tiny random model under the interpreter (CPU) or on the GPU.

fp32: the gemm path rounds nowhere the torch layers do not, but sums K in its own order (tile by tile, split by
split) where torch's matmul uses another: outputs differ by a few fp32 ulps of the partial sums (~1e-6
relative), so the fp32 check is 1e-5, not bitwise. bf16: those ulps can flip a bf16 rounding of an
intermediate (projection output, norm, SiLU) by one bf16 ulp (2^-8 relative), which propagates through two
layers: 3 bf16 ulps of the logits' scale.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.backends.registry import get_backend_class
from attnlab.engine.runner import ModelRunner
from attnlab.kvcache import KVPool, PageAllocator
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NoDrafter
from tests.spec.tiny import prompts, tiny_config, tiny_model

CFG = tiny_config(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=2)


def _runner(model, dtype, fused_ops, page_size=16, max_context=64):
    pages = 4 * max_context // page_size
    pool = KVPool(CFG.num_layers, pages, page_size, CFG.num_kv_heads, CFG.head_dim, dtype, "cpu")
    be = get_backend_class("torch")(pool, CFG.num_heads, CFG.num_kv_heads, CFG.head_dim, CFG.head_dim ** -0.5,
                                    dtype)
    return ModelRunner(model, CFG, None, pool, PageAllocator(pages, page_size), be, max_context, "target",
                       fused_ops=fused_ops)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_layers_match_unfused_layers(dtype, monkeypatch):
    model = tiny_model(CFG, seed=7).to(dtype)
    ps = prompts(3, CFG.vocab_size, lengths=(1, 5, 3))  # 9 tokens: one pass on the gemm path
    ids = torch.tensor([t for p in ps for t in p])
    outs = []
    for mode in (False, "gemm", "gemm_attn"):
        r = _runner(model, dtype, mode)
        outs.append(r.run(list(range(3)), [0] * 3, [len(p) for p in ps], ids, mode=Mode.PREFILL, rows="all"))
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (3 * 2.0**-8 * outs[0].abs().max().item(), 3 * 2.0**-8)
    torch.testing.assert_close(outs[1], outs[0], atol=tol[0], rtol=tol[1])
    torch.testing.assert_close(outs[2], outs[0], atol=tol[0], rtol=tol[1])


def test_gemm_path_runs_the_gemm_and_falls_back_above_16_tokens(monkeypatch):
    from attnlab.kernels import gemm

    model = tiny_model(CFG, seed=8)
    calls = []
    real = gemm.gemm
    monkeypatch.setattr(gemm, "gemm", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    r = _runner(model, torch.float32, "gemm")
    r.run([0], [0], [4], torch.arange(4), mode=Mode.PREFILL)
    assert calls == [4] * 4 * CFG.num_layers + [1]  # qkv, o, gate_up, down per layer; the LM head's one row
    calls.clear()
    r.run([1], [0], [17], torch.arange(17), mode=Mode.PREFILL)  # > 16 tokens: cuBLAS (the fused path)
    assert calls == [1]  # the layers on cuBLAS; the logits of the last row on the GEMM, as every gemm-path logit


def test_gemm_attn_path_runs_qkv_and_o_on_the_gemm_and_stores_kv_there(monkeypatch):
    """engine.gemm=triton_attn: per layer qkv and o on the GEMM (the qkv epilogue storing K / V: no store kernel),
    gate_up / down and the LM head not; above 16 tokens the fused path (cuBLAS everywhere)."""
    import importlib

    from attnlab.kernels import gemm

    store_mod = importlib.import_module("attnlab.kernels.store_kv")  # the package re-exports the function
    model = tiny_model(CFG, seed=8)
    calls, stores = [], []
    real, real_store = gemm.gemm, store_mod.store_kv
    monkeypatch.setattr(gemm, "gemm", lambda x, w, *a, **k: calls.append((x.shape[0], k.get("epilogue"))) or
                        real(x, w, *a, **k))
    monkeypatch.setattr(store_mod, "store_kv", lambda *a, **k: stores.append(1) or real_store(*a, **k))
    r = _runner(model, torch.float32, "gemm_attn")
    assert r.rope_table is not None  # the qkv epilogue reads cos / sin by position
    r.run([0], [0], [4], torch.arange(4), mode=Mode.PREFILL)
    assert calls == [(4, "rope"), (4, "residual")] * CFG.num_layers and not stores
    calls.clear()
    r.run([1], [0], [17], torch.arange(17), mode=Mode.PREFILL)  # > 16 tokens: the fused path, RoPE stores K / V
    assert calls == [] and not stores


def test_norms_run_as_their_own_launches_as_prologues_or_as_tails(monkeypatch):
    """+normsep: no GEMM takes a norm prologue, one add_rmsnorm per norm instead; +normpro: qkv and gate_up normalize
    in their prologue; +normtail: o_proj and down_proj end with the next norm (the last down_proj with the final norm),
    one add_rmsnorm a pass (layer 0's); the default (+normauto) is +normtail for a stream as narrow as the tiny
    model's. The same logits up to the fp32 order of the sum of squares."""
    from attnlab.kernels import fused, gemm

    model = tiny_model(CFG, seed=11)
    prologues, tails, norms = [], [], []
    real, real_norm = gemm.gemm, fused.add_rmsnorm

    def spy(x, w, *a, **k):
        prologues.append(k.get("norm_weight") is not None)
        tails.append(k.get("tail_norm") is not None)
        return real(x, w, *a, **k)

    monkeypatch.setattr(gemm, "gemm", spy)
    monkeypatch.setattr(fused, "add_rmsnorm", lambda *a, **k: norms.append(1) or real_norm(*a, **k))
    outs = []
    assert CFG.hidden_size <= gemm.TAIL_AUTO_MAX_N  # the default (auto) puts the tiny model's norms in tails
    for arm in ("fill/ticket+normpro", "fill/ticket+normsep", "fill/ticket+normtail", "fill/ticket"):
        prologues.clear()
        tails.clear()
        norms.clear()
        with gemm.arm(arm):
            outs.append(_runner(model, torch.float32, "gemm").run([0], [0], [5], torch.arange(5), mode=Mode.PREFILL))
        pro, tail = arm.endswith("normpro"), arm.endswith(("normtail", "ticket"))
        want = [True, False, True, False] * CFG.num_layers if pro else [False] * 4 * CFG.num_layers
        assert prologues[:4 * CFG.num_layers] == want
        assert tails[:4 * CFG.num_layers] == [False, tail, False, tail] * CFG.num_layers
        assert len(norms) == (1 if tail else 1 + (0 if pro else 2 * CFG.num_layers))  # + the final norm
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[2], outs[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(outs[3], outs[2])


@pytest.mark.parametrize("split", ["fill/pass", "fill/ticket", "lean/ticket"])
def test_gemm_path_greedy_output_identical(split, monkeypatch):
    """fp32 greedy decoding, target-only: the gemm side emits the tokens the unfused side emits
    (prompts of 11 and 5 tokens: the 16-token prefill and the decode steps run on the gemm path, whose qkv
    GEMM also writes K/V into the pool), in each reduction of split K; under fill some GEMMs do split; also with the
    norms as GEMM prologues (+normpro) or tails (+normtail) and with only qkv and o on the GEMM (gemm_attn)."""
    from attnlab.kernels import gemm

    splits = []
    real = gemm.split_k
    monkeypatch.setattr(gemm, "split_k", lambda *a, **k: splits.append(real(*a, **k)[0]) or real(*a, **k))
    model = tiny_model(CFG, seed=9)
    ps = prompts(2, CFG.vocab_size, lengths=(11, 5))
    ref = SpeculativeDecoder(_runner(model, torch.float32, False), NoDrafter("cpu"), SpecParams(0)).generate(ps, 4)
    for mode, extra in (("gemm", ""), ("gemm_attn", ""), ("gemm", "+normpro"), ("gemm", "+normtail")):
        with gemm.arm(split + extra):
            out = SpeculativeDecoder(_runner(model, torch.float32, mode), NoDrafter("cpu"),
                                     SpecParams(0)).generate(ps, 4)
        assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests], mode + extra
    assert splits and (max(splits) > 1) == split.startswith("fill")  # the tiny model's K: lean never splits


@pytest.mark.parametrize("fused_argmax", [True, False])
def test_multi_step_greedy_tokens_come_from_the_lm_heads_argmax_epilogue(fused_argmax, monkeypatch):
    """engine.decode_steps_per_sync = 3 on the gemm path: each step's greedy tokens come from one launch, the LM
    head's argmax epilogue (``+lmargmax``; ``+lmlogits``, the default: logits and a torch argmax), the tokens of the
    unfused side (fp32)."""
    from attnlab.kernels import gemm

    calls = []
    real = gemm.argmax_linear
    monkeypatch.setattr(gemm, "argmax_linear", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    model = tiny_model(CFG, seed=9)
    ps = prompts(2, CFG.vocab_size, lengths=(11, 5))
    outs = []
    for fused in (False, "gemm"):
        r = _runner(model, torch.float32, fused)
        r.decode_steps_per_sync = 3
        with gemm.arm("fill/ticket" + ("+lmargmax" if fused_argmax else "+lmlogits")):
            out = SpeculativeDecoder(r, NoDrafter("cpu"), SpecParams(0)).generate(ps, 7)
        outs.append([o.output_ids for o in out.requests])
    assert outs[0] == outs[1]
    assert (calls and set(calls) == {2}) if fused_argmax else not calls  # batch 2, one launch a step


def test_gemm_path_qkv_writes_the_pool_and_skips_the_store_kernel(monkeypatch):
    """The qkv GEMM's epilogue stores K/V (no store_kv launch), and the pool holds what the unfused side
    stores; an fp8 pool keeps the Triton store (it quantizes)."""
    import importlib

    store_mod = importlib.import_module("attnlab.kernels.store_kv")  # the package re-exports the function
    model = tiny_model(CFG, seed=10)
    calls = []
    real = store_mod.store_kv
    monkeypatch.setattr(store_mod, "store_kv", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.arange(6)
    pools = []
    for mode in (False, "gemm"):
        r = _runner(model, torch.float32, mode)
        r.run([0], [0], [6], ids, mode=Mode.PREFILL)
        pools.append(r.pool.layer(0).clone())
    assert calls == []
    torch.testing.assert_close(pools[1], pools[0], atol=1e-5, rtol=1e-5)
    ctx_pool = KVPool(CFG.num_layers, 4, 16, CFG.num_kv_heads, CFG.head_dim, torch.float8_e4m3fn, "cpu")
    from attnlab.backends.context import AttnContext

    ctx = AttnContext(None, ctx_pool, torch.zeros(1, dtype=torch.long), fused_ops="gemm")
    assert ctx.kv_store_target(0, torch.float32) is None
    assert AttnContext(None, r.pool, torch.zeros(1, dtype=torch.long), fused_ops=False).kv_store_target(
        0, torch.float32) is None  # the unfused path stores through the pool's torch store


def test_rope_tables_change_no_bit_and_leave_no_rope_op_per_pass(monkeypatch):
    """A gemm-path runner builds RoPE's cos / sin over its positions once (Decoder.rope_tables, the same torch ops)
    and its qkv epilogue reads them by position: logits bit for bit those of the per-pass torch cos / sin
    (``+ropecalc``), a prefill and decode steps at scattered positions, and no rope.cos_sin call per pass; a side of
    another engine builds no tables."""
    from attnlab.kernels import gemm
    from attnlab.models import rope

    model = tiny_model(CFG, seed=10).to(torch.bfloat16)
    r = _runner(model, torch.bfloat16, "gemm")
    assert r.rope_table is not None and r.rope_table[0].shape == (r.max_context, CFG.head_dim)
    assert _runner(model, torch.bfloat16, True).rope_table is None
    calls = []
    real = rope.cos_sin
    monkeypatch.setattr(rope, "cos_sin", lambda *a, **k: calls.append(1) or real(*a, **k))
    ps = prompts(2, CFG.vocab_size, lengths=(7, 3))
    ids = torch.tensor([t for p in ps for t in p])
    outs = {}
    for arm in ("fill/ticket", "fill/ticket+ropecalc"):
        run = _runner(model, torch.bfloat16, "gemm")  # its tables: one call, once
        calls.clear()
        with gemm.arm(arm):
            pre = run.run([0, 1], [0, 0], [7, 3], ids, mode=Mode.PREFILL, rows="all")
            dec = run.run([0, 1], [7, 3], [1, 1], torch.tensor([5, 9]), mode=Mode.DECODE, rows="all")
            dec2 = run.run([0, 1], [8, 4], [1, 1], torch.tensor([2, 11]), mode=Mode.DECODE, rows="all")
        outs[arm] = (pre, dec, dec2)
        assert (len(calls) == 0) == (arm == "fill/ticket"), (arm, len(calls))
    for a, b in zip(*outs.values()):
        assert torch.equal(a, b)


def test_tail_norms_thread_through_a_layer_subset_and_capture():
    """+normtail over a LayerSubset (layers 0 and 2 of 3: layer 0's down_proj computes layer 2's input norm, layer 2's
    the final norm) with the EAGLE feature capture on: the logits and the captured streams of +normsep, up to the sum
    of squares' fp32 order; one add_rmsnorm a pass (the first layer's), the rest in tails."""
    from attnlab.kernels import fused, gemm
    from attnlab.models.subset import LayerSubset

    cfg = tiny_config(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=3)
    model = LayerSubset(tiny_model(cfg, seed=5), [0, 2])
    sub_cfg = tiny_config(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=2)
    norms = []
    real = fused.add_rmsnorm
    outs = []
    for place in ("sep", "tail"):
        pool = KVPool(2, 16, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
        be = get_backend_class("torch")(pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5,
                                        torch.float32)
        r = ModelRunner(model, sub_cfg, None, pool, PageAllocator(16, 16), be, 64, "draft", fused_ops="gemm")
        r.capture_layers = (0, 2)
        norms.clear()
        fused.add_rmsnorm = lambda *a, **k: norms.append(1) or real(*a, **k)
        try:
            with gemm.arm(f"fill/ticket+norm{place}"):
                logits = r.run([0], [0], [5], torch.arange(5), mode=Mode.PREFILL)
        finally:
            fused.add_rmsnorm = real
        outs.append((logits, r.aux.clone()))
        assert len(norms) == (1 if place == "tail" else 1 + 2 * 2)
    assert outs[0][1].shape == (5, 2 * cfg.hidden_size)
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("small_m,takes", [("weight_only", True), ("w8a8", False)])
def test_w8a8_fp8_layers_keep_their_activation_quantization(small_m, takes, monkeypatch):
    """precision.fp8_gemm=w8a8 layers (quantize_linears marks them) are not weight-only: a gemm-path pass hands them to
    the fused cuBLAS path, where FP8Linear quantizes the activations; weight-only e4m3 layers run the GEMM."""
    from attnlab.kernels import gemm
    from attnlab.models.fp8 import quantize_linears

    model = quantize_linears(tiny_model(CFG, seed=9).to(torch.bfloat16), small_m=small_m)
    calls = []
    real = gemm.gemm
    monkeypatch.setattr(gemm, "gemm", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    try:
        _runner(model, torch.bfloat16, "gemm").run([0], [0], [3], torch.arange(3), mode=Mode.PREFILL)
    except (RuntimeError, NotImplementedError) as e:  # W8A8's torch._scaled_mm on the CPU
        pytest.skip(f"torch._scaled_mm row-wise unavailable on CPU here: {e}")
    layer_calls = [n for n in calls if n == 3]
    assert (len(layer_calls) == 4 * CFG.num_layers) == takes and (len(layer_calls) == 0) == (not takes)
