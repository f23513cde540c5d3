"""The small-M GEMM (attnlab/kernels/gemm.py) against torch, and its row invariance, under the interpreter.

Shapes are small but cover a split-K shape (few N tiles, long K: both reductions of the partials, the second launch
and the ticket), a single-split one, N and K that are not multiples of the tile, and each fused prologue / epilogue.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from attnlab.kernels import gemm
from attnlab.models import rope
from attnlab.models.decoder import RMSNorm
from attnlab.models.fp8 import quantize_rows

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(96, 80), (200, 300), (64, 1100)]  # (N, K): one split; 2 splits, ragged; 8+ splits of a 1-tile N


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    # The kernel and torch sum K in different orders in fp32, then round once: the outputs differ by at most
    # about an ulp of the output dtype (two here: the interpreter rounds fp32 -> bf16 by truncation, a GPU to
    # nearest even), on values of size ~sqrt(K); fp32: a few ulps of the sum's magnitude.
    tol = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-3), torch.bfloat16: (1e-1, 2 * 2.0**-7)}[dtype]
    torch.testing.assert_close(a, b, atol=tol[0], rtol=tol[1])


def _data(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed * 7919 + m * 131 + n + k)
    return torch.randn(m, k, generator=g).to(dtype), (torch.randn(n, k, generator=g) / k**0.5).to(dtype), g


def test_split_k_is_a_function_of_n_and_k_only():
    assert gemm.split_k(448, 4096, 128) == (1, 4096)  # 8B gate_up: N fills the SMs
    s, per = gemm.split_k(64, 4096, 128)  # 8B o_proj: 64 tiles -> split 2
    assert s == 2 and per * s >= 4096
    s, per = gemm.split_k(1, 1100, 64)
    assert s > 1 and (s - 1) * per < 1100 <= s * per  # every split gets K, none is empty


@pytest.mark.parametrize("epilogue", ["none", "silu_mul", "residual"])
def test_long_k_takes_the_256_loop_row_invariant(epilogue):
    """K >= LONG_K runs BLOCK_K 256 by default (split into 256-wide chunks): rows M-invariant, values torch's."""
    k = 2304
    assert gemm.loop_for(torch.bfloat16, torch.bfloat16, k)[1] == 256
    x, w, g = _data(16, 64, k, torch.bfloat16, seed=15)
    res = torch.randn(16, 32 if epilogue == "silu_mul" else 64, generator=g).to(torch.bfloat16)
    kw = {"epilogue": epilogue, **({"residual": res} if epilogue == "residual" else {})}
    full = gemm.gemm(x, w, **kw)
    for m in (1, 5):
        kw_m = {**kw, **({"residual": res[:m]} if epilogue == "residual" else {})}
        assert torch.equal(gemm.gemm(x[:m], w, **kw_m), full[:m])
    y = F.linear(x.float(), w.float()).to(torch.bfloat16).float()
    if epilogue == "silu_mul":
        gate, up = y.split(32, dim=-1)
        y = (F.silu(gate).to(torch.bfloat16).float() * up)
    elif epilogue == "residual":
        y = res.float() + y
    _close(full, y.to(torch.bfloat16), torch.bfloat16)


def test_wave_split_fills_whole_waves_net_of_partials():
    """wave: the power-of-two split whose programs fill whole waves of 132 best, net of the partials' traffic.
    Column tiles as the gemm path makes them (BLOCK_N 64; paired RoPE / SiLU epilogues 32)."""
    assert gemm.wave_efficiency(132) == gemm.wave_efficiency(264) == 1.0
    assert abs(gemm.wave_efficiency(192) - 192 / 264) < 1e-12
    cases = {  # (tiles, K): (fill, wave) splits
        (96, 4096): (2, 4),  # Llama-3.1-8B qkv: 192 programs (1.45 waves) -> 384 (2.9)
        (448, 4096): (1, 2),  # 8B gate_up: 448 (3.4 waves) -> 896 (6.8); 16 would fill better but costs partials
        (64, 4096): (2, 2),  # 8B o
        (64, 14336): (2, 2),  # 8B down
        (2004, 4096): (1, 1),  # an LM head: never split
        (48, 2048): (2, 8),  # Llama-3.2-1B qkv: 96 programs -> 384
        (15, 576): (3, 1),  # SmolLM2 qkv: K of 5 chunks, unsplit as lean
    }
    for (tiles, k), (fill, wave) in cases.items():
        assert gemm.split_k(tiles, k, 128)[0] == fill, (tiles, k)
        s, per = gemm.split_k(tiles, k, 128, "wave")
        assert s == wave and (s - 1) * per < k <= s * per, (tiles, k)
    # at the engine's own BLOCK_K for these K (256 from LONG_K): 8B qkv / gate_up as above; a 70B LM head unsplit
    bk = gemm.loop_for(torch.bfloat16, torch.bfloat16, 4096)[1]
    assert bk == 256 and gemm.split_k(96, 4096, bk, "wave")[0] == 4 and gemm.split_k(448, 4096, bk, "wave")[0] == 2
    assert gemm.split_k(2004, 8192, 256, "wave")[0] == 1
    # a chunk count that no power of two divides: the cost is that of the splits the launch really makes
    s, per = gemm.split_k(9, 14336, 128, "wave")
    assert (s - 1) * per < 14336 <= s * per
    with pytest.raises(ValueError, match="policy"):
        gemm.split_k(4, 4096, 128, "even")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 2, 5, 16])
def test_linear_matches_torch(m, n, k, dtype):
    x, w, g = _data(m, n, k, dtype)
    bias = torch.randn(n, generator=g).to(dtype) if m == 2 else None
    y = gemm.linear(x, w, bias)
    assert y.shape == (m, n) and y.dtype == dtype
    ref = F.linear(x.float(), w.float(), bias.float() if bias is not None else None).to(dtype)
    _close(y, ref, dtype)


def test_zero_rows_and_too_many_rows():
    x, w, _ = _data(1, 64, 32, torch.float32)
    assert gemm.linear(x[:0], w).shape == (0, 64)
    with pytest.raises(ValueError, match="M=17"):
        gemm.linear(torch.zeros(17, 32), w)
    with pytest.raises(ValueError, match="epilogue"):
        gemm.gemm(x, w, epilogue="gelu")


def _variants(dtype):
    """(name, fn(x) -> y) for every kernel variant, on one (N, K) with split-K and one without."""
    out = []
    for n, k in ((256, 96), (64, 520), (64, 1100)):  # 1100: split under lean too
        _, w, g = _data(1, n, k, dtype, seed=1)
        nw = (torch.rand(k, generator=g) + 0.5).to(dtype)
        out.append((f"linear-{n}x{k}", lambda x, w=w: gemm.linear(x, w)))
        out.append((f"norm-silu-{n}x{k}", lambda x, w=w, nw=nw: gemm.gemm(x, w, norm_weight=nw,
                                                                            epilogue="silu_mul")))
        w8, sw = quantize_rows(w)
        out.append((f"fp8-{n}x{k}", lambda x, w8=w8, sw=sw: gemm.linear(x, w8, w_scale=sw.reshape(-1))))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_bit_identical_whatever_m(dtype):
    """A row computed alone (decode, M = 1) equals, bit for bit, the same row inside M = 5, 9, 16 (verify),
    wherever it sits and whatever the other rows hold."""
    g = torch.Generator().manual_seed(5)
    for name, fn in _variants(dtype):
        k = int(name.rsplit("x", 1)[1])
        for m in (5, 9, 16):
            xs = torch.randn(m, k, generator=g).to(dtype) * 3
            ys = fn(xs)
            for r in (0, m - 1):
                assert torch.equal(ys[r:r + 1], fn(xs[r:r + 1])), f"{name}: row {r} of M={m} differs from M=1"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(96, 80), (64, 1100)])
