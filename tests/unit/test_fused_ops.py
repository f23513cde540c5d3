"""The fused layer kernels (attnlab/kernels/fused.py) against the torch code they replace.

On CPU they run under TRITON_INTERPRET=1 (conftest); small shapes. The model-level tests switch a tiny
decoder between the two paths: same logits, and the same greedy speculative output.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.backends.base import Mode
from attnlab.kernels import fused
from attnlab.models import rope
from attnlab.models.decoder import RMSNorm
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NoDrafter
from tests.spec.tiny import prompts, runner, tiny_config, tiny_model

DTYPES = [torch.float32, torch.bfloat16]


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    # bf16: the kernels round where torch rounds, but the Triton interpreter casts fp32 -> bf16 by truncation
    # (a GPU rounds to nearest even), so allow three bf16 ulps; fp32: a few ulps
    tol = {"atol": 1e-2, "rtol": 3 * 2.0**-7} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("t,n", [(0, 64), (1, 64), (5, 96), (3, 128)])
def test_add_rmsnorm_matches_torch(t, n, with_residual, dtype):
    g = torch.Generator().manual_seed(t * 1000 + n)
    x = torch.randn(t, n, generator=g).to(dtype)
    res = torch.randn(t, n, generator=g).to(dtype) if with_residual else None
    norm = RMSNorm(n, 1e-6, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(n, generator=g) + 0.5)
    out, res_out = fused.add_rmsnorm(x, res, norm.weight, norm.eps)
    h = x + res if with_residual else x
    if dtype == torch.float32:
        assert torch.equal(res_out, h)  # the same fp32 add
    _close(res_out, h, dtype)
    assert out.dtype == dtype and out.shape == (t, n)
    _close(out, norm(h), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (3, 1)])  # GQA ratios 1, 3, 3
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("t", [0, 1, 7])
def test_rope_qk_matches_apply_rope(t, head_dim, heads, kv_heads, dtype):
    g = torch.Generator().manual_seed(t + head_dim + heads)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    positions = torch.randint(0, 4000, (t,), generator=g)
    cos, sin = rope.cos_sin(positions, rope.inv_freq(head_dim, 500000.0), dtype)
    q, k, v = fused.rope_qk(qkv, cos, sin, heads, kv_heads, head_dim)
    rq, rk, rv = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    assert q.shape == (t, heads, head_dim) and k.shape == (t, kv_heads, head_dim) and q.is_contiguous()
    assert torch.equal(v, rv.view(t, kv_heads, head_dim))
    _close(q, rope.apply_rope(rq.view(t, heads, head_dim), cos, sin), dtype)
    _close(k, rope.apply_rope(rk.view(t, kv_heads, head_dim), cos, sin), dtype)
    # cos / sin computed in the kernel from the positions (the EAGLE head's fused steps): the same to rounding
    q2, k2, v2 = fused.rope_qk(qkv, None, None, heads, kv_heads, head_dim, positions=positions,
                               inv_freq=rope.inv_freq(head_dim, 500000.0))
    assert torch.equal(v2, v)
    _close(q2, q, dtype)
    _close(k2, k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 64), (6, 2, 128), (3, 1, 64)])  # GQA 1, 3, 3
@pytest.mark.parametrize("t", [0, 1, 5])
@pytest.mark.parametrize("from_pos", [False, True])
def test_rope_qk_stores_k_and_v_as_the_store_kernel_does(t, heads, kv_heads, head_dim, dtype, from_pos):
    """kv_store: the RoPE launch also writes the rotated k and v into their pool slots: exactly what store_kv writes
    from rope_qk's own outputs; slot -1 (a padded row) is written nowhere; q / k / v as without it."""
    from attnlab.kernels.store_kv import store_kv
    from attnlab.kvcache import KVPool

    g = torch.Generator().manual_seed(17 + t + heads + head_dim)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    positions = torch.randint(0, 4000, (t,), generator=g)
    inv = rope.inv_freq(head_dim, 500000.0)
    cos, sin = (None, None) if from_pos else rope.cos_sin(positions, inv, dtype)
    kw = {"positions": positions, "inv_freq": inv} if from_pos else {}
    slots = torch.tensor([9, -1, 0, 31, 4][:t], dtype=torch.int32)  # page size 8: pages 1, 0, 3, 0
    pools = [KVPool(2, 4, 8, kv_heads, head_dim, dtype, "cpu") for _ in range(2)]
    for p in pools:
        p.kv.fill_(7.0)  # what no store may touch
    q0, k0, v0 = fused.rope_qk(qkv, cos, sin, heads, kv_heads, head_dim, **kw)
    store_kv(pools[0], 1, k0, v0, slots)
    kc, vc = pools[1].slots_view(1)
    q, k, v = fused.rope_qk(qkv, cos, sin, heads, kv_heads, head_dim, kv_store=(kc, vc, slots), **kw)
    assert torch.equal(q, q0) and torch.equal(k, k0) and torch.equal(v, v0)
    assert torch.equal(pools[1].kv, pools[0].kv)
    assert torch.equal(pools[1].kv[0], torch.full_like(pools[1].kv[0], 7.0))  # another layer: untouched


