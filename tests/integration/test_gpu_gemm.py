"""attnlab.kernels.gemm on the GPU: real layer shapes against cuBLAS, bitwise row invariance (tensor cores,
split-K), fp8 weights, and the gemm layer path in CUDA graphs with speculative decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.kernels import gemm
from attnlab.models.fp8 import quantize_rows
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NoDrafter
from tests.integration.test_gpu_engine import CFG, gpu_runner
from tests.spec.tiny import perturbed, prompts, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

def _captured(run):
    """(graph, outputs) of ``run()`` captured in a CUDA graph after one warmup on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    return graph, outs


# (N, K): SmolLM2 qkv / down, Llama-3.2-1B o, Llama-3.1-8B qkv / down (split-K 1..16 across these)
SHAPES = [(960, 576), (576, 1536), (2048, 2048), (6144, 4096), (4096, 14336)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_matches_cublas_and_rows_are_bit_identical(n, k, dtype):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(16, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(dtype)
    ref = F.linear(x.double(), w.double())
    y = gemm.linear(x, w)
    tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]  # ~2 ulps of O(1) outputs
    torch.testing.assert_close(y.double(), ref, atol=tol, rtol=tol)
    for m in (1, 2, 5, 9, 16):
        ym = gemm.linear(x[:m], w)
        assert torch.equal(ym, y[:m]), f"M={m}: rows differ from the same rows at M=16"
    for r in range(16):
        assert torch.equal(gemm.linear(x[r:r + 1], w), y[r:r + 1]), f"row {r} alone differs"


@pytest.mark.parametrize("n,k", SHAPES[:3])
def test_fp8_weights_and_fused_variants_are_row_invariant(n, k):
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    w8, sw = quantize_rows(w)
    nw = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    res = torch.randn(16, n, device="cuda", generator=g).to(torch.bfloat16)
    fns = {"fp8": lambda xx: gemm.linear(xx, w8, w_scale=sw.view(-1)),
           "norm-silu": lambda xx: gemm.gemm(xx, w, norm_weight=nw, epilogue="silu_mul"),
           "residual": lambda xx: gemm.gemm(xx, w, epilogue="residual", residual=res[:xx.shape[0]])}
    ref8 = (x.float() @ (w8.float() * sw).t()).to(torch.bfloat16)
    torch.testing.assert_close(fns["fp8"](x), ref8, atol=3e-2, rtol=2 * 2.0**-8)
    for name, fn in fns.items():
        full = fn(x)
        for m in (1, 5, 9):
            assert torch.equal(fn(x[:m]), full[:m]), f"{name}: M={m}"


@pytest.mark.parametrize("n,k", SHAPES)
def test_fp8_mode_half_matches_its_f16_reference_and_is_row_invariant(n, k):
    """fp8 mode half (precision.fp8_mma=f16, arm +f8half): e4m3 -> f16 by cvt.rn.f16x2.e4m3x2, the activations by the
    saturating cvt.rn.satfinite.f16x2.f32, an f16 MMA. Against torch on the same f16 operands (the activations clamped
    to +-65504, an out-of-range one included: the output stays finite), every epilogue the gemm path uses; rows
    bit-identical at M 1 / 5 / 9 against 16; ticket == pass racing 50 launches and 50 graph replays, PDL on."""
    from attnlab.kernels import pdl

    g = torch.Generator(device="cuda").manual_seed(5 * n + k)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    x[3, 1] = 1.0e6  # saturates to 65504 in f16
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    w8, sw = quantize_rows(w)
    sw = sw.view(-1)
    res = torch.randn(16, n, device="cuda", generator=g).to(torch.bfloat16)
    cs = torch.randn(16, 64, device="cuda", generator=g).to(torch.bfloat16)
    fns = {"plain": lambda xx: gemm.linear(xx, w8, w_scale=sw, role="o"),
           "silu_mul": lambda xx: gemm.gemm(xx, w8, w_scale=sw, epilogue="silu_mul", role="gate_up"),
           "rope": lambda xx: gemm.gemm(xx, w8, w_scale=sw, epilogue="rope", cos=cs[:xx.shape[0]], sin=cs[:xx.shape[0]],
                                        head_dim=64, rope_cols=n // 128 * 64, role="qkv"),
           "residual": lambda xx: gemm.gemm(xx, w8, w_scale=sw, epilogue="residual", residual=res[:xx.shape[0]],
                                            role="down")}
    with gemm.arm("fill/ticket+f8half"):
        plain = fns["plain"](x)
        assert torch.isfinite(plain.float()).all()
        ref = ((x.float().clamp(-65504, 65504).half().float() @ w8.float().t()) * sw).to(torch.bfloat16)
        torch.testing.assert_close(plain[torch.arange(16) != 3], ref[torch.arange(16) != 3], atol=3e-2,
                                   rtol=2 * 2.0**-8)
        # the saturated row: its sums are dominated by 65504 x w, so its near-zero outputs are differences of large
        # terms whose order differs between torch and the kernel; an absolute slack of 2^-6 of the row's scale
        torch.testing.assert_close(plain[3].float(), ref[3].float(), rtol=2 * 2.0**-8,
                                   atol=2.0**-6 * ref[3].float().abs().max().item())
        for name, fn in fns.items():
            full = fn(x)
            for m in (1, 5, 9):
                assert torch.equal(fn(x[:m]), full[:m]), f"{name}: M={m}"
        if not pdl.unsupported("cuda"):
            with pdl.using(True, "cuda"):
                refs = [fn(x[:m]) for fn in fns.values() for m in (1, 16)]
                with gemm.splitting("fill/pass"):
                    assert all(torch.equal(a, b) for a, b in zip([fn(x[:m]) for fn in fns.values() for m in (1, 16)],
                                                                 refs)), "pass against ticket"
                _same_bits_racing(lambda: [fn(x[:m]) for fn in fns.values() for m in (1, 16)], refs, "half")


@pytest.mark.parametrize("weights", ["bf16", "fp16", "fp8", "fp8half"])
@pytest.mark.parametrize("n,k", SHAPES + [(16384, 2048), (128256, 2048)])  # + 1B gate_up and LM head
def test_small_batch_tile_gives_the_16_row_tile_bits(n, k, weights):
    """gemm.small_tile (the default, +bm8): a pass of <= 8 rows on a K loop of fewer than 4 warps pads x to 8 rows, the
    MMA's N (one n8 block of mma.sync where the 16-row tile takes two). Every epilogue the gemm path uses: M 1 / 5 / 8 at
    the 8-row tile give the bits of the same rows at M 16, and the ticket gives the pass's bits racing; SHAPES split K
    1..16 ways. fp8 weights on their own loops (2 warps from LONG_K, where the tile acts; 4 below, where it must not),
    16-bit ones on a forced 2-warp loop (their default loops have 4 warps: the warp-group MMA at 16 rows and mma.sync
    at 8 summed apart on fp8's 4-warp loop, SmolLM2's down, on the H200: experiments/h200-2026-12-04f)."""
    dt = torch.float16 if weights == "fp16" else torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(7 * n + k)
    x = torch.randn(16, k, device="cuda", generator=g).to(dt)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(dt)
    res = torch.randn(16, n, device="cuda", generator=g).to(dt)
    cs = torch.randn(16, 64, device="cuda", generator=g).to(dt)
    kw = {}
    if weights.startswith("fp8"):
        w, sw = quantize_rows(w)
        kw["w_scale"] = sw.view(-1)
    fns = {"plain": lambda xx: gemm.gemm(xx, w, role="o", **kw),
           "residual": lambda xx: gemm.gemm(xx, w, epilogue="residual", residual=res[:xx.shape[0]], role="down", **kw)}
    if n <= 16384:
        fns["silu_mul"] = lambda xx: gemm.gemm(xx, w, epilogue="silu_mul", role="gate_up", **kw)
        if n % 128 == 0:
            fns["rope"] = lambda xx: gemm.gemm(xx, w, epilogue="rope", cos=cs[:xx.shape[0]], sin=cs[:xx.shape[0]],
                                               head_dim=64, rope_cols=n // 128 * 64, role="qkv", **kw)
    else:
        fns["lm_head"] = lambda xx: gemm.gemm(xx, w, role="lm_head", **kw)
    extra = {"fp8half": "+f8half", "fp8": "+f8wide"}.get(weights, "+k128s4w2")
    with gemm.arm(f"fill/pass{extra}+bm16"):
        refs = {name: fn(x) for name, fn in fns.items()}
    with gemm.arm(f"fill/pass{extra}+bm8"):
        warps = gemm.loop_for(w.dtype, x.dtype, k, "o")[3]
        small = k >= gemm.LONG_K or not weights.startswith("fp8")  # fp8 below LONG_K: its 4-warp loop
        assert gemm.batch_tile(8, x.dtype, warps) == (gemm.SMALL_BLOCK_M if small else gemm.BLOCK_M)
        for name, fn in fns.items():
            for m in (1, 5, 8):
                assert torch.equal(fn(x[:m]), refs[name][:m]), f"{name}, M={m}: the 8-row tile's rows differ"
    with gemm.arm(f"fill/ticket{extra}+bm8"):
        _same_bits_racing(lambda: [fn(x[:m]) for fn in fns.values() for m in (1, 5)],
                          [refs[name][:m] for name in fns for m in (1, 5)], "ticket, 8-row tile")
    assert not gemm._ticket_buffer(x.device).any()


@pytest.mark.parametrize("k", [512, 4096])  # 4096 >= LONG_K: fp8's own loop (128 x 4 x 2) and split target
@pytest.mark.parametrize("mode", ["ptx", "wide"])
@pytest.mark.parametrize("epilogue", ["none", "silu_mul", "rope"])
def test_fp8_to_bf16_in_ptx_is_exact_for_every_byte(mode, epilogue, k):
    """The fp8 modes that convert by gemm._E4M3X4_PTX (integer ops and a bf16x2 FMA) give every non-NaN e4m3 byte's
    value in each of the four byte positions of a 32-bit word: rows of x one-hot at column j read weight column j
    back through the GEMM (a single nonzero product: exact). A random GEMM gives the bits of Triton's own conversion
    (fp8 mode cast), plain and paired epilogues, at M 1 / 5 / 9."""
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8, device="cuda")
    n = 256  # rows of w: every code (rolled per column), padded with zeros
    w8 = torch.zeros(n, 16, dtype=torch.uint8, device="cuda")
    for j in range(4):
        w8[:len(codes), j] = codes.roll(17 * j)
    w8 = w8.view(torch.float8_e4m3fn)
    x = torch.zeros(16, 16, dtype=torch.bfloat16, device="cuda")
    x[torch.arange(16), torch.arange(16) % 4] = 1.0  # row r reads column r % 4
    g = torch.Generator(device="cuda").manual_seed(5)
    xr = torch.randn(9, k, device="cuda", generator=g).to(torch.bfloat16)
    wr, sr = quantize_rows((torch.randn(128, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16))
    kw = {"none": {}, "silu_mul": {"epilogue": "silu_mul"}}.get(epilogue)
    if kw is None:
        cs = torch.randn(9, 64, device="cuda", generator=g).to(torch.bfloat16)
        kw = {"epilogue": "rope", "cos": cs, "sin": cs, "head_dim": 64, "rope_cols": 64}
    with gemm.arm(f"fill/ticket+f8{mode}"):
        assert gemm._fp8_launch(x, w8)["FP8_MODE"] == gemm.FP8_MODES.index(mode)
        y = gemm.linear(x, w8, w_scale=torch.ones(n, device="cuda"))
        fast = gemm.gemm(xr, wr, w_scale=sr.view(-1), **kw)
        for m in (1, 5):
            kw_m = {**kw, **({"cos": kw["cos"][:m], "sin": kw["sin"][:m]} if "cos" in kw else {})}
            assert torch.equal(gemm.gemm(xr[:m], wr, w_scale=sr.view(-1), **kw_m), fast[:m])
    for r in range(16):
        assert torch.equal(y[r], w8[:, r % 4].float().to(torch.bfloat16)), f"byte position {r % 4}: a value differs"
    with gemm.arm("fill/ticket+f8cast"):
        slow = gemm.gemm(xr, wr, w_scale=sr.view(-1), **kw)
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("k", [0, 3])
def test_gemm_path_in_graphs_matches_unfused_eager(k):
    """bf16, CUDA graphs, engine.gemm=triton (its norms also as GEMM tails, +normtail; and triton_attn) on both sides vs
    the unfused eager engine: the same greedy tokens
    up to late near-ties (as the fused-ops test allows). Exact spec == target-only output also needs a
    row-invariant attention (decode vs verify kernels): the strict-parity issue's part, not tested here."""
    target = tiny_model(CFG, seed=0).to("cuda", torch.bfloat16)
    draft = perturbed(target, seed=1, noise=0.2)
    ps = prompts(3, CFG.vocab_size)
    outs = []
    for mode, graphs, place in ((False, False, "sep"), ("gemm", True, "sep"), ("gemm", True, "tail"),
                                ("gemm_attn", True, "sep")):
        with gemm.arm(f"{gemm.DEFAULT_SPLIT_MODE}+norm{place}"):
            t = gpu_runner(target, "triton", torch.bfloat16, graphs, fused_ops=mode)
            d = ModelDrafter(gpu_runner(draft, "triton", torch.bfloat16, graphs, name="draft", fused_ops=mode)) \
                if k else NoDrafter("cuda")
            if graphs:
                t.capture_graphs(q_lens=sorted({1, k + 1}))
                if k:
                    d.runner.capture_graphs(q_lens=(1,), num_slots=k)
            outs.append([r.output_ids for r in SpeculativeDecoder(t, d, SpecParams(k)).generate(ps, 24).requests])
    for out in outs[1:]:
        same = sum(a == b for x, y in zip(outs[0], out) for a, b in zip(x, y))
        assert same / sum(map(len, outs[0])) >= 0.9



@pytest.mark.parametrize("n,k", SHAPES)
def test_ticket_reduction_is_the_reduce_pass_bit_for_bit_racing_and_in_graphs(n, k):
    """engine.gemm_split=*/ticket: the last split program of a column tile sums the partials. Compiled, with
    programs racing on real SMs: 50 launches and 50 graph replays give the reduce pass's bits every time (a
    missing fence or a ticket left non-zero would show as a wrong or stale tile), with PDL off and on."""
    from attnlab.kernels import pdl

    g = torch.Generator(device="cuda").manual_seed(n * 3 + k)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    nw = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    for on in (False, True) if not pdl.unsupported("cuda") else (False,):
        with pdl.using(on, "cuda"):
            for policy in ("fill", "lean", "wave"):
                with gemm.splitting(f"{policy}/pass"):
                    refs = [gemm.linear(x[:m], w) for m in (1, 16)] + [gemm.gemm(x[:5], w, norm_weight=nw)]
                with gemm.splitting(f"{policy}/ticket"):
                    _same_bits_racing(lambda: [gemm.linear(x[:m], w) for m in (1, 16)]
                                      + [gemm.gemm(x[:5], w, norm_weight=nw)], refs, policy)
    assert not gemm._ticket_buffer(x.device).any()


@pytest.mark.parametrize("weights", ["bf16", "fp8"])
@pytest.mark.parametrize("n,k,epilogue,extra", [(1920, 576, "silu_mul", "+gate_up.fill"),  # SmolLM2 gate_up, split
                                                (2000, 1536, "silu_mul", ""),  # a ragged last tile (N / 2 = 1,000)
                                                (16384, 2048, "silu_mul", ""), (3072, 2048, "rope", ""),  # 1B
                                                (28672, 4096, "silu_mul", "")])  # 8B gate_up
def test_paired_loop_one_dot_against_two(n, k, epilogue, extra, weights):
    """gemm.pair_dots on real SMs (gate_up at SmolLM2 / 1B / 8B shapes, a ragged one, 1B qkv with RoPE): the one-dot
    loop (the default, warp-group MMA) and the dot per half (+pair2, mma.sync) give the same outputs up to their
    sums' order; each is row-invariant (M 1 / 5 / 9 against 16), and where it splits K its ticket reduction gives the
    pass's bits racing (elsewhere the race checks that launches and replays repeat their bits)."""
    import triton

    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    role = "gate_up" if epilogue == "silu_mul" else "qkv"
    kw = {"epilogue": epilogue, "role": role}
    if epilogue == "rope":
        cs = torch.randn(16, 64, device="cuda", generator=g).to(torch.bfloat16)
        kw.update(cos=cs, sin=cs.flip(-1), head_dim=64, rope_cols=2560)
    if weights == "fp8":
        w8, sw = quantize_rows(w)
        kw["w_scale"], w = sw.view(-1), w8

    def run(m):
        return gemm.gemm(x[:m], w, **{key: v[:m] if key in ("cos", "sin") else v for key, v in kw.items()})

    outs = {}
    for dots in (1, 2):
        with gemm.arm(f"fill/pass{extra}+pair{dots}"):
            refs = [run(m) for m in (1, 5, 9, 16)]
            block_n, block_k = gemm.loop_for(w.dtype, x.dtype, k, role)[:2]
            target = gemm.TARGET_PROGRAMS * (gemm.fp8_programs(k) if weights == "fp8" else 1)
            splits = gemm.split_k(triton.cdiv(n // 2, block_n // 2), k, block_k, gemm.policy_for(role), target)[0]
        assert splits > 1 or (n, weights) in ((16384, "bf16"), (28672, "bf16"), (28672, "fp8")), (n, k, splits)
        for m, ref in zip((1, 5, 9), refs):
            assert torch.equal(ref, refs[-1][:m]), f"pair{dots}: M={m}"
        with gemm.arm(f"fill/ticket{extra}+pair{dots}"):
            _same_bits_racing(lambda: [run(m) for m in (1, 5, 9, 16)], refs, f"pair{dots}, {splits} splits")
        outs[dots] = refs[-1]
    torch.testing.assert_close(outs[1].float(), outs[2].float(), atol=3e-2, rtol=2 * 2.0**-8)  # ~2 bf16 ulps
    assert not gemm._ticket_buffer(x.device).any()


def _same_bits_racing(run, refs, what: str) -> None:
    """``run()`` gives ``refs``' bits 50 times eagerly and over 50 replays of its CUDA graph (programs racing on
    their tickets: a missing fence or a ticket left taken would show as a wrong or stale tile)."""
    for _ in range(50):
        assert all(torch.equal(a, b) for a, b in zip(run(), refs)), f"{what}: eager launch"
    graph, outs = _captured(run)
    for _ in range(50):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(outs, refs)), f"{what}: graph replay"


@pytest.mark.parametrize("n,k", [(576, 576), (576, 1536), (2048, 2048), (2048, 8192), (4096, 4096), (4096, 14336)])
def test_tail_norm_racing_in_graphs_and_row_invariant(n, k):
    """tail_norm on real SMs (o_proj / down_proj at SmolLM2, 1B, 8B shapes; split and unsplit): the stream is the
    residual GEMM's bits; its norm is RMSNorm's up to the sum's fp32 order; rows of M = 1 / 5 equal those of M = 16
    bit for bit; 50 launches and 50 graph replays racing on the ticket give the same bits every time, ticket and
    pass reductions, PDL off and on, and the tickets are free after."""
    from attnlab.kernels import fused, pdl

    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    res = torch.randn(16, n, device="cuda", generator=g).to(torch.bfloat16)
    nw = (torch.rand(n, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    role = "o" if k < 4 * n else "down"
    for on in (False, True) if not pdl.unsupported("cuda") else (False,):
        with pdl.using(on, "cuda"):
            for mode in ("fill/ticket", "fill/pass", "lean/ticket"):
                with gemm.splitting(mode):
                    def run():
                        return [t for m in (1, 5, 16) for t in gemm.gemm(
                            x[:m], w, epilogue="residual", residual=res[:m], role=role, tail_norm=(nw, 1e-5))]
                    refs = run()
                    h16 = gemm.gemm(x, w, epilogue="residual", residual=res, role=role)
                    assert torch.equal(refs[4], h16)
                    # a few bf16 ulps (2^-8 relative each): the two kernels sum the squares in other fp32 orders, so
                    # rstd may differ in its last fp32 ulp and flip both bf16 roundings of an element
                    torch.testing.assert_close(refs[5], fused.add_rmsnorm(h16, None, nw, 1e-5)[0], atol=0.02, rtol=0.02)
                    assert torch.equal(refs[1], refs[5][:1]) and torch.equal(refs[3], refs[5][:5]), mode
                    _same_bits_racing(run, refs, mode)
    for warps in (2, 8):  # a forced warp count: the pass kernel's tail runs at the GEMM's warps, so its bits are ticket's
        got = []
        for reduce in ("pass", "ticket"):
            with gemm.arm(f"fill/{reduce}+k128s3w{warps}"):
                got.append(gemm.gemm(x[:5], w, epilogue="residual", residual=res[:5], role=role, tail_norm=(nw, 1e-5)))
        assert all(torch.equal(a, b) for a, b in zip(*got)), f"w{warps}: pass and ticket tails differ"
    assert not gemm._ticket_buffer(x.device).any()


def test_qkv_epilogue_kv_store_on_the_gpu():
    """The qkv GEMM's KV store compiled (SmolLM2's shape, split under fill): the pool slots hold the output's k and v
    columns bit for bit; slot -1 rows store nothing."""
    heads, kv_heads, d, hidden = 9, 3, 64, 576
    n = (heads + 2 * kv_heads) * d
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(5, hidden, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, hidden, device="cuda", generator=g) / hidden**0.5).to(torch.bfloat16)
    nw = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    cs = torch.rand(5, d, device="cuda", generator=g).to(torch.bfloat16)
    cache = torch.zeros(2, 64, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([3, -1, 17, 40, 9], device="cuda")
    for mode in gemm.SPLIT_MODES:
        cache.zero_()
        with gemm.splitting(mode):
            y = gemm.gemm(x, w, norm_weight=nw, epilogue="rope", cos=cs, sin=cs, head_dim=d,
                          rope_cols=(heads + kv_heads) * d, kv_store=(cache[0], cache[1], slots))
        q_cols, kv = heads * d, kv_heads * d
        for r, s in enumerate(slots.tolist()):
            if s >= 0:
                assert torch.equal(cache[0, s].reshape(-1), y[r, q_cols:q_cols + kv]), mode
                assert torch.equal(cache[1, s].reshape(-1), y[r, q_cols + kv:]), mode
        assert int((cache.reshape(2, 64, -1).abs().sum(-1) > 0).sum()) <= 8, mode  # 4 slots x k, v


@pytest.mark.parametrize("n,k", SHAPES)
def test_weight_prefetch_changes_no_bit(n, k):
    """engine.gemm_prefetch: the programs prefetch their weight rows into L2 before the PDL wait. A hint only: with
    PDL on, every variant (plain, fp8 weights, RMSNorm + SiLU-mul, residual) gives the same bits at 0, 2 and 16
    chunks, eagerly and in a graph replayed 20 times."""
    from attnlab.kernels import pdl

    if pdl.unsupported("cuda"):
        pytest.skip(pdl.unsupported("cuda"))
    g = torch.Generator(device="cuda").manual_seed(n + 2 * k)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    w8, sw = quantize_rows(w)
    nw = (torch.rand(k, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
    res = torch.randn(16, n, device="cuda", generator=g).to(torch.bfloat16)

    def run():
        return [gemm.linear(x[:m], w) for m in (1, 16)] + [
            gemm.linear(x[:5], w8, w_scale=sw.view(-1)), gemm.gemm(x[:5], w, norm_weight=nw, epilogue="silu_mul"),
            gemm.gemm(x[:9], w, epilogue="residual", residual=res[:9])]

    with pdl.using(True, "cuda"):
        refs = run()
        for chunks in (2, 16):
            with gemm.prefetching(chunks):
                _same_bits_racing(run, refs, f"prefetch {chunks}")


@pytest.mark.parametrize("n,k", [(49152, 576), (128256, 2048)])
def test_argmax_epilogue_on_lm_heads(n, k):
    """The LM head's argmax epilogue at SmolLM2's and Llama-3's vocabularies (768 and 2,004 column tiles, the last
    program reducing them in blocks): the first maximal column of the same GEMM's logits, row-invariant, racing
    launches and graph replays, with PDL and the prefetch where they apply; the ticket back at 0."""
    from attnlab.kernels import pdl

    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    w[n - 7] = w[11]  # an exact tie across tiles: column 11 must win where it is the max
    x[3] = w[11]
    want = gemm.linear(x, w).float().argmax(-1)
    assert int(want[3]) == 11
    for on in (False, True) if not pdl.unsupported("cuda") else (False,):
        with pdl.using(on, "cuda"):
            for m in (1, 5, 16):
                assert torch.equal(gemm.argmax_linear(x[:m], w), want[:m]), f"M={m}"
            for _ in range(20):
                assert torch.equal(gemm.argmax_linear(x, w), want)
            graph, out = _captured(lambda: gemm.argmax_linear(x[:5], w))
            for _ in range(20):
                graph.replay()
                torch.cuda.synchronize()
                assert torch.equal(out, want[:5])
    assert not gemm._ticket_buffer(x.device).any()


def test_fp8_lm_head_on_the_gemm_path():
    """precision.fp8_lm_head on a gemm-path side (engine.gemm=triton): the runner takes the e4m3 head through
    attnlab's GEMM with its row scales (``_gemm_head``), giving the bits of the head's own forward, and its greedy
    tokens are those logits' argmax; rows stay M-invariant."""
    from attnlab.bench.e2e import side
    from attnlab.models.fp8 import FP8Linear

    rs = side("tiny-llama", "triton", 2, False, 64, fused="gemm", weights="fp8wh")
    head = rs.model.lm_head
    assert isinstance(head, FP8Linear) and head.small_m == "weight_only" and head.role == "lm_head"
    g = torch.Generator(device="cuda").manual_seed(2)
    h = torch.randn(9, head.in_features, device="cuda", generator=g).to(torch.bfloat16)
    assert rs._gemm_head(h) is head
    logits = rs.logits(h)
    assert torch.equal(logits, rs.model.compute_logits(h))
    ref = (h.float() @ head.dequantized_weight().t()).to(torch.bfloat16).float()
    torch.testing.assert_close(logits, ref, atol=3e-2, rtol=2 * 2.0**-8)
    assert torch.equal(rs.greedy_tokens(h), logits.argmax(-1))
    for m in (1, 5):
        assert torch.equal(rs.logits(h[:m]), logits[:m])
