"""FP8 on CPU: KV quantization round trip (attnlab.kvcache.quant), FP8Linear and quantize_linears
(attnlab.models.fp8), the fp8 draft side of build_side, memory metrics, and the config errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.errors import ConfigError
from attnlab.kvcache import KVPool
from attnlab.kvcache.quant import (
    DEFAULT_KV_SCALE,
    dequantize,
    fp8_abs_floor,
    fp8_max,
    fp8_rel_err,
    kv_scale_for,
    quantize,
    roundtrip_bound,
)
from attnlab.models.fp8 import LINEAR_NAMES, FP8Linear, has_fp8_linears, quantize_linears, quantize_rows

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])


def _span(n: int, hi: float, decades: float, seed: int = 0) -> torch.Tensor:
    """n signed values log-uniform in [hi * 10^-decades, hi]: normal and subnormal fp8 ranges alike."""
    g = torch.Generator().manual_seed(seed)
    mag = hi * 10 ** (-decades * torch.rand(n, generator=g, dtype=torch.float64))
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return (mag * sign).float()


# -- KV quantization -----------------------------------------------------------------------------------------

def test_format_constants():
    assert (fp8_max(E4M3), fp8_max(E5M2)) == (448.0, 57344.0)
    assert (fp8_rel_err(E4M3), fp8_rel_err(E5M2)) == (2 ** -4, 2 ** -3)  # half an ulp: 3 and 2 mantissa bits
    assert (fp8_abs_floor(E4M3), fp8_abs_floor(E5M2)) == (2 ** -10, 2 ** -17)  # half the subnormal step
    with pytest.raises(ValueError):
        fp8_max(torch.bfloat16)


@FP8
@pytest.mark.parametrize("scale", [1 / 64, 0.5, 1.0, 8.0])
def test_roundtrip_within_bound(dtype, scale):
    # values from the format's max down 8 decades (deep into the subnormals, and some flushed to 0)
    x = _span(20000, scale * fp8_max(dtype), 8, seed=int(scale * 64))
    err = (dequantize(quantize(x, scale, dtype), scale) - x).abs()
    bound = roundtrip_bound(x, scale, dtype)
    assert (err <= bound * (1 + 1e-6)).all(), (err - bound).max()
    # the bound is nearly attained (not slack): some element comes within 20% of it
    assert (err / bound).max() > 0.8
    # in the normal range the relative error alone bounds it
    normal = x.abs() >= scale * torch.finfo(dtype).tiny
    assert ((err / x.abs())[normal] <= fp8_rel_err(dtype) * (1 + 1e-6)).all()


@FP8
def test_quantize_saturates(dtype):
    x = torch.tensor([1e9, -1e9, 3 * fp8_max(dtype)])
    assert quantize(x, 2.0, dtype).float().abs().max() == fp8_max(dtype)  # torch's e5m2 cast would give inf


@FP8
def test_kv_scale_for(dtype):
    amax = 37.5
    s = kv_scale_for(amax, dtype)
    assert dequantize(quantize(torch.tensor([amax]), s, dtype), s).item() == pytest.approx(amax, rel=1e-6)
    assert kv_scale_for(amax, dtype, margin=2.0) == pytest.approx(2 * s)
    assert kv_scale_for(0.0, dtype) == kv_scale_for(math.nan, dtype) == DEFAULT_KV_SCALE


@FP8
@pytest.mark.parametrize("scale", [0.25, 1.0])
def test_pool_store_quantizes_like_quant(dtype, scale):
    pool = KVPool(1, 2, 4, 2, 16, dtype, "cpu", k_scale=scale, v_scale=scale)
    k = _span(3 * 2 * 16, 50.0, 5, seed=1).view(3, 2, 16)
    v = _span(3 * 2 * 16, 2.0, 5, seed=2).view(3, 2, 16)
    pool.store(0, k, v, torch.tensor([0, 5, 2]))
    gk, gv = pool.gather(0, [0, 1], 6)
    torch.testing.assert_close(gk[[0, 5, 2]], dequantize(quantize(k, scale, dtype), scale), atol=0, rtol=0)
    torch.testing.assert_close(gv[[0, 5, 2]], dequantize(quantize(v, scale, dtype), scale), atol=0, rtol=0)


# -- FP8Linear -------------------------------------------------------------------------------------------------

def linear_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Worst-case |y8 - y| of the W8A8 row-wise product y = x @ w.T (fp32 accumulation ignored).

    Each operand element is off by at most r|e| + f_row (r = 2^-4; f_row = row scale * 2^-10, the subnormal
    floor, row scale = amax/448), so a'w' - aw = ea w + a ew + ea ew sums to at most
    (|x| r + fa) @ (|w| + |w| r + fw).T + |x| @ (|w| r + fw).T  (fa, fw per row of x, w).
    """
    r = fp8_rel_err(E4M3)
    fa = x.abs().amax(-1, keepdim=True) / 448 * 2 ** -10
    fw = w.abs().amax(-1, keepdim=True) / 448 * 2 ** -10
    ea, ew = x.abs() * r + fa, w.abs() * r + fw
    return ea @ (w.abs() + ew).t() + x.abs() @ ew.t()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(7, 64, 48), (33, 128, 256)])
