"""The EAGLE head on attnlab's small-M GEMM (engine.gemm=triton on the draft side: EagleHead._forward_gemm) against the
unfused head, on tiny random models under the interpreter (CPU): fc, qkv (RoPE and the KV store in its epilogue), o and
down (residual adds, tail norms), gate_up (SiLU-mul) through the GEMM, with 16-bit or e4m3 weights; longer passes fall
back to the fused cuBLAS path. Tolerances as tests/models/test_gemm_path.py's (the GEMM sums K in its own order)."""

from __future__ import annotations

import pytest
import torch

from attnlab.backends.base import Mode
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.eagle import EagleDrafter
from tests.spec.tiny import eagle_runner, prompts, runner, tiny_config, tiny_eagle, tiny_model

CFG = tiny_config(layers=4)


def _head(dtype, fp8=None, seed=3):
    target = tiny_model(CFG, seed=0, dtype=dtype)
    head = tiny_eagle(target, CFG, seed=seed)
    if fp8:
        head.quantize_fp8(small_m="weight_only", lm_head=fp8 == "fp8wh")
    return target, head


def _pass(head, fused_ops, rows: int, width: int, seed=5):
    """One pass of ``rows`` single-token requests with features of ``width`` -> (logits, the head's captured output,
    the pool's K and V of layer 0 for those slots)."""
    r = eagle_runner(head, fused_ops=fused_ops)
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(rows, width, generator=g).to(head.dtype)
    ids = torch.randint(0, CFG.vocab_size, (rows,), generator=g)
    p = r.prepare(list(range(rows)), [3 + 7 * i for i in range(rows)], [1] * rows, Mode.DECODE)  # positions apart
    r.plan(p)
    logits = r.forward(p, ids, features=feats)
    kv = r.pool.layer(0).view(2, -1, CFG.num_kv_heads, CFG.head_dim)[:, p.slots].float()
    return logits, r.aux.float(), kv


@pytest.mark.parametrize("dtype,fp8,arm", [(torch.float32, None, "fill/ticket"), (torch.float32, None, "fill/pass+normsep"),
                                           (torch.bfloat16, None, "fill/ticket"), (torch.bfloat16, "fp8w", "fill/ticket"),
                                           (torch.bfloat16, "fp8wh", "fill/ticket+normsep")])