@pytest.mark.parametrize("m", [1, 7])
def test_norm_prologue_and_residual_epilogue(m, n, k, dtype):
    x, w, g = _data(m, n, k, dtype, seed=2)
    norm = RMSNorm(k, 1e-5, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, generator=g) + 0.5)
    h = norm(x)  # the unfused path: RMSNorm, then the GEMM
    outs = []
    for split in gemm.SPLIT_MODES:  # the normalized rows go through the scratch, split or not
        with gemm.splitting(split):
            outs.append(gemm.gemm(x, w, norm_weight=norm.weight, eps=norm.eps))
        _close(outs[-1], F.linear(h.float(), w.float()).to(dtype), dtype)
    res = torch.randn(m, n, generator=g).to(dtype)
    y = gemm.gemm(x, w, epilogue="residual", residual=res)
    _close(y, res + F.linear(x.float(), w.float()).to(dtype), dtype)


@pytest.mark.parametrize("n,k,dtype", [(96, 80, d) for d in DTYPES] + [(576, 1100, torch.bfloat16)])
def test_tail_norm_is_the_next_rmsnorm_of_the_stream(n, k, dtype):
    """tail_norm: the residual GEMM also returns rmsnorm(its output) * weight, as RMSNorm (HF's roundings) gives it,
    in every split mode (unsplit, a split's last program, the pass kernel); each row's bits are the same alone (M = 1)
    as among 5 or 16 (the tail's tile is a function of N); the tickets are free after. The wide shape (several N tiles,
    split K) in bf16 only: each dtype's path is the same at both shapes, and three dtypes there were the GEMM tests'
    slowest cases under the interpreter."""
    x, w, g = _data(16, n, k, dtype, seed=4)
    res = torch.randn(16, n, generator=g).to(dtype)
    norm = RMSNorm(n, 1e-5, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(n, generator=g) + 0.5)
    for split in gemm.SPLIT_MODES:
        with gemm.splitting(split):
            rows = {}
            for m in (1, 5, 16):
                h, xn = gemm.gemm(x[:m], w, epilogue="residual", residual=res[:m], tail_norm=(norm.weight, norm.eps))
                assert torch.equal(h, gemm.gemm(x[:m], w, epilogue="residual", residual=res[:m]))  # out unchanged
                _close(xn, norm(h), dtype)
                rows[m] = xn
            assert torch.equal(rows[5], rows[16][:5]) and torch.equal(rows[1], rows[16][:1]), split
    assert not gemm._ticket_buffer(torch.device("cpu")).any()
    strided = torch.stack([norm.weight.detach(), torch.zeros_like(norm.weight)], 1)[:, 0]  # stride 2: copied, not misread
    assert torch.equal(gemm.gemm(x[:2], w, epilogue="residual", residual=res[:2], tail_norm=(strided, norm.eps))[1],
                       gemm.gemm(x[:2], w, epilogue="residual", residual=res[:2], tail_norm=(norm.weight, norm.eps))[1])
    empty = gemm.gemm(x[:0], w, epilogue="residual", residual=res[:0], tail_norm=(norm.weight, norm.eps))
    assert [t.shape for t in empty] == [(0, n), (0, n)]


def test_tail_norm_errors():
    x, w, _ = _data(2, 64, 32, torch.float32)
    nw = torch.ones(64)
    with pytest.raises(ValueError, match="epilogue='residual'"):
        gemm.gemm(x, w, tail_norm=(nw, 1e-5))
    with pytest.raises(ValueError, match=r"float \[64\]"):
        gemm.gemm(x, w, epilogue="residual", residual=torch.zeros(2, 64), tail_norm=(torch.ones(63), 1e-5))
    wide = torch.zeros(gemm.MAX_TAIL_N + 1, 32)
    with pytest.raises(ValueError, match=f"N <= {gemm.MAX_TAIL_N}"):
        gemm.gemm(x, wide, epilogue="residual", residual=torch.zeros(2, gemm.MAX_TAIL_N + 1),
                  tail_norm=(torch.ones(gemm.MAX_TAIL_N + 1), 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter,k", [(48, 64), (40, 1100)])
@pytest.mark.parametrize("m", [1, 5])
def test_silu_mul_epilogue(m, inter, k, dtype):
    x, w, _ = _data(m, 2 * inter, k, dtype, seed=3)
    y = gemm.gemm(x, w, epilogue="silu_mul")
    assert y.shape == (m, inter)
    gate, up = F.linear(x.float(), w.float()).to(dtype).split(inter, dim=-1)
    _close(y, F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 32), (3, 1, 64)])
@pytest.mark.parametrize("m", [1, 6])
def test_rope_epilogue(m, heads, kv_heads, head_dim, dtype):
    n, k = (heads + 2 * kv_heads) * head_dim, 96
    x, w, g = _data(m, n, k, dtype, seed=4)
    positions = torch.randint(0, 4000, (m,), generator=g)
    cos, sin = rope.cos_sin(positions, rope.inv_freq(head_dim, 500000.0), dtype)
    q_cols, kv_cols = heads * head_dim, kv_heads * head_dim
    y = gemm.gemm(x, w, epilogue="rope", cos=cos, sin=sin, head_dim=head_dim, rope_cols=q_cols + kv_cols)
    q, kk, v = F.linear(x.float(), w.float()).to(dtype).split([q_cols, kv_cols, kv_cols], dim=-1)
    _close(y[:, :q_cols].reshape(m, heads, head_dim), rope.apply_rope(q.view(m, heads, head_dim), cos, sin), dtype)
    _close(y[:, q_cols:q_cols + kv_cols].reshape(m, kv_heads, head_dim),
           rope.apply_rope(kk.view(m, kv_heads, head_dim), cos, sin), dtype)
    _close(y[:, q_cols + kv_cols:], v, dtype)


@pytest.mark.parametrize("weights", ["bf16", "fp8"])
@pytest.mark.parametrize("epilogue,n,head_dim", [("silu_mul", 192, 0), ("silu_mul", 144, 0), ("rope", 192, 32),
                                                 ("rope", 80, 16)])