def test_fp8_linear_emulation_vs_fp32(shape, bias):
    m, k, n = shape
    torch.manual_seed(m)
    lin = nn.Linear(k, n, bias=bias)
    x = torch.randn(2, m, k) * torch.logspace(-2, 1, k)  # uneven columns, as real activations
    f8 = FP8Linear.from_linear(lin, emulate=True)
    with torch.no_grad():
        y, y8 = lin(x), f8(x)
    assert y8.shape == y.shape and y8.dtype == torch.float32
    bound = linear_bound(x.reshape(-1, k), lin.weight.detach()).view_as(y)
    err = (y8 - y).abs()
    assert (err <= bound + 1e-5).all()
    # typical error is far below the worst case: relative Frobenius error under 2^-4 (measured ~0.02-0.03)
    assert (err.norm() / y.norm()).item() < 2 ** -4


def test_fp8_linear_weights_and_rows():
    w = torch.randn(32, 64) * torch.logspace(-3, 2, 32)[:, None]  # rows of very different magnitude
    w8, sw = quantize_rows(w)
    assert w8.dtype == E4M3 and sw.shape == (32, 1)
    assert torch.equal(w8.float().abs().amax(-1), torch.full((32,), 448.0))  # every row uses the full range
    # the KV round-trip bound with the row's scale: 2^-4 |w| + sw * 2^-10
    err = (w8.float() * sw - w).abs()
    assert (err <= fp8_rel_err(E4M3) * w.abs() + sw * fp8_abs_floor(E4M3) + 1e-12).all()
    z8, zs = quantize_rows(torch.zeros(3, 16))  # zero rows: no division by zero
    assert not z8.float().any() and torch.isfinite(zs).all()