def test_rope_qk_store_refuses_bad_targets():
    qkv = torch.randn(2, 3 * 8)
    kc = torch.zeros(16, 1, 8)
    slots = torch.tensor([0, 1])
    cos, sin = rope.cos_sin(torch.arange(2), rope.inv_freq(8, 10000.0), torch.float32)
    with pytest.raises(ValueError, match="caches must be"):
        fused.rope_qk(qkv, cos, sin, 1, 1, 8, kv_store=(kc.to(torch.bfloat16), kc, slots))
    with pytest.raises(ValueError, match="caches must be"):
        fused.rope_qk(qkv, cos, sin, 1, 1, 8, kv_store=(torch.zeros(16, 2, 8), kc, slots))
    with pytest.raises(ValueError, match="slots must be"):
        fused.rope_qk(qkv, cos, sin, 1, 1, 8, kv_store=(kc, kc, slots[:1]))
    with pytest.raises(ValueError, match="slots must be"):
        fused.rope_qk(qkv, cos, sin, 1, 1, 8, kv_store=(kc, kc, slots.float()))


def test_rmsnorm_into_half_of_a_wider_buffer_and_bad_inputs():
    x = torch.randn(3, 8)
    w = torch.rand(8) + 0.5
    buf = torch.zeros(3, 16)
    out, _ = fused.add_rmsnorm(x, None, w, 1e-5, out=buf[:, 8:])
    assert out.data_ptr() == buf[:, 8:].data_ptr() and torch.equal(buf[:, :8], torch.zeros(3, 8))
    assert torch.equal(buf[:, 8:], fused.add_rmsnorm(x, None, w, 1e-5)[0])
    with pytest.raises(ValueError, match="out must be"):
        fused.add_rmsnorm(x, None, w, 1e-5, out=torch.zeros(8, 3).t())
    with pytest.raises(ValueError, match="inv_freq"):
        fused.rope_qk(torch.zeros(1, 3 * 8), None, None, 1, 1, 8, positions=torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,inter", [(0, 32), (1, 96), (4, 1500)])  # 1500: two blocks, the second masked
def test_silu_mul_matches_torch(t, inter, dtype):
    gate_up = (torch.randn(t, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 3).to(dtype)
    gate, up = gate_up.split(inter, dim=-1)
    _close(fused.silu_mul(gate_up, inter), F.silu(gate) * up, dtype)


# ---------------------------------------------------------------------------------------------------------
# the model on the fused path

CFG = tiny_config(heads=6, kv_heads=2, head_dim=32, hidden=96)  # GQA ratio 3, hidden not a power of two


@pytest.mark.parametrize("page_size", [1, 16])
def test_fused_decoder_logits_match(page_size):
    model = tiny_model(CFG, seed=3)
    ps = prompts(3, CFG.vocab_size)
    outs = []
    for on in (False, True):  # the same weights: fused is a property of the side
        r = runner(model, CFG, page_size, fused_ops=on)
        reqs = list(range(len(ps)))
        ids = torch.tensor([t for p in ps for t in p])
        outs.append(r.run(reqs, [0] * len(ps), [len(p) for p in ps], ids, mode=Mode.PREFILL, rows="all"))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)


def test_fused_layers_store_kv_from_the_rope_launch(monkeypatch):
    """The fused layer stores K / V from its RoPE launch (no store kernel) and leaves the pool and the logits as the
    store kernel did (the ``+kvsep`` bench arm)."""
    import importlib

    store_mod = importlib.import_module("attnlab.kernels.store_kv")  # the package re-exports the function
    model = tiny_model(CFG, seed=5)
    ps = prompts(2, CFG.vocab_size)
    ids = torch.tensor([t for p in ps for t in p])
    stores = []
    real = store_mod.store_kv
    monkeypatch.setattr(store_mod, "store_kv", lambda *a, **k: stores.append(1) or real(*a, **k))
    outs, kvs = [], []
    for on in (True, False):
        fused.set_rope_store(on)
        try:
            r = runner(model, CFG, 16, fused_ops=True)
            outs.append(r.run([0, 1], [0, 0], [len(p) for p in ps], ids, mode=Mode.PREFILL, rows="all"))
        finally:
            fused.set_rope_store(True)
        kvs.append(r.pool.kv.clone())
        assert len(stores) == (0 if on else CFG.num_layers)
        stores.clear()
    assert torch.equal(outs[0], outs[1]) and torch.equal(kvs[0], kvs[1])


@pytest.mark.parametrize("k", [1, 4])
def test_fused_speculative_output_identical(k):
    """Greedy fp32: self-drafting on the first layer, both sides fused, equals unfused target-only decoding."""
    model = tiny_model(CFG, seed=4)
    ps = prompts(4, CFG.vocab_size)
    ref = SpeculativeDecoder(runner(model, CFG, 16), NoDrafter("cpu"), SpecParams(0)).generate(ps, 12)
    tgt = runner(model, CFG, 16, fused_ops=True)
    drafter = ModelDrafter(runner(model, CFG, 16, layers=[0], name="draft", fused_ops=True), "self")
    out = SpeculativeDecoder(tgt, drafter, SpecParams(k)).generate(ps, 12)
    assert [r.output_ids for r in out.requests] == [r.output_ids for r in ref.requests]


@pytest.mark.parametrize("k", [1, 4])
def test_fused_eagle_head_drafts_as_the_unfused_one(k, monkeypatch):
    """engine.fused_ops on the draft side runs the EAGLE head through the fused kernels too: fp32 logits and
    features of its passes equal the unfused head's to rounding, and greedy speculative output equals
    target-only with the same acceptance."""
    from attnlab.spec.eagle import EagleDrafter
    from tests.spec.tiny import eagle_runner, tiny_eagle

    model = tiny_model(CFG, seed=6)
    head = tiny_eagle(model, CFG, seed=2)
    ps = prompts(3, CFG.vocab_size)
    ref = SpeculativeDecoder(runner(model, CFG, 16), NoDrafter("cpu"), SpecParams(0)).generate(ps, 12)
    calls = []
    norm = fused.add_rmsnorm
    monkeypatch.setattr(fused, "add_rmsnorm", lambda *a, **kw: calls.append(1) or norm(*a, **kw))
    runs, firsts = [], []
    for on in (False, True):
        calls.clear()
        d = EagleDrafter(eagle_runner(head, 16, fused_ops=on))
        dec = SpeculativeDecoder(runner(model, CFG, 16), d, SpecParams(k))
        out = dec.generate(ps, 12)
        runs.append([(r.output_ids, r.accept_lens) for r in out.requests])
        t = runner(model, CFG, 16)
        t.capture_layers = d.capture_layers
        logits = t.run([0], [0], [len(ps[2])], torch.tensor(ps[2]), Mode.PREFILL)
        d.prefill([9], [ps[2]], logits.argmax(-1), t)
        firsts.append((d._logits.clone(), d._feat.clone()))
        assert bool(calls) == on  # the head's four norms: fused kernels on the fused side only
    assert runs[0] == runs[1] and [o for o, _ in runs[1]] == [r.output_ids for r in ref.requests]
    torch.testing.assert_close(firsts[1][0], firsts[0][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(firsts[1][1], firsts[0][1], atol=1e-4, rtol=1e-4)


def test_fused_is_a_side_property_not_the_weights(monkeypatch):
    """A parity reference shares the target's weights and must run unfused even when the target is fused."""
    from attnlab.kernels import fused as fused_mod

    model = tiny_model(CFG, seed=5)
    fused_side, plain_side = runner(model, CFG, 16, fused_ops=True), runner(model, CFG, 16)
    ids = torch.tensor([3, 1, 4, 1, 5])

    def boom(*a, **k):
        raise AssertionError("a fused kernel ran on the unfused side")

    monkeypatch.setattr(fused_mod, "add_rmsnorm", boom)
    plain_side.run([0], [0], [5], ids, mode=Mode.PREFILL)  # untouched by the other side's setting
    with pytest.raises(AssertionError, match="fused kernel"):
        fused_side.run([1], [0], [5], ids, mode=Mode.PREFILL)