@pytest.mark.parametrize("features", ["target", "own"])
def test_the_head_on_the_gemm_matches_the_unfused_head(dtype, fp8, arm, features):
    """The pre-norm output (the next step's feature), K and V as stored by qkv's epilogue, and the logits; norms in
    the o / down GEMMs' tails (the default at this width) or as their own launches (+normsep), split-K reduced by
    ticket or by a second launch."""
    from attnlab.kernels import gemm

    _, head = _head(dtype, fp8)
    width = head.config.feature_dim if features == "target" else head.config.hidden_size
    ref = _pass(head, False, 5, width)
    with gemm.arm(arm):
        got = _pass(head, "gemm", 5, width)
    scale = ref[1].abs().max().item()
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3 * 2.0**-8 * scale, "rtol": 3 * 2.0**-8}
    torch.testing.assert_close(got[1], ref[1], **tol)  # the pre-norm output: the next step's feature
    torch.testing.assert_close(got[2], ref[2], **({"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else
                                                 {"atol": 2**-6, "rtol": 2**-6}))  # K, V stored by qkv's epilogue
    finite = torch.isfinite(ref[0])
    assert torch.equal(finite, torch.isfinite(got[0]))  # the same draft vocabulary
    lt = ref[0][finite].abs().max().item()
    torch.testing.assert_close(got[0][finite], ref[0][finite], atol=(1e-4 if dtype == torch.float32 else
                                                                    4 * 2.0**-8 * lt), rtol=1e-2)


def test_the_gemm_runs_every_projection_and_falls_back_above_16_rows(monkeypatch):
    from attnlab.kernels import fused, gemm
    from attnlab.models import rope

    _, head = _head(torch.float32)
    calls, rope_ops, tables = [], [], []
    real, real_rope, real_cos_sin = gemm.gemm, fused.rope_qk, rope.cos_sin
    monkeypatch.setattr(gemm, "gemm", lambda x, *a, **k: calls.append((x.shape[0], k.get("epilogue"))) or
                        real(x, *a, **k))
    monkeypatch.setattr(fused, "rope_qk", lambda *a, **k: rope_ops.append(1) or real_rope(*a, **k))
    monkeypatch.setattr(rope, "cos_sin", lambda *a, **k: tables.append(a[0].shape[0]) or real_cos_sin(*a, **k))
    _pass(head, "gemm", 4, head.config.feature_dim)
    # fc, qkv (RoPE + store), o (+ residual), gate_up (SiLU-mul), down (+ residual): no RoPE kernel of its own
    assert calls == [(4, None), (4, "rope"), (4, "residual"), (4, "silu_mul"), (4, "residual")] and not rope_ops
    assert tables == [256]  # cos / sin once, over the runner's 256 positions (rope_tables), none in the pass
    calls.clear()
    _pass(head, "gemm", 4, head.config.hidden_size)
    assert [e for _, e in calls] == ["rope", "residual", "silu_mul", "residual"]  # its own feature: no fc
    calls.clear()
    _pass(head, "gemm", 17, head.config.feature_dim)  # > gemm.MAX_M rows: the fused cuBLAS path
    assert calls == [] and rope_ops


def test_a_w8a8_head_keeps_its_activation_quantization_on_the_gemm_engine(monkeypatch):
    """precision=fp8-draft's W8A8 e4m3 projections are not weight-only: on engine.gemm=triton the head takes the
    fused path, where FP8Linear quantizes its activations, never attnlab's GEMM (which would run them weight-only)."""
    from attnlab.kernels import gemm
    from attnlab.models.fp8 import FP8Linear
    from tests.spec.test_eagle_fp8 import _scaled_mm_on_cpu

    if not _scaled_mm_on_cpu():
        pytest.skip("this torch has no CPU torch._scaled_mm (row-wise)")
    _, head = _head(torch.bfloat16)
    head.quantize_fp8(small_m="w8a8")
    calls, w8a8 = [], []
    real, real_fwd = gemm.gemm, FP8Linear.forward
    monkeypatch.setattr(gemm, "gemm", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    monkeypatch.setattr(FP8Linear, "forward", lambda self, x: w8a8.append(self.small_m) or real_fwd(self, x))
    ref, got = _pass(head, False, 4, head.config.feature_dim), _pass(head, "gemm", 4, head.config.feature_dim)
    assert calls == [] and w8a8 == ["w8a8"] * 10  # fc, qkv, o, gate_up, down in each pass
    torch.testing.assert_close(got[1], ref[1], atol=3 * 2.0**-8 * ref[1].abs().max().item(), rtol=3 * 2.0**-8)


def test_greedy_eagle_on_the_gemm_drafts_as_the_unfused_head():
    """fp32: the same proposals iteration after iteration (a near-tie apart, which these seeds do not have), the
    target's own output, every page back."""
    target, _ = _head(torch.float32)
    ps = prompts(3, CFG.vocab_size)
    runs = []
    for mode in (False, "gemm"):
        d = EagleDrafter(eagle_runner(tiny_eagle(target, CFG, seed=11), fused_ops=mode))
        proposed, propose = [], d.propose

        def record(*a, _p=propose, _out=proposed, **kw):
            toks, probs = _p(*a, **kw)
            _out.append(toks.clone())
            return toks, probs

        d.propose = record
        out = SpeculativeDecoder(runner(target, CFG), d, SpecParams(3)).generate(ps, 12)
        assert d.runner.allocator.num_free == d.runner.allocator.num_pages
        runs.append((proposed, [r.output_ids for r in out.requests]))
    (p0, o0), (p1, o1) = runs
    assert o0 == o1 and len(p0) == len(p1) > 2 and all(torch.equal(x, y) for x, y in zip(p0, p1))


def test_the_heads_rope_tables_change_no_bit():
    """The head's cos / sin over positions (EagleHead.rope_tables, read by qkv's epilogue) against the per-pass torch
    cos / sin (arm +ropecalc): the same logits, feature and stored K, bit for bit (bf16)."""
    from attnlab.kernels import gemm

    _, head = _head(torch.bfloat16)
    outs = []
    for arm in ("fill/ticket", "fill/ticket+ropecalc"):
        with gemm.arm(arm):
            outs.append(_pass(head, "gemm", 6, head.config.feature_dim))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