def test_fp8_linear_scaled_mm_matches_emulation():
    """The torch._scaled_mm path (real fp8 GEMM) vs emulation, bf16 in/out. CPU torch has a row-wise
    _scaled_mm since 2.x; where it does not, this skips (the GPU run covers it)."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=True, dtype=torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    real, emu = FP8Linear.from_linear(lin), FP8Linear.from_linear(lin, emulate=True)
    try:
        y = real(x)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm row-wise unavailable on CPU here: {e}")
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), emu(x).float(), atol=2e-2, rtol=2 ** -7)


def test_fp8_linear_keeps_dtype_under_casts():
    f8 = FP8Linear.from_linear(nn.Linear(32, 16))
    f8.to(torch.bfloat16)
    assert f8.weight.dtype == E4M3 and f8.weight_scale.dtype == torch.float32
    with pytest.raises(ValueError):
        FP8Linear.from_linear(nn.Linear(32, 16), E5M2)


def _tiny_decoder(dtype=torch.float32):
    from attnlab.models.loading import load_model

    return load_model("tiny-llama", dtype=dtype, device="cpu", init="random", seed=0, progress=False)[0]


def test_quantize_linears_swaps_the_right_modules():
    model = _tiny_decoder()
    before = {n: p.clone() for n, p in model.state_dict().items()}
    q = quantize_linears(model, layers=[1])
    # the original is untouched
    assert not has_fp8_linears(model)
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())
    # layer 1's four projections swapped, layer 0, embeddings, norms and lm_head not
    for i, layer in enumerate(q.layers):
        for path in LINEAR_NAMES:
            mod = layer.get_submodule(path)
            assert isinstance(mod, FP8Linear) == (i == 1), (i, path)
            if i == 1:  # its role in attnlab.kernels.gemm: the K loop and split policy its small-M passes take
                assert mod.role == {"self_attn.qkv_proj": "qkv", "self_attn.o_proj": "o", "mlp.gate_up_proj": "gate_up",
                                    "mlp.down_proj": "down"}[path]
    assert type(q.lm_head) is nn.Linear and type(q.embed_tokens) is nn.Embedding
    # everything not swapped is shared, not copied
    assert q.embed_tokens.weight is model.embed_tokens.weight and q.norm.weight is model.norm.weight
    assert q.layers[0].self_attn.qkv_proj.weight is model.layers[0].self_attn.qkv_proj.weight
    full = quantize_linears(model)
    assert sum(isinstance(m, FP8Linear) for m in full.modules()) == 4 * len(model.layers)


def test_quantize_linears_emulated_model_stays_close():
    """End to end on the tiny model (emulated fp8 layers): logits stay close to fp32's."""
    from attnlab.backends.base import Mode
    from attnlab.backends.torch_ref import TorchBackend
    from attnlab.engine.runner import ModelRunner
    from attnlab.kvcache import PageAllocator

    model = _tiny_decoder()
    q = quantize_linears(model, emulate=True)
    cfg = model.config
    outs = []
    for m in (model, q):
        pool = KVPool(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
        be = TorchBackend(pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5, torch.float32)
        runner = ModelRunner(m, cfg, None, pool, PageAllocator(4, 16), be, 64)
        ids = torch.randint(0, cfg.vocab_size, (20,), generator=torch.Generator().manual_seed(1))
        outs.append(runner.run([0], [0], [20], ids, Mode.PREFILL, rows="all"))
    ref, got = outs
    assert (got - ref).norm() / ref.norm() < 2 ** -4


# -- build_side and memory metrics ----------------------------------------------------------------------------

def test_build_side_fp8_draft_shares_target_weights():
    """draft=self with fp8 weights: a copy of the target's projections in fp8, everything else shared.
    Runs the real torch._scaled_mm path on CPU where torch has it (config refuses fp8 weights on CPU; this
    calls build_side directly)."""
    from attnlab.engine.build import SideSpec, build_side
    from attnlab.metrics.perf import memory_metrics, weight_bytes
    from attnlab.plan import ModelSource

    common = {"page_size": 16, "num_pages": 8, "max_batch": 2, "max_context": 64, "device": "cpu"}
    tiny = ModelSource("tiny-llama", init="random")
    target = build_side(SideSpec(tiny, "torch", "bf16", "bf16", **common), progress=False)
    draft = build_side(SideSpec(tiny, "torch", "fp8_e4m3", "fp8_e4m3", name="draft", layers=(0,), kv_scale=0.5,
                                **common), share_weights_with=target, progress=False)
    assert not has_fp8_linears(target.model)
    qkv = draft.model.parent.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, FP8Linear) and not isinstance(draft.model.parent.layers[1].self_attn.qkv_proj,
                                                         FP8Linear)
    assert draft.model.parent.embed_tokens.weight is target.model.embed_tokens.weight
    assert (draft.pool.dtype, draft.pool.k_scale, draft.pool.v_scale) == (E4M3, 0.5, 0.5)
    assert draft.backend.dtype == torch.bfloat16 and target.pool.k_scale == 1.0

    m = memory_metrics({"target": target, "draft": draft})
    cfg = target.model_config
    assert m["kv_bytes_per_token_target"] == cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2
    assert m["kv_bytes_per_token_draft"] == 1 * 2 * cfg.num_kv_heads * cfg.head_dim * 1  # 1 layer, 1 byte
    assert m["kv_capacity_tokens_target"] == 8 * 16
    assert m["kv_pool_bytes_draft"] == 2 * 9 * 16 * cfg.num_kv_heads * cfg.head_dim  # + scratch page
    # draft reads: shared embeddings (tied lm_head) + norm + layer 0 with fp8 projections
    assert m["weight_bytes_draft"] < m["weight_bytes_target"]
    assert m["weight_bytes_total"] < m["weight_bytes_target"] + m["weight_bytes_draft"]
    assert weight_bytes(target.model) == m["weight_bytes_target"]
    try:
        ids = torch.randint(0, cfg.vocab_size, (10,))
        from attnlab.backends.base import Mode

        logits = draft.run([0], [0], [10], ids, Mode.PREFILL)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm row-wise unavailable on CPU here: {e}")
    assert logits.shape == (1, cfg.vocab_size) and torch.isfinite(logits).all()


