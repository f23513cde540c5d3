"""Fused per-layer elementwise kernels: what a decode step at batch 1 spends its time on besides GEMVs.

Unfused, one bf16 Llama layer launches 32 elementwise kernels besides its 4 GEMMs and attention (each
RMSNorm 8, RoPE 10, residual adds 2, SiLU-mul 2, K/V store 2); each costs a few microseconds even inside
a CUDA graph, the likely bulk of the gap to the weight-bandwidth roofline at Llama-3.1-8B shapes. These
kernels bring the 32 down to 4 (5 where an fp8 pool needs ``store_kv``, which quantizes):

- ``add_rmsnorm``: residual += x, then RMSNorm of the new residual (one kernel per norm).
- ``rope_qk``: RoPE on q and k straight out of the fused qkv projection, and the KV store (one kernel per
  layer; the store kernel only where the pool quantizes, fp8 KV).
- ``silu_mul``: SiLU(gate) * up out of the fused gate_up projection.

Rounding follows the unfused torch code (``attnlab.models.decoder`` / ``rope``) step by step: every
intermediate the torch code rounds to the model dtype is rounded here too, so bf16 results equal the
unfused path except where a reduction order (the RMS mean) or ``exp`` differs in the last fp32 ulp.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnlab.kernels.heuristics import next_pow2
from attnlab.kernels.pdl import launch_args, pdl_start

_rope_store = True  # rope_qk callers pass their pool's kv_store (bench arm +kvsep: the store kernel, as before)


def rope_store() -> bool:
    """Whether the fused paths store K / V from their RoPE launch (``rope_qk(..., kv_store=)``), else by
    ``store_kv``. A process-wide switch for before / after benches (``gemm.arm``'s ``+kvsep``); read at capture."""
    return _rope_store


def set_rope_store(on: bool) -> None:
    global _rope_store
    _rope_store = bool(on)


@triton.jit
def _add_rmsnorm_kernel(X, RES, W, OUT, RES_OUT, stride_x, stride_r, stride_o, stride_ro, N, eps,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    w = tl.load(W + offs, mask=mask, other=0.0)  # issued with x's load, not after the reduction's barrier
    if HAS_RES:  # h = residual + x, rounded to the model dtype as torch's add would
        x = (x.to(tl.float32) + tl.load(RES + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32))
        x = x.to(OUT.dtype.element_ty)
        tl.store(RES_OUT + row * stride_ro + offs, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / N
    h = (h * tl.math.rsqrt(var + eps)).to(OUT.dtype.element_ty)  # normalize in fp32, cast back ...
    y = (w.to(tl.float32) * h.to(tl.float32)).to(OUT.dtype.element_ty)  # ... then scale (HF's order)
    tl.store(OUT + row * stride_o + offs, y, mask=mask)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [T, N] -> (rmsnorm(residual + x) * weight, residual + x); residual None: (norm(x), x).
    ``out``: a [T, N] tensor (rows may be strided, e.g. half of a wider buffer) to write the norm into."""
    t, n = x.shape
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.stride(-1) != 1 or out.dtype != x.dtype:
        raise ValueError(f"add_rmsnorm: out must be {tuple(x.shape)} {x.dtype} with unit last stride")
    res_out = torch.empty_like(x) if residual is not None else x
    if t == 0:
        return out, res_out
    if x.stride(-1) != 1:
        x = x.contiguous()
    res = residual if residual is not None else x
    if res.stride(-1) != 1:
        res = res.contiguous()
    block = next_pow2(n)
    _add_rmsnorm_kernel[(t,)](x, res, weight, out, res_out, x.stride(0), res.stride(0), out.stride(0),
                              res_out.stride(0), n, eps, HAS_RES=residual is not None, BLOCK=block,
                              num_warps=min(16, max(1, block // 256)), **launch_args(x))
    return out, res_out


@triton.jit
def _rope_qk_kernel(QKV, COS, SIN, Q_OUT, K_OUT, KC, VC, SLOTS, stride_t, stride_ct, stride_qt, stride_kt,
                    stride_slot, NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    HALF: tl.constexpr, BLOCK: tl.constexpr, FROM_POS: tl.constexpr, STORE: tl.constexpr,
                    USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # 0..Hq-1: q heads, then k heads, then (STORE) v heads, as in the qkv row
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    src = QKV + t * stride_t + head * HEAD_DIM
    x1 = tl.load(src + offs, mask=mask, other=0.0)
    x2 = tl.load(src + HALF + offs, mask=mask, other=0.0)
    ty = x1.dtype
    if STORE:  # the pool slot of this token (-1: written nowhere), heads contiguous in a slot
        slot = tl.load(SLOTS + t).to(tl.int64)
        smask = offs < tl.where(slot >= 0, HALF, 0)
    else:
        slot = 0
        smask = mask
    if head < NUM_Q_HEADS + NUM_KV_HEADS:
        if FROM_POS:  # COS: the positions [T], SIN: the inverse frequencies [HALF] fp32; cos/sin as rope.cos_sin
            f = tl.load(COS + t).to(tl.float32) * tl.load(SIN + offs, mask=mask, other=0.0)
            c = tl.cos(f).to(ty).to(tl.float32)
            s = tl.sin(f).to(ty).to(tl.float32)
        else:
            c = tl.load(COS + t * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)  # cos = cat(f, f)
            s = tl.load(SIN + t * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
        # x * cos + rotate_half(x) * sin, each product rounded as torch does in the model dtype
        o1 = ((x1.to(tl.float32) * c).to(ty).to(tl.float32) + (-x2.to(tl.float32) * s).to(ty).to(tl.float32)).to(ty)
        o2 = ((x2.to(tl.float32) * c).to(ty).to(tl.float32) + (x1.to(tl.float32) * s).to(ty).to(tl.float32)).to(ty)
        if head < NUM_Q_HEADS:
            dst = Q_OUT + t * stride_qt + head * HEAD_DIM
        else:
            dst = K_OUT + t * stride_kt + (head - NUM_Q_HEADS) * HEAD_DIM
            if STORE:  # the rotated k, also into its pool slot (the same bits)
                kdst = KC + slot * stride_slot + (head - NUM_Q_HEADS) * HEAD_DIM
                tl.store(kdst + offs, o1, mask=smask)
                tl.store(kdst + HALF + offs, o2, mask=smask)
        tl.store(dst + offs, o1, mask=mask)
        tl.store(dst + HALF + offs, o2, mask=mask)
    elif STORE:  # a v head (the grid has them only when storing), as projected, into its pool slot
        vdst = VC + slot * stride_slot + (head - NUM_Q_HEADS - NUM_KV_HEADS) * HEAD_DIM
        tl.store(vdst + offs, x1, mask=smask)
        tl.store(vdst + HALF + offs, x2, mask=smask)


def rope_qk(qkv: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, num_heads: int, num_kv_heads: int,
            head_dim: int, positions: torch.Tensor | None = None, inv_freq: torch.Tensor | None = None,
            kv_store: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (Hq + 2 Hkv) D] (the fused projection's output), cos/sin [T, 1, D] or [T, D] ->
    q [T, Hq, D], k [T, Hkv, D] (RoPE applied, contiguous) and v [T, Hkv, D] (a view of qkv).

    ``positions`` [T] int and ``inv_freq`` [D / 2] fp32 instead of cos / sin: the kernel computes them itself (no
    rope.cos_sin, whose seven small kernels were a quarter of an EAGLE head step's launches), rounded to the model
    dtype as cos_sin rounds; its cos / sin may differ from torch's in the last ulp (the EAGLE head's draft steps,
    where a rounding difference changes a draft, never an output).

    ``kv_store`` (k_cache, v_cache, slots) (``AttnContext.kv_store_target``): the same launch also writes the
    rotated k and v into their pool slots ([slots, Hkv, D] caches of qkv's dtype; slot -1 skipped), so the layer
    needs no store kernel (then ``attend(..., stored=True)``)."""
    t = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    v = qkv[:, q_size + kv_size:].view(t, num_kv_heads, head_dim)
    q = torch.empty(t, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, num_kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    kc, vc, slots = _store_args(kv_store, qkv, t, num_kv_heads, head_dim)
    if t == 0:
        return q, k, v
    half = head_dim // 2
    from_pos = positions is not None
    if from_pos:
        if inv_freq is None or inv_freq.numel() != half:
            raise ValueError(f"rope_qk: positions need inv_freq of {half} entries")
        cos, sin, stride_ct = positions.contiguous(), inv_freq.float().contiguous(), 0
    else:
        cos, sin = cos.reshape(t, head_dim), sin.reshape(t, head_dim)
        stride_ct = cos.stride(0)
    store = kv_store is not None
    _rope_qk_kernel[(t, num_heads + num_kv_heads * (2 if store else 1))](
        qkv, cos, sin, q, k, kc, vc, slots, qkv.stride(0), stride_ct, q.stride(0), k.stride(0),
        kc.stride(0) if store else 0, NUM_Q_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HALF=half, BLOCK=max(16, next_pow2(half)), FROM_POS=from_pos, STORE=store, num_warps=1,
        **launch_args(qkv))
    return q, k, v


def _store_args(kv_store, qkv: torch.Tensor, t: int, num_kv_heads: int, head_dim: int):
    """``rope_qk``'s kv_store checked -> (k_cache, v_cache, slots); without one, qkv stands in (never written)."""
    if kv_store is None:
        return qkv, qkv, qkv
    kc, vc, slots = kv_store
    want = (num_kv_heads, head_dim)
    for c in (kc, vc):
        if c.dim() != 3 or tuple(c.shape[1:]) != want or c.dtype != qkv.dtype or c.stride(2) != 1 \
                or c.stride(1) != head_dim or c.stride(0) != kc.stride(0) or c.device != qkv.device:
            raise ValueError(f"rope_qk kv_store: caches must be [slots, {num_kv_heads}, {head_dim}] of {qkv.dtype} "
                             f"on {qkv.device} with heads contiguous, got {tuple(c.shape)} {c.dtype} "
                             f"stride {c.stride()}")
    if slots.shape != (t,) or slots.dtype not in (torch.int32, torch.int64) or not slots.is_contiguous() \
            or slots.device != qkv.device:
        raise ValueError(f"rope_qk kv_store: slots must be a contiguous [{t}] int32 / int64 tensor on {qkv.device}, "
                         f"got {tuple(slots.shape)} {slots.dtype}")
    return kc, vc, slots


@triton.jit
def _silu_mul_kernel(GU, OUT, stride_g, stride_o, N, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(GU + t * stride_g + offs, mask=mask, other=0.0)
    u = tl.load(GU + t * stride_g + N + offs, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu, rounded to the model dtype
    tl.store(OUT + t * stride_o + offs, (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    """gate_up [T, 2 I] = [gate | up] -> silu(gate) * up: [T, I]."""
    t = gate_up.shape[0]
    out = torch.empty(t, intermediate, dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    block = min(1024, next_pow2(intermediate))
    _silu_mul_kernel[(t, triton.cdiv(intermediate, block))](gate_up, out, gate_up.stride(0), out.stride(0),
                                                            intermediate, BLOCK=block, num_warps=4,
                                                            **launch_args(gate_up))
    return out