@pytest.mark.parametrize("mode", ["fill/pass", "fill/ticket"])
def test_paired_loop_one_dot_or_two_gives_the_pairs_sums(epilogue, n, head_dim, weights, mode):
    """A paired GEMM's K loop (gemm.pair_dots): one dot over both halves' rows (the default) or a dot per half
    (+pair2). Each is correct against torch and row-invariant (M 1 / 5 / 9 against M 16), split (K 1,100: 5 splits)
    or not, whole or ragged last tiles (N / 2 = 72 and 40 against tiles of 32), and both give the same outputs up to
    their sums' order."""
    k = 1100
    x, w, g = _data(16, n, k, torch.bfloat16, seed=11)
    kw = {"epilogue": epilogue}
    if epilogue == "rope":  # 192: q / k / v 2 heads of 32 each; 80: q 3 heads of 16, k and v 1
        rope_cols = 128 if n == 192 else 64
        positions = torch.randint(0, 4000, (16,), generator=g)
        cos, sin = rope.cos_sin(positions, rope.inv_freq(head_dim, 10000.0), torch.bfloat16)
        kw.update(cos=cos, sin=sin, head_dim=head_dim, rope_cols=rope_cols)
    if weights == "fp8":
        w8, sw = quantize_rows(w)
        kw["w_scale"], w = sw.view(-1), w8

    def run(rows):
        part = {key: v[:rows] if key in ("cos", "sin") else v for key, v in kw.items()}
        return gemm.gemm(x[:rows], w, **part)

    outs = {}
    for dots in (1, 2):
        with gemm.arm(f"{mode}+pair{dots}"):
            assert gemm.pair_dots() == dots
            outs[dots] = full = run(16)
            for m in (1, 5, 9):
                assert torch.equal(run(m), full[:m]), f"pair{dots}: M={m}"
    assert gemm.pair_dots() == gemm.DEFAULT_PAIR_DOTS == 1
    wf = w.float() * kw["w_scale"][:, None] if weights == "fp8" else w.float()
    ref = F.linear(x.float(), wf)
    if epilogue == "silu_mul":
        gate, up = ref.to(torch.bfloat16).split(n // 2, dim=-1)
        _close(outs[1], F.silu(gate) * up, torch.bfloat16)
    else:
        _close(outs[1][:, rope_cols:], ref[:, rope_cols:].to(torch.bfloat16), torch.bfloat16)  # v: no rotation
    _close(outs[1], outs[2], torch.bfloat16)


def test_pair_arms_parse_and_conflict():
    assert gemm.parse_arm("fill/ticket").pair_dots == 1
    assert gemm.parse_arm("lean/ticket+pair2+normsep").pair_dots == 2
    with pytest.raises(ValueError, match="pair1"):
        gemm.parse_arm("fill/ticket+pair1+pair2")
    with pytest.raises(ValueError, match="pair1"):
        gemm.parse_arm("fill/ticket+pair3")
    with pytest.raises(ValueError, match="pair dots"):
        gemm._set_pair_dots(3)
    with pytest.raises(ValueError, match="245,760 B of shared memory"):  # the H200's OutOfResources figure
        gemm.parse_arm("fill/ticket+gate_up.k512s3w4")
    assert gemm.loop_smem(128, 5) == 102400 and gemm.parse_arm("fill/ticket+k512s2w8").loops
    a, b = gemm.parse_arm("fill/ticket"), gemm.parse_arm("fill/ticket+pair2")
    assert gemm.sums_key(a) != gemm.sums_key(b)  # another MMA: the pairs' sums may round apart
    assert gemm.sums_key(a) == gemm.sums_key(gemm.parse_arm("fill/pass+pair1"))  # the reduction: the same bits


@pytest.mark.parametrize("mode", ["fill/pass", "fill/ticket"])
@pytest.mark.parametrize("m", [1, 5])
def test_rope_positions_read_the_tables_bit_for_bit(m, mode):
    """positions: cos / sin are tables over positions (Decoder.rope_tables) and each row reads its position's row:
    the same bits as the rows' own cos / sin, K split or not (the pass launch loads them too), KV store included;
    bad tables or positions are refused."""
    heads, kv_heads, d, k = 3, 1, 64, 1100  # K long enough to split under fill
    n = (heads + 2 * kv_heads) * d
    x, w, g = _data(m, n, k, torch.bfloat16, seed=15)
    nw = (torch.rand(k, generator=g) + 0.5).to(torch.bfloat16)
    inv = rope.inv_freq(d, 10000.0)
    cos_t, sin_t = (t[:, 0].contiguous() for t in rope.cos_sin(torch.arange(300), inv, torch.bfloat16))
    pos = torch.randint(0, 300, (m,), generator=g)
    cos, sin = rope.cos_sin(pos, inv, torch.bfloat16)
    assert torch.equal(cos[:, 0], cos_t[pos]) and torch.equal(sin[:, 0], sin_t[pos])  # the tables' premise
    kw = {"norm_weight": nw, "epilogue": "rope", "head_dim": d, "rope_cols": (heads + kv_heads) * d}
    caches = [torch.zeros(8, kv_heads, d, dtype=torch.bfloat16) for _ in range(4)]
    slots = torch.arange(m) + 1
    with gemm.splitting(mode):
        ref = gemm.gemm(x, w, cos=cos, sin=sin, kv_store=(caches[0], caches[1], slots), **kw)
        for p in (pos, pos.to(torch.int32)):
            y = gemm.gemm(x, w, cos=cos_t, sin=sin_t, positions=p, kv_store=(caches[2], caches[3], slots), **kw)
            assert torch.equal(y, ref)
            assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    with pytest.raises(ValueError, match="epilogue='rope' only"):
        gemm.gemm(x, w, positions=pos)
    with pytest.raises(ValueError, match="positions must be"):
        gemm.gemm(x, w, cos=cos_t, sin=sin_t, positions=pos.float(), **kw)
    with pytest.raises(ValueError, match="positions must be"):
        gemm.gemm(x, w, cos=cos_t, sin=sin_t, positions=pos[:1].expand(m + 1), **kw)
    with pytest.raises(ValueError, match="tables"):
        gemm.gemm(x, w, cos=cos, sin=sin, positions=pos, **kw)  # [M, 1, D]: not a table
    with pytest.raises(ValueError, match="tables"):
        gemm.gemm(x, w, positions=pos, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", [(96, 80), (64, 1100), (32, 2304)])  # 2304 >= LONG_K: the BLOCK_K 256 loop
@pytest.mark.parametrize("m", [1, 9])
def test_fp8_weights_match_dequantized_reference(m, n, k, dtype):
    x, w, g = _data(m, n, k, dtype, seed=6)
    w8, sw = quantize_rows(w)  # e4m3 [N, K], fp32 [N, 1]
    bias = torch.randn(n, generator=g).to(dtype)
    y = gemm.linear(x, w8, bias, w_scale=sw.reshape(-1))
    ref = (x.float() @ (w8.float() * sw).t() + bias.float()).to(dtype)  # what the kernel should compute
    _close(y, ref, dtype)
    with pytest.raises(ValueError, match="w_scale"):
        gemm.linear(x, w8)


def test_lean_policy_leaves_short_k_unsplit():
    """lean runs a K of <= LEAN_MAX_K unsplit (SmolLM2's qkv, o, gate_up: K 576) and splits longer
    ones as fill does (SmolLM2's down, every Llama-3.1-8B GEMM that fill splits)."""
    def tiles(n):  # BLOCK_N 64 (bf16)
        return -(-n // 64)

    for n, k, paired in ((960, 576, 1), (576, 576, 1), (1536, 576, 2)):  # SmolLM2 qkv, o, gate_up
        assert gemm.split_k(tiles(n) * paired, k, 128)[0] > 1  # fill splits them
        assert gemm.split_k(tiles(n) * paired, k, 128, policy="lean")[0] == 1
    for n, k in ((576, 1536), (4096, 4096), (4096, 14336)):  # SmolLM2 down; 8B o, down
        assert gemm.split_k(tiles(n), k, 128, policy="lean") == gemm.split_k(tiles(n), k, 128)
        assert gemm.split_k(tiles(n), k, 128)[0] > 1


def test_a_roles_split_policy_acts_on_that_role_only(monkeypatch):
    """Under fill, o and gate_up take lean (DEFAULT_ROLE_POLICIES), qkv, down, the LM head and role-less calls fill;
    +<role>.<policy> sets one call site's under any mode (+o.fill: the policy before 12-04c); the sums of o are lean's
    own (a function of the call site, never of M)."""
    seen = []
    real = gemm.split_k
    monkeypatch.setattr(gemm, "split_k", lambda *a, **k: seen.append(a[3]) or real(*a, **k))
    x, w, _ = _data(3, 64, 576, torch.float32)
    res = torch.zeros(3, 64)
    assert gemm.DEFAULT_SPLIT_MODE.startswith("fill/")
    o = gemm.gemm(x, w, epilogue="residual", residual=res, role="o")
    for role in ("qkv", "down", "lm_head", None):
        gemm.linear(x, w, role=role)
    assert torch.equal(gemm.gemm(x[:1], w, epilogue="residual", residual=res[:1], role="o"), o[:1])
    assert seen == ["lean", "fill", "fill", "fill", "fill", "lean"]
    seen.clear()
    with gemm.arm("fill/ticket+o.fill+down.lean"):
        gemm.linear(x, w, role="o")
        gemm.linear(x, w, role="down")
        gemm.linear(x, w, role="gate_up")
    with gemm.arm("wave/ticket"):  # another mode: no defaults by role
        gemm.linear(x, w, role="o")
    assert seen == ["fill", "lean", "lean", "wave"]
    with gemm.splitting("lean/ticket"):
        assert torch.equal(gemm.gemm(x, w, epilogue="residual", residual=res), o)
    policies = gemm.arm_policies(gemm.parse_arm("fill/ticket"))
    assert policies == {"qkv": "fill", "o": "lean", "gate_up": "lean", "down": "fill", "lm_head": "fill", None: "fill"}
    assert gemm.arm_policies(gemm.parse_arm("fill/pass+o.lean+gate_up.lean")) == policies


def _all_variants(dtype):
    """Every kernel variant on a split shape (64 x 1100: 8+ fill splits) and an unsplit one."""
    out = _variants(dtype)
    for n, k in ((64, 1100), (96, 80)):
        _, w, g = _data(1, n, k, dtype, seed=9)
        nw = (torch.rand(k, generator=g) + 0.5).to(dtype)
        out.append((f"res-{n}x{k}", lambda x, w=w: gemm.gemm(
            x, w, epilogue="residual", residual=torch.full((x.shape[0], w.shape[0]), 0.5, dtype=x.dtype))))
        out.append((f"rope-{n}x{k}", lambda x, w=w, nw=nw: gemm.gemm(
            x, w, norm_weight=nw, epilogue="rope", cos=torch.full((x.shape[0], 16), 0.6, dtype=x.dtype),
            sin=torch.full((x.shape[0], 16), 0.8, dtype=x.dtype), head_dim=16, rope_cols=(w.shape[0] // 32) * 16)))
    return out


@pytest.mark.parametrize("policy", ["fill", "lean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ticket_reduction_equals_the_reduce_pass(policy, dtype):
    """The in-kernel ticket reduction sums the same partials in the same order as the second launch: the same
    bits, for every variant, at M = 1 and 7; the tickets are back to zero afterwards."""
    g = torch.Generator().manual_seed(11)
    for name, fn in _all_variants(dtype):
        k = int(name.rsplit("x", 1)[1])
        for m in (1, 7):
            x = torch.randn(m, k, generator=g).to(dtype)
            with gemm.splitting(f"{policy}/pass"):
                ref = fn(x)
            with gemm.splitting(f"{policy}/ticket"):
                out = fn(x)
            assert torch.equal(out, ref), f"{name}, M={m}: ticket != pass"
    assert not gemm._ticket_buffer(torch.device("cpu")).any()


@pytest.mark.parametrize("loop,role", [("k64s2w4", None), ("k256s4w8", None), ("k512s2w8", None),
                                       ("gate_up.k64s2w4", "gate_up")])
def test_another_k_loop_is_row_invariant_and_correct(loop, role):
    """A bench arm's BLOCK_K / stages / warps (+[<role>.]k<BK>s<S>w<W>): rows still equal at every M, values torch's;
    fp8 weights too."""
    x, w, g = _data(16, 96, 1100, torch.bfloat16, seed=14)
    nw = torch.rand(1100) + 0.5
    w8 = w.float().clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(96, generator=g) + 0.5
    with gemm.arm(f"wave/ticket+{loop}"):
        assert gemm.loop_for(w.dtype, x.dtype, 1100, role)[1] == int(loop.split("k")[-1].split("s")[0])
        full = gemm.linear(x, w, role=role)
        normed = gemm.gemm(x, w, norm_weight=nw.to(torch.bfloat16), epilogue="silu_mul", role=role)
        full8 = gemm.linear(x, w8, w_scale=scale, role=role)
        for m in (1, 5):
            assert torch.equal(gemm.linear(x[:m], w, role=role), full[:m])
            assert torch.equal(gemm.gemm(x[:m], w, norm_weight=nw.to(torch.bfloat16), epilogue="silu_mul", role=role),
                               normed[:m])
            assert torch.equal(gemm.linear(x[:m], w8, w_scale=scale, role=role), full8[:m])
    _close(full, F.linear(x.float(), w.float()).to(torch.bfloat16), torch.bfloat16)
    _close(full8, F.linear(x.float(), w8.float() * scale[:, None]).to(torch.bfloat16), torch.bfloat16)


@pytest.mark.parametrize("mode", gemm.SPLIT_MODES)
def test_every_split_mode_is_row_invariant_and_correct(mode):
    g = torch.Generator().manual_seed(12)
    with gemm.splitting(mode):
        for name, fn in _variants(torch.bfloat16):
            k = int(name.rsplit("x", 1)[1])
            xs = torch.randn(9, k, generator=g).to(torch.bfloat16)
            ys = fn(xs)
            for r in (0, 8):
                assert torch.equal(ys[r:r + 1], fn(xs[r:r + 1])), f"{mode} {name}: row {r} differs from M=1"
        x, w, _ = _data(5, 64, 1100, torch.bfloat16, seed=13)
        _close(gemm.linear(x, w), F.linear(x.float(), w.float()).to(torch.bfloat16), torch.bfloat16)


def test_split_mode_is_checked_and_restored():
    assert gemm.split_mode() == gemm.DEFAULT_SPLIT_MODE
    with pytest.raises(ValueError, match="split mode 'fill'"):
        gemm.set_split_mode("fill")
    with gemm.splitting("lean/ticket"):
        assert gemm.split_mode() == "lean/ticket"
    assert gemm.split_mode() == gemm.DEFAULT_SPLIT_MODE


@pytest.mark.parametrize("mode", ["fill/pass", "lean/ticket"])
@pytest.mark.parametrize("m", [1, 6])
def test_rope_epilogue_stores_k_and_v_into_their_slots(m, mode):
    """kv_store: the k (rotated) and v columns of each row land in its pool slot, exactly the values of the
    output's columns; a row with slot -1 writes nothing; the q columns never reach the cache."""
    heads, kv_heads, d, k = 3, 1, 64, 1100  # K long enough to split under fill
    n = (heads + 2 * kv_heads) * d
    x, w, g = _data(m, n, k, torch.bfloat16, seed=14)
    nw = (torch.rand(k, generator=g) + 0.5).to(torch.bfloat16)
    cos, sin = rope.cos_sin(torch.randint(0, 4000, (m,), generator=g), rope.inv_freq(d, 10000.0), torch.bfloat16)
    kc = torch.full((20, kv_heads, d), 7.0, dtype=torch.bfloat16)
    vc = torch.full((20, kv_heads, d), 7.0, dtype=torch.bfloat16)
    slots = torch.randperm(20, generator=g)[:m].to(torch.int32 if m > 1 else torch.int64)
    if m > 1:
        slots[m // 2] = -1
    kw = {"norm_weight": nw, "epilogue": "rope", "cos": cos, "sin": sin, "head_dim": d,
          "rope_cols": (heads + kv_heads) * d}
    with gemm.splitting(mode):
        ref = gemm.gemm(x, w, **kw)
        y = gemm.gemm(x, w, kv_store=(kc, vc, slots), **kw)
    assert torch.equal(y, ref)
    q_cols, kv_cols = heads * d, kv_heads * d
    for r in range(m):
        if slots[r] < 0:
            continue
        assert torch.equal(kc[slots[r]].reshape(-1), y[r, q_cols:q_cols + kv_cols])
        assert torch.equal(vc[slots[r]].reshape(-1), y[r, q_cols + kv_cols:])
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    assert (kc[untouched] == 7).all() and (vc[untouched] == 7).all()
    with pytest.raises(ValueError, match="kv_store"):
        gemm.gemm(x, w, kv_store=(kc, vc, slots), epilogue="none")
    with pytest.raises(ValueError, match="kv_store: caches"):
        gemm.gemm(x, w, kv_store=(kc.float(), vc.float(), slots), **kw)
    with pytest.raises(ValueError, match="kv_store: slots"):
        gemm.gemm(x, w, kv_store=(kc, vc, slots.float()), **kw)
    with gemm.splitting(mode):  # every row skipped: the caches stay as they were
        gemm.gemm(x, w, kv_store=(kc, vc, torch.full((m,), -1)), **kw)
    assert (kc[untouched] == 7).all() and (vc[untouched] == 7).all()


def test_config_lists_the_kernels_split_modes():
    from attnlab.config import DEFAULT_GEMM_SPLIT, GEMM_SPLITS, EngineSchema
    from attnlab.plan import EnginePlan

    assert GEMM_SPLITS == gemm.SPLIT_MODES
    assert EngineSchema.gemm_split is None  # unset: the kernel's default; set: refused without engine.gemm=triton
    assert DEFAULT_GEMM_SPLIT == EnginePlan.gemm_split == gemm.DEFAULT_SPLIT_MODE
    from attnlab.config import DEFAULT_GEMM_PREFETCH, MAX_GEMM_PREFETCH

    assert EngineSchema.gemm_prefetch is None  # unset: the default where it acts (triton GEMM + PDL), else 0
    assert DEFAULT_GEMM_PREFETCH == gemm.DEFAULT_PREFETCH and MAX_GEMM_PREFETCH == gemm.MAX_PREFETCH
    assert EnginePlan.gemm_prefetch == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_argmax_epilogue_is_the_first_maximal_logit_and_row_invariant(dtype, m, monkeypatch):
    """argmax_linear = F.linear(x, w).float().argmax(-1) on this GEMM's own logits, ties to the first column
    (integer data: many exact ties, within tiles and across them, and the last program's reduction in blocks:
    ARGMAX_BLOCK shrunk to 2 tiles, so the 7-tile vocabulary reduces in 4), the same tokens at M = 1 as inside
    M = m, the ticket back at 0."""
    monkeypatch.setattr(gemm, "ARGMAX_BLOCK", 2)
    g = torch.Generator().manual_seed(m)
    k, n = 48, 7 * 64 - 20  # 7 column tiles, the last partial
    # small integers: every logit exact in any summation order (|logit| < 128), so ties are real ties
    x = torch.randint(-2, 3, (m, k), generator=g).to(dtype)
    w = torch.randint(-1, 2, (n, k), generator=g).to(dtype)
    w[[6, 400]] = x[0].sign()  # row 0's max (its L1 norm), in tiles 0 and 6: column 6 wins
    bias = torch.randint(-2, 3, (n,), generator=g).to(dtype)
    bias[[6, 400]] = 3
    for b in (None, bias):
        got = gemm.argmax_linear(x, w, b)
        logits = gemm.linear(x, w, b).float()  # the same GEMM's logits (the argmax reads them in registers)
        assert got.dtype == torch.int64 and torch.equal(got, logits.argmax(-1))
        assert int(got[0]) == 6
        for r in range(m):
            assert torch.equal(gemm.argmax_linear(x[r:r + 1], w, b), got[r:r + 1])
    assert gemm.argmax_linear(x[:0], w).shape == (0,)
    assert not gemm._ticket_buffer(x.device).any()
    # a K that fill splits (2 chunks, 7 tiles): the argmax of linear's split logits, not another summation
    x2, w2 = torch.randn(m, 256, generator=g).to(dtype), torch.randn(n, 256, generator=g).to(dtype)
    assert gemm.split_k(7, 256, gemm.loop_for(w2.dtype, x2.dtype, 256)[1])[0] > 1
    assert torch.equal(gemm.argmax_linear(x2, w2), gemm.linear(x2, w2).float().argmax(-1))


def test_arms_name_the_lm_head_path():
    assert not gemm.argmax_head()  # the default: the logits, then torch's argmax (the epilogue did not pay)
    with gemm.arm("fill/ticket+pf4+lmargmax"):
        assert (gemm.prefetch_chunks(), gemm.argmax_head()) == (4, True)
        with gemm.arm("fill/ticket+lmlogits"):
            assert (gemm.prefetch_chunks(), gemm.argmax_head()) == (gemm.DEFAULT_PREFETCH, False)
        assert gemm.argmax_head()
    with gemm.arm("fill/ticket"):  # a bare arm: the defaults
        assert (gemm.prefetch_chunks(), gemm.argmax_head()) == (gemm.DEFAULT_PREFETCH, False)
    with gemm.arm("fill/ticket+lmargmax"), gemm.arm("fill/ticket"):  # nested: still the defaults
        assert not gemm.argmax_head()
    assert not gemm.argmax_head()
    assert gemm.rope_table()  # the default: the runner's position tables
    with gemm.arm("fill/ticket+ropecalc"):
        assert not gemm.rope_table()
        with gemm.arm("lean/ticket+pf2+ropetable"):
            assert gemm.rope_table() and gemm.prefetch_chunks() == 2
        assert not gemm.rope_table()
    assert gemm.rope_table()
    from attnlab.kernels import decode

    with gemm.arm("fill/ticket+kvpf0"):
        assert decode.kv_prefetch() == 0
        with gemm.arm("fill/ticket"):
            assert decode.kv_prefetch() == decode.KV_PREFETCH_TILES
    assert decode.kv_prefetch() == decode.KV_PREFETCH_TILES
    from attnlab.kernels import argmax

    with gemm.arm("fill/ticket+amtorch"):
        assert not argmax.enabled()
    assert argmax.enabled()
    from attnlab.kernels import fused

    with gemm.arm("fill/ticket+kvsep"):
        assert not fused.rope_store()
    assert fused.rope_store()
    assert gemm.norm_place() == gemm.DEFAULT_NORM_PLACE
    with gemm.arm("lean/ticket+normpro"):
        assert gemm.norm_prologue() and not gemm.norm_tail(576)
        with gemm.arm("wave/ticket+normsep"):
            assert gemm.norm_place() == "sep" and gemm.split_mode() == "wave/ticket"
            with gemm.arm("wave/ticket+normtail"):
                assert gemm.norm_tail(576) and not gemm.norm_prologue()
        assert gemm.norm_prologue()
    assert gemm.norm_place() == gemm.DEFAULT_NORM_PLACE == "auto"
    n = gemm.TAIL_AUTO_MAX_N  # auto: the tail for narrow streams (SmolLM2's 576), the norm's launch for wide ones
    assert gemm.norm_tail(576) and gemm.norm_tail(n) and not gemm.norm_tail(n + 1)
    with gemm.arm("fill/ticket+normsep"):
        assert not gemm.norm_tail(576)
    with gemm.arm("fill/ticket+normtail"):
        assert gemm.norm_tail(gemm.MAX_TAIL_N) and not gemm.norm_tail(gemm.MAX_TAIL_N + 1)  # wider: a launch
    with pytest.raises(ValueError, match="norm place"):
        gemm.set_norm_place("tails")
    assert gemm.parse_arm("fill/pass+kvsep").rope_store is False
    assert gemm.parse_arm("fill/ticket").loops == ()
    bf = torch.bfloat16
    with gemm.arm("fill/ticket+k256s4w8"):
        assert gemm.loop_config() == (("all", (256, 4, 8)),)
        assert gemm.loop_for(bf, bf, 576) == gemm.loop_for(bf, bf, 576, "qkv") == (64, 256, 4, 8)
        assert gemm.loop_for(torch.float32, torch.float32, 4096) == (64, 64, 3, 4)  # fp32 keeps its loop
    assert gemm.loop_config() == ()
    # a role's loop: that role only, over the loop forced on every GEMM; roles of one arm in any order, one each
    arm = gemm.parse_arm("fill/ticket+k256s3w4+qkv.k128s4w4+gate_up.k64s5w8")
    assert arm.loops == (("all", (256, 3, 4)), ("gate_up", (64, 5, 8)), ("qkv", (128, 4, 4)))
    assert gemm.loop_for(bf, bf, 4096, "qkv") == (64, 128, 4, 4)  # the default's one exception (DEFAULT_ROLE_LOOPS)
    with gemm.arm("fill/ticket+qkv.k256s3w4"):
        assert gemm.loop_for(bf, bf, 4096, "qkv") == (64, 256, 3, 4)
        assert gemm.loop_for(bf, bf, 4096, "o") == gemm.loop_for(bf, bf, 4096) == (64, 256, 3, 4)  # the rule by K
        with gemm.arm("fill/ticket+k64s2w4"):  # nested: the inner arm's loops only
            assert gemm.loop_for(bf, bf, 4096, "qkv") == (64, 64, 2, 4)
        assert gemm.loop_for(bf, bf, 4096, "qkv") == (64, 256, 3, 4)
    # the default loop by K: 256 from LONG_K (8B / 1B shapes), 128 below (SmolLM2); fp32 64
    assert [gemm.loop_for(bf, bf, k)[1] for k in (576, 1536, 2048, 14336)] == [128, 128, 256, 256]
    assert gemm.loop_for(torch.float32, bf, 4096) == (64, 64, 3, 4)
    assert gemm.loop_for(bf, bf, 576)[2:] == (3, 4)
    for role in gemm.ROLES:  # measured exceptions by role from LONG_K, else the rule by K
        assert gemm.loop_for(bf, bf, 4096, role) == (64, *gemm.DEFAULT_ROLE_LOOPS.get(role, (256, 3, 4)))
        assert gemm.loop_for(bf, bf, 576, role) == (64, 128, 3, 4)  # SmolLM2's K: the rule
    with pytest.raises(ValueError, match="role"):
        gemm.linear(torch.zeros(1, 64, dtype=bf), torch.zeros(64, 64, dtype=bf), role="mlp")
    # the prefetch cap and a role's split policy
    assert gemm.prefetch_cap() == gemm.PREFETCH_MAX_WEIGHT_BYTES and gemm.role_policies() == ()
    arm = gemm.parse_arm("fill/ticket+pf8+pfcap16+o.lean+gate_up.wave")
    assert (arm.prefetch, arm.prefetch_cap, arm.role_policies) == (8, 16 << 20, (("gate_up", "wave"), ("o", "lean")))
    with gemm.arm("fill/ticket+pfcap0+down.lean"):
        assert gemm.prefetch_cap() == 0 and gemm.role_policies() == (("down", "lean"),)
    assert gemm.prefetch_cap() == gemm.PREFETCH_MAX_WEIGHT_BYTES and gemm.role_policies() == ()
    for bad in ("fill/ticket+lm", "fill/ticket+pf4+pf4", "fill/ticket+lmlogits+lmlogits",
                "fill/ticket+lmargmax+lmlogits", "fill/ticket+ropetable+ropecalc", "fill/ticket+rope",
                "fill/ticket+kvpf9", "fill/ticket+kvpf1+kvpf2", "fill/ticket+kvpf", "fill/ticket+amtorch+amtorch",
                "fill/ticket+kvsep+kvsep", "fill/ticket+kvstore", "fill/ticket+normsep+normsep", "fill/ticket+normsep+normpro",
                "fill/ticket+normtail+normpro", "fill/ticket+normtail+normsep", "fill/ticket+normauto+normtail",
                "fill/ticket+k100s3w4", "fill/ticket+k128s7w4", "fill/ticket+k128s3w4+k64s3w4",
                "fill/ticket+qkv.k128s3w4+qkv.k256s3w4", "fill/ticket+mlp.k128s3w4", "fill/ticket+qkv.k128",
                "fill/ticket+pf4+pf2", "fill/ticket+pf\u00b2", "fill/ticket+pfcap1025", "fill/ticket+pfcap4+pfcap8",
                "fill/ticket+o.lean+o.fill", "fill/ticket+mlp.lean", "fill/ticket+o.pass"):
        with pytest.raises(ValueError, match="gemm arm"), gemm.arm(bad):
            pass
        with pytest.raises(ValueError, match="split mode"):
            gemm.parse_split_modes(bad)


@triton.jit
def _bf16_to_f16_all(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, gemm._bf16_to_f16(tl.load(X + i), False))


def test_bf16_to_f16_of_every_bf16():
    """fp8 mode half's activation conversion without PTX (the interpreter's path; the GPU's cvt.rn.satfinite.f16x2.f32
    has the same semantics): every one of the 65,536 bf16 values goes to torch's round-to-nearest f16 of it clamped to
    +-65504, bit for bit, -0 kept, +-inf to +-65504, NaN to NaN."""
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    y = torch.empty(1 << 16, dtype=torch.float16)
    _bf16_to_f16_all[(1,)](x, y, N=1 << 16)
    want = x.float().clamp(-65504, 65504).half()
    nan = torch.isnan(x)
    assert torch.equal(torch.isnan(y), nan) and nan.sum() == 254
    assert torch.equal(y[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert y[x.float() == float("inf")].item() == 65504 and y[x.float() == float("-inf")].item() == -65504
    assert (y[~nan].float().abs() <= 65504).all()


@pytest.mark.parametrize("epilogue", ["none", "silu_mul", "residual"])
def test_fp8_mode_half_sums_f16_activations(epilogue):
    """fp8 mode half (+f8half): the e4m3 weights exactly in f16, the bf16 activations rounded to f16 and saturated
    (_bf16_to_f16), an f16 MMA into fp32. Against that reference (the weights dequantized, the activations taken to
    f16 by torch with the clamp), within the usual bf16 output tolerance; an activation above f16's range sums as
    +-65504, never inf (the plain epilogue); rows at M = 1 are those at M = 5 (row invariance); and sums_key tells half from the bf16 modes
    (bench.pdl compares their tokens only where the sums are alike)."""
    bf = torch.bfloat16
    n, k = 128, 2048  # from LONG_K: fp8's own loop
    x, w, g = _data(5, n, k, bf, seed=31)
    x[4, 5] = 1.2345e-7  # below f16's normal range: rounded to its subnormal grid (test_bf16_to_f16_of_every_bf16)
    if epilogue == "none":  # above f16's range: saturated (silu_mul of such sums only tests the tolerance)
        x[2, 7], x[3, 11] = 3.0e5, -1.0e6
    w8, scale = quantize_rows(w)
    scale = scale.view(-1)
    res = torch.randn(5, n, generator=g).to(bf)
    kw = {"residual": res} if epilogue == "residual" else {}
    with gemm.arm("fill/ticket+f8half"):
        got = gemm.gemm(x, w8, w_scale=scale, epilogue=epilogue, **kw)
        one = gemm.gemm(x[:1], w8, w_scale=scale, epilogue=epilogue, **{k_: v[:1] for k_, v in kw.items()})
    assert torch.isfinite(got.float()).all()
    assert torch.equal(one, got[:1])
    xh = x.float().clamp(-65504, 65504).half().float()
    acc = (xh @ w8.float().T) * scale  # e4m3 -> f16 is exact; f16 products are exact in fp32
    if epilogue == "silu_mul":
        gate, up = acc.to(bf).split(n // 2, dim=-1)
        ref = (F.silu(gate.float()).to(bf).float() * up.float()).to(bf)
    elif epilogue == "residual":
        ref = (acc.to(bf).float() + res.float()).to(bf)
    else:
        ref = acc.to(bf)
    _close(got, ref, bf)
    assert gemm.sums_key(gemm.parse_arm("fill/ticket+f8half"), fp8=True) != gemm.sums_key(gemm.parse_arm("fill/ticket+f8wide"), fp8=True)
    assert gemm.sums_key(gemm.parse_arm("fill/ticket"), fp8=True) == gemm.sums_key(gemm.parse_arm("fill/ticket+f8half"), fp8=True)  # the default
    assert gemm.sums_key(gemm.parse_arm("fill/ticket+f8half")) == gemm.sums_key(gemm.parse_arm("fill/ticket"))


def test_e4m3_to_bf16_bit_recipe_is_exact_for_every_byte():
    """The integer recipe of gemm._e4m3_to_bf16's PTX (which the interpreter cannot run), replayed with torch ops on
    every byte: prmt to the lane's top byte, (>> 4) & 0x07f0 | & 0x8000, times 2^120 (bf16 0x7b80) is the e4m3 value;
    the NaN bytes give +-480. The GPU test checks the PTX itself (tests/integration/test_gpu_gemm.py)."""
    b = torch.arange(256, dtype=torch.int32)
    lane = b << 8  # prmt 0x1404 / 0x3424: the byte in the top half of its 16-bit lane, zeros below
    bits = ((lane >> 4) & 0x07F0) | (lane & 0x8000)
    scaled = bits.to(torch.int16).view(torch.bfloat16)  # the value times 2^-120, normal or subnormal
    assert torch.equal(torch.tensor([0x7B80], dtype=torch.int16).view(torch.bfloat16).float(), torch.tensor([2.0**120]))
    got = scaled.double() * 2.0**120  # exact in bf16: a power-of-two scaling inside its range
    assert torch.equal(got.to(torch.bfloat16).double(), got)
    want = b.to(torch.uint8).view(torch.float8_e4m3fn).double()
    nan = (b & 0x7F) == 0x7F
    assert torch.equal(got[~nan], want[~nan])
    assert torch.equal(got[nan], torch.tensor([480.0, -480.0], dtype=torch.float64))


@pytest.mark.parametrize("k", [512, 300, 1100])
def test_fp8_wide_mode_unpacks_like_the_cast(k):
    """fp8 mode wide (4 weights a 32-bit load, unpacked and joined along K; under the interpreter by Triton ops, the
    recipe of the GPU's PTX): the cast mode's bits, rows M-invariant, plain and paired epilogues. A K that is no
    multiple of 4 (300 + 2) falls back to the cast."""
    kk = k + 2 if k == 300 else k
    x, w, g = _data(9, 96, kk, torch.bfloat16, seed=21)
    w8 = (w.float() * 40).clamp(-448, 448).to(torch.float8_e4m3fn)  # normal and subnormal codes
    w8[0, :4] = torch.tensor([0.0, -0.0, 2.0**-9, -448.0]).to(torch.float8_e4m3fn)
    scale = torch.rand(96, generator=g) + 0.5
    outs = {}
    for mode in ("cast", "wide"):
        with gemm.arm(f"fill/ticket+f8{mode}"):
            assert gemm._fp8_launch(x, w8)["FP8_MODE"] == (gemm.FP8_MODES.index(mode) if kk % 4 == 0 else 0)
            outs[mode] = [gemm.linear(x, w8, w_scale=scale), gemm.gemm(x, w8, w_scale=scale, epilogue="silu_mul")]
            for m in (1, 4):
                assert torch.equal(gemm.linear(x[:m], w8, w_scale=scale), outs[mode][0][:m])
    for a, b in zip(outs["cast"], outs["wide"]):
        assert torch.equal(a, b)
    _close(outs["wide"][0], F.linear(x.float(), w8.float() * scale[:, None]).to(torch.bfloat16), torch.bfloat16)
    with pytest.raises(ValueError, match="fp8 mode"):
        gemm.set_fp8_mode("int4")
    assert gemm.parse_arm("fill/ticket+f8ptx").fp8_mode == "ptx" and gemm.parse_arm("fill/ticket").fp8_mode == "half"
    assert gemm.parse_arm("fill/ticket").fp8_programs is None and gemm.parse_arm("fill/ticket+f8x2").fp8_programs == 2
    assert [gemm.parse_arm(f"fill/ticket+f8x{n}").fp8_programs for n in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert gemm.parse_arm("fill/ticket+o.k128s4w1").loops == (("o", (128, 4, 1)),)
    assert gemm.parse_arm("fill/ticket+f8half").fp8_mode == "half"
    for bad in ("fill/ticket+f8wide+f8cast", "fill/ticket+f8", "fill/ticket+f8x1+f8x2", "fill/ticket+f8x5"):
        with pytest.raises(ValueError, match="gemm arm"):
            gemm.parse_arm(bad)


def test_fp8_weights_take_their_own_loop_and_split_target():
    """fp8 weights: FP8_LONG_LOOP from LONG_K for every role (128 x 4 at 2 warps), 128 x 3 x 4 below,
    a forced loop over both; +f8x2 splits their K towards twice the programs (bf16 GEMMs keep theirs). All of it a
    function of (N, K, the dtypes, the arm), never of M."""
    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    assert gemm.loop_for(f8, bf, 4096, "qkv") == (64, *gemm.FP8_LONG_LOOP) == gemm.loop_for(f8, bf, 2048, "down")
    assert gemm.loop_for(f8, bf, 576, "qkv") == (64, 128, 3, 4)
    with gemm.arm("fill/ticket+k128s5w4"):
        assert gemm.loop_for(f8, bf, 4096, "o") == (64, 128, 5, 4)
    assert gemm.split_k(48, 2048, 256, target=2 * gemm.TARGET_PROGRAMS)[0] == 4  # 1B qkv: 96 -> 192 programs
    assert gemm.split_k(48, 2048, 256)[0] == 2
    assert [gemm.fp8_programs(k) for k in (576, 2048)] == [1, gemm.FP8_LONG_PROGRAMS] and gemm.fp8_programs() is None
    with gemm.arm("fill/ticket+f8x1"):
        assert gemm.fp8_programs(4096) == 1
    n = 20 * 64  # 20 column tiles: fill splits K = 2048 (8 chunks of 256) 4 ways for bf16, 8 ways for fp8
    seen = []
    split_k = gemm.split_k

    def spy(tiles, k, bk, policy="fill", target=gemm.TARGET_PROGRAMS):
        seen.append(split_k(tiles, k, bk, policy, target)[0])
        return split_k(tiles, k, bk, policy, target)

    x, w, g = _data(5, n, 2048, bf, seed=22)
    w8, scale = (w.float() * 40).to(f8), torch.rand(n, generator=g) + 0.5
    gemm.split_k = spy
    try:
        y = gemm.linear(x, w8, w_scale=scale)
        with gemm.arm("fill/ticket+f8x1"):
            y1 = gemm.linear(x, w8, w_scale=scale)
            assert torch.equal(gemm.linear(x[:1], w8, w_scale=scale), y1[:1])
        with gemm.arm("fill/ticket+f8x2"):
            gemm.linear(x, w)  # bf16 weights keep their target
    finally:
        gemm.split_k = split_k
    assert seen[0] == 8 and seen[1] == seen[2] == 4 and seen[3] == 4, seen
    _close(y1, y, bf)


def test_small_batch_tile_arms_and_rule():
    """+bm8 / +bm16 parse, conflict and restore; batch_tile gives 8 rows only to passes of <= 8 rows of 16-bit
    activations without a prologue norm; sums_key leaves the tile out (meant to change no bit: bench cells compare
    tokens across it)."""
    assert gemm.parse_arm("fill/ticket").small_tile == gemm.DEFAULT_SMALL_TILE
    assert gemm.parse_arm("fill/ticket+bm8").small_tile and not gemm.parse_arm("fill/ticket+bm16").small_tile
    with pytest.raises(ValueError, match=r"\+bm8"):
        gemm.parse_arm("fill/ticket+bm8+bm16")
    with pytest.raises(ValueError, match=r"\+bm8"):
        gemm.parse_arm("fill/ticket+bm4")
    before = gemm.small_tile()
    with gemm.arm("fill/ticket+bm8"):
        assert gemm.small_tile()
        bf = torch.bfloat16
        assert [gemm.batch_tile(m, bf, 2) for m in (1, 8, 9, 16)] == [8, 8, 16, 16]
        assert gemm.batch_tile(1, torch.float16, 1) == 8 and gemm.batch_tile(1, torch.float32, 2) == 16
        assert gemm.batch_tile(1, bf, 2, norm=True) == 16
        assert gemm.batch_tile(1, bf, 4) == 16  # the warp-group MMA's loops: their sums differ from mma.sync's
        fp8 = gemm.loop_for(torch.float8_e4m3fn, bf, gemm.LONG_K)[3]
        assert gemm.batch_tile(1, bf, fp8) == 8 and gemm.batch_tile(1, bf, gemm.loop_for(bf, bf, gemm.LONG_K)[3]) == 16
    assert gemm.small_tile() == before
    with gemm.arm("fill/ticket+bm16"):
        assert gemm.batch_tile(1, torch.bfloat16, 2) == 16
    assert gemm.sums_key(gemm.parse_arm("fill/ticket+bm8"), fp8=True) == gemm.sums_key(gemm.parse_arm("fill/ticket+bm16"), fp8=True)


@pytest.mark.parametrize("weights", ["bf16", "fp16", "fp8", "fp8half"])
@pytest.mark.parametrize("epilogue", ["none", "residual", "silu_mul", "rope"])
def test_small_batch_tile_matches_the_16_row_tile_and_is_row_invariant(weights, epilogue):
    """The 8-row batch tile (+bm8) under the interpreter: every epilogue, fp8 weights (both fp8 MMAs) on their 2-warp
    loop and 16-bit ones on a forced one, K split 8 ways (the ticket), against the 16-row tile (which the tests above
    hold to torch) within the output dtype's rounding; rows at M 1 / 5 are those at M 8 (one tile). Across tiles the
    interpreter's numpy matmul may sum in another order: the GPU test compares the two tiles bit for bit."""
    dt = torch.float16 if weights == "fp16" else torch.bfloat16
    n, k = 128, 2048
    x, w, g = _data(8, n, k, dt, seed=41)
    res = torch.randn(8, n, generator=g).to(dt)
    cs = torch.randn(8, 32, generator=g).to(dt)
    kw = {"residual": {"residual": res}, "rope": {"cos": cs, "sin": cs, "head_dim": 32, "rope_cols": n // 2}}.get(epilogue, {})
    wq, extra = w, {}
    if weights.startswith("fp8"):
        wq, scale = quantize_rows(w)
        extra = {"w_scale": scale.view(-1)}
    arm = {"fp8half": "fill/ticket+f8half", "fp8": "fill/ticket+f8wide"}.get(weights, "fill/ticket+k128s4w2")
    with gemm.arm(arm + "+bm8"):
        assert gemm.batch_tile(8, dt, gemm.loop_for(wq.dtype, dt, k)[3]) == gemm.SMALL_BLOCK_M
        got = gemm.gemm(x, wq, epilogue=epilogue, **kw, **extra)
        for m in (1, 5):
            sub = {key: (v[:m] if key in ("residual", "cos", "sin") else v) for key, v in kw.items()}
            assert torch.equal(gemm.gemm(x[:m], wq, epilogue=epilogue, **sub, **extra), got[:m]), m
    with gemm.arm(arm + "+bm16"):
        _close(got, gemm.gemm(x, wq, epilogue=epilogue, **kw, **extra), dt)