# -- config ------------------------------------------------------------------------------------------------------

def _validate(*overrides):
    from attnlab.config import validate
    from tests.test_config import _compose

    return validate(_compose("model=tiny-llama", "device=cpu", *overrides))


@pytest.mark.parametrize("overrides,needle", [
    (["precision=fp8-draft"], "precision.draft='fp8_e4m3': fp8 weights need a CUDA GPU"),
    (["precision.draft=fp8_e4m3", "draft=self"], "precision.draft='fp8_e4m3'"),
    (["precision.draft=fp8_e5m2"], "precision.draft='fp8_e5m2': draft weights must be one of"),
    (["precision.target=fp8_e4m3"], "precision.target='fp8_e4m3': target weights must be one of"),
    (["precision.target=fp8_e5m2"], "precision.target='fp8_e5m2'"),
    (["precision.kv_scale=0"], "precision.kv_scale=0"),
    (["precision.kv_scale=-1.5"], "precision.kv_scale=-1.5"),
    (["precision.kv_target=fp8_e4m3", "verify=flashinfer"], "verify=flashinfer does not support device 'cpu'"),
])
def test_unsupported_precision_fails_at_config_time(overrides, needle):
    with pytest.raises(ConfigError) as e:
        _validate(*overrides)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_fp8_kv_validates_on_cpu_with_torch():
    r = _validate("precision=fp8-kv", "precision.target=fp32", "precision.draft=fp32", "draft=self",
                  "precision.kv_scale=0.25")
    p = r.precision
    assert (p.target, p.draft, p.kv_target, p.kv_draft, p.kv_scale) == ("fp32", "fp32", "fp8_e4m3", "fp8_e4m3", 0.25)


def test_backend_check_uses_the_compute_dtype_of_fp8_weights():
    from attnlab.config import check_backend, compute_dtype

    assert compute_dtype("fp8_e4m3") == "bf16" and compute_dtype("fp16") == "fp16"
    # triton lists bf16, not fp8_e4m3, as a compute dtype: fp8 weights must be checked as bf16
    check_backend("backend", "torch", device="cpu", dtype="fp8_e4m3", kv_dtype="fp8_e4m3", page_size=16,
                  max_context=64, topk=1, head_dim=64)
    # flashinfer lists fp8 KV (passed on an H200, 2026-12-01): without flashinfer / CUDA only availability stops it
    with pytest.raises(ConfigError, match="backend=flashinfer is unavailable here"):
        check_backend("backend", "flashinfer", device="cuda", dtype="bf16", kv_dtype="fp8_e5m2", page_size=16,
                      max_context=64, topk=1, head_dim=64)


def test_presets():
    from omegaconf import OmegaConf

    from attnlab.cli import CONF_DIR

    w = OmegaConf.load(CONF_DIR / "precision" / "fp8w-draft.yaml")
    assert (w.draft, w.fp8_gemm, w.get("fp8_mma", "auto")) == ("fp8_e4m3", "weight_only", "auto")  # auto: f16 here
    d = OmegaConf.load(CONF_DIR / "precision" / "fp8-draft.yaml")
    assert (d.target, d.draft, d.kv_target, d.kv_draft) == ("bf16", "fp8_e4m3", "bf16", "fp8_e4m3")
    k = OmegaConf.load(CONF_DIR / "precision" / "fp8-kv.yaml")
    assert (k.target, k.draft, k.kv_target, k.kv_draft) == ("bf16", "bf16", "fp8_e4m3", "fp8_e4m3")


def test_cli_fp8_weights_on_cpu_is_one_line_exit_2(tmp_path):
    from tests.cli.helpers import TINY, run_cli, stderr_lines

    proc = run_cli([*TINY, "precision=fp8-draft", "draft=self", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "precision.draft='fp8_e4m3'" in lines[0], lines


# -- weight-only fp8 at small M (precision.fp8_gemm=weight_only) ----------------------------------------------

@pytest.mark.parametrize("rows", [1, 7, 16])
def test_weight_only_small_m_matches_the_dequantized_weights(rows):
    """<= 16 rows: x (unquantized) times the dequantized e4m3 weights, through attnlab.kernels.gemm."""
    g = torch.Generator().manual_seed(rows)
    lin = nn.Linear(80, 48, bias=True).to(torch.bfloat16)
    x = torch.randn(rows, 80, generator=g).to(torch.bfloat16)
    wo = FP8Linear.from_linear(lin, small_m="weight_only", emulate=True)
    w8a8 = FP8Linear.from_linear(lin, emulate=True)
    ref = (x.float() @ wo.dequantized_weight().t() + wo.bias.float()).to(torch.bfloat16)
    y = wo(x)
    # fp32 sums in another order, one bf16 rounding (truncation under the interpreter): two bf16 ulps
    torch.testing.assert_close(y, ref, atol=2e-2, rtol=2 * 2.0**-7)
    assert not torch.equal(y, w8a8(x))  # it did not quantize the activations


def test_weight_only_large_m_stays_w8a8():
    lin = nn.Linear(32, 16, bias=False)
    x = torch.randn(17, 32, generator=torch.Generator().manual_seed(1))
    wo = FP8Linear.from_linear(lin, small_m="weight_only", emulate=True)
    assert torch.equal(wo(x), FP8Linear.from_linear(lin, emulate=True)(x))
    with pytest.raises(ValueError, match="small_m"):
        FP8Linear.from_linear(lin, small_m="w4a16")


def test_build_side_passes_fp8_gemm_to_the_projections():
    from attnlab.engine.build import SideSpec, build_side
    from attnlab.plan import ModelSource

    common = {"page_size": 16, "num_pages": 8, "max_batch": 2, "max_context": 64, "device": "cpu"}
    side = build_side(SideSpec(ModelSource("tiny-llama", init="random"), "torch", "fp8_e4m3", "bf16",
                               fp8_gemm="weight_only", **common), progress=False)
    linears = [m for m in side.model.modules() if isinstance(m, FP8Linear)]
    assert linears and all(m.small_m == "weight_only" for m in linears)


@pytest.mark.parametrize("tie", [False, True])
def test_fp8_lm_head_is_its_own_e4m3_copy(tie):
    """precision.fp8_lm_head: quantize_linears(lm_head=True) swaps the LM head for an FP8Linear of role lm_head (a
    tied head: its own copy, the embeddings untouched), leaves the source model as it was, and its logits are the
    dequantized head's."""
    import dataclasses

    from attnlab.models.decoder import Decoder
    from attnlab.models.presets import get_preset

    cfg = dataclasses.replace(get_preset("tiny-llama").config(), tie_word_embeddings=tie)
    torch.manual_seed(0)
    base = Decoder(cfg, dtype=torch.bfloat16).eval()
    head_before, emb = base.lm_head, base.embed_tokens.weight
    q = quantize_linears(base, emulate=True, small_m="weight_only", lm_head=True)
    assert base.lm_head is head_before and isinstance(base.lm_head, nn.Linear)  # the source keeps its bf16 head
    assert isinstance(q.lm_head, FP8Linear) and q.lm_head.role == "lm_head" and q.lm_head.weight.dtype == torch.float8_e4m3fn
    assert q.embed_tokens.weight is emb and emb.dtype == torch.bfloat16  # embeddings shared, still bf16
    assert not isinstance(quantize_linears(base, emulate=True).lm_head, FP8Linear)  # off by default
    h = torch.randn(3, cfg.hidden_size, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = (h.float() @ q.lm_head.dequantized_weight().t()).to(torch.bfloat16).float()
    torch.testing.assert_close(q.compute_logits(h), ref, atol=2e-2, rtol=2 * 2.0**-7)
    with pytest.raises(ValueError, match="lm_head=True"):
        quantize_linears(q, emulate=True, lm_head=True)  # already an FP8Linear: not an nn.Linear to quantize
    q.to("cpu")  # a move must not re-tie a tied e4m3 head to the bf16 embeddings (Decoder._finish)
    assert q.lm_head.weight.dtype == torch.float8_e4m3fn and q.embed_tokens.weight.dtype == torch.bfloat16
    torch.testing.assert_close(q.compute_logits(h), ref, atol=2e-2, rtol=2 * 2.0**-8)


def test_an_fp8_head_takes_the_gemm_path_weight_only_only():
    """ModelRunner._gemm_head: on a gemm-path side (engine.gemm=triton) a weight-only FP8Linear head runs on
    attnlab's GEMM, a W8A8 one (torch._scaled_mm at every M) never, and nothing does on another side."""
    from types import SimpleNamespace

    from attnlab.engine.runner import ModelRunner

    lin = nn.Linear(32, 64, bias=False).to(torch.bfloat16)
    h = torch.zeros(3, 32, dtype=torch.bfloat16)
    for small_m, takes in (("weight_only", True), ("w8a8", False)):
        head = FP8Linear.from_linear(lin, small_m=small_m, emulate=True, role="lm_head")
        model = SimpleNamespace(lm_head=head, compute_logits=None)
        assert (ModelRunner._gemm_head(SimpleNamespace(fused_ops="gemm", model=model), h) is head) == takes
        assert ModelRunner._gemm_head(SimpleNamespace(fused_ops=True, model=model), h) is None
        assert ModelRunner._gemm_head(SimpleNamespace(fused_ops="gemm", model=model), torch.zeros(17, 32)) is None


def test_build_side_fp8_lm_head():
    from attnlab.engine.build import SideSpec, build_side
    from attnlab.plan import ModelSource

    common = {"page_size": 16, "num_pages": 8, "max_batch": 2, "max_context": 64, "device": "cpu"}
    side = build_side(SideSpec(ModelSource("tiny-llama", init="random"), "torch", "fp8_e4m3", "bf16",
                               fp8_gemm="weight_only", fp8_lm_head=True, **common), progress=False)
    assert isinstance(side.model.lm_head, FP8Linear) and side.model.lm_head.small_m == "weight_only"
    # a self-drafter sharing the target's weights: its own e4m3 head, the target's stays bf16
    target = build_side(SideSpec(ModelSource("tiny-llama", init="random"), "torch", "bf16", "bf16", **common),
                        progress=False)
    for layers in (None, (0,)):
        draft = build_side(SideSpec(ModelSource("tiny-llama", init="random"), "torch", "fp8_e4m3", "bf16",
                                    fp8_gemm="weight_only", fp8_lm_head=True, layers=layers, name="draft", **common),
                           share_weights_with=target, progress=False)
        model = getattr(draft.model, "parent", draft.model)
        assert isinstance(model.lm_head, FP8Linear)
        assert type(target.model.lm_head) is nn.Linear and target.model.lm_head.weight.dtype == torch.bfloat16
        assert model.embed_tokens.weight is target.model.embed_tokens.weight
    with pytest.raises(ConfigError, match="fp8 LM head goes with fp8 weights"):
        build_side(SideSpec(ModelSource("tiny-llama", init="random"), "torch", "bf16", "bf16", fp8_lm_head=True,
                            **common), progress=False)
