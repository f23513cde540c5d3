"""The decoder layer on attnlab's small-M GEMM (``engine.gemm=triton``): 7 launches a layer (5 with ``+normpro`` or
``+normtail``, and by default, ``+normauto``, for streams of at most gemm.TAIL_AUTO_MAX_N columns: SmolLM2's).

    rmsnorm    its own launch (+normsep; arm +normpro: the qkv GEMM's prologue; arm +normtail: the tail of the
               previous layer's down_proj, or for layer 0 its own launch)
    qkv_proj   RoPE epilogue (q, k rotated; v as projected)                      -> qkv [T, (Hq + 2 Hkv) D]
               (cos / sin read by position from the runner's tables: no torch RoPE ops per pass)
               and the KV store: k and v written into their pool slots (AttnContext.kv_store_target; an fp8
               pool takes the Triton store kernel, which quantizes)
    attention  the side's backend
    o_proj     residual-add epilogue                                            -> h + o(attn)
               (+normtail: and the next norm of that stream, gemm's tail_norm)
    rmsnorm    its own launch (or gate_up's prologue, or o_proj's tail)
    gate_up    SiLU·up epilogue                                                 -> act [T, I]
    down_proj  residual-add epilogue                                            -> h + down(act)
               (+normtail: and the next layer's input norm, or the model's final norm)

plus, per split GEMM with ``engine.gemm_split=*/pass``, the split-K reduction launch. The norms as GEMM prologues
(``gemm.norm_prologue``) were the design: 5 launches. Measured, the two launches more won at every shape
(docs/kernels.md, experiments/h200-2026-12-04): a prologued GEMM's every program sums the squares of all of x and
writes its normalized K range before its K loop starts.

``engine.gemm=triton_attn`` (``attn_layer_forward``) keeps the MLP and the LM head on cuBLAS, qkv and o here:

    add_rmsnorm (residual + previous MLP output) -> qkv (RoPE + KV store epilogue) -> attention
    -> o (residual epilogue) -> rmsnorm -> gate_up (cuBLAS) -> silu_mul -> down (cuBLAS)

7 launches a layer besides attention (the fused cuBLAS path: 8 and cuBLAS's split-K reductions). Rounding follows
the unfused torch layer step by step (attnlab.kernels.gemm), so only fp32 summation orders differ. Under
``engine.gemm=triton`` rows are bit-identical whatever the number of tokens in the pass (decode vs verify) by
construction; ``triton_attn``'s MLP is cuBLAS's, which was bit-identical for M = 1..16 where measured (2026-12-01)
but promises nothing. Passes of more than ``gemm.MAX_M`` tokens
(prefill) take the fused cuBLAS path instead; a layer with Qwen3's q/k norm (between projection and RoPE)
is not fused (``usable``).
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.kernels import gemm
from attnlab.models.fp8 import FP8Linear, is_w8a8

GEMM = "gemm"  # the value of AttnContext.fused_ops that selects this path (engine.gemm=triton)
GEMM_ATTN = "gemm_attn"  # engine.gemm=triton_attn: qkv and o here, the MLP on cuBLAS (attn_layer_forward)


def usable(layers, num_tokens: int) -> bool:
    """Whether a pass of ``num_tokens`` through ``layers`` runs here (else the caller's fused cuBLAS path): at most
    gemm.MAX_M tokens, no q/k norm (Qwen3), and projections of 16-bit or weight-only e4m3 weights (a layer with W8A8
    e4m3 ones, precision.fp8_gemm=w8a8, which quantize_linears marks, keeps its activation quantization there)."""
    return num_tokens <= gemm.MAX_M and all(layer.self_attn.q_norm is None and not is_w8a8(layer) for layer in layers)


def proj(linear: nn.Module, x: torch.Tensor, role: str, **kw) -> torch.Tensor:
    """``linear(x)`` (nn.Linear or weight-only FP8Linear) through attnlab.kernels.gemm with prologue/epilogue ``kw``;
    ``role`` (gemm.ROLES) picks its K loop."""
    if isinstance(linear, FP8Linear):
        return gemm.gemm(x, linear.weight, linear.bias, w_scale=linear.weight_scale, role=role, **kw)
    return gemm.gemm(x, linear.weight, linear.bias, role=role, **kw)


def layer_forward(layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx,
                  positions: torch.Tensor | None = None, x: torch.Tensor | None = None,
                  next_norm=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h: [T <= 16, hidden], the residual stream (complete) -> (the stream after this layer, ``next_norm`` of it or
    None). cos / sin: the pass's [T, 1, head_dim], or with ``positions`` [T] tables [P, head_dim] over positions
    (Decoder.rope_tables). ``x``: input_layernorm(h) where the caller has it (the previous layer's tail norm);
    ``next_norm``: the RMSNorm the stream meets next (the next layer's input norm, the final norm), which the down
    GEMM's tail computes where ``gemm.norm_tail(hidden)`` (else the second value is None)."""
    mlp = layer.mlp
    x, norm = (x, {}) if x is not None else _normed(h, layer.input_layernorm)
    h, x = attention_block(layer.self_attn, x, norm, h, cos, sin, ctx, positions, layer.post_attention_layernorm)
    x, norm = (x, {}) if x is not None else _normed(h, layer.post_attention_layernorm)
    act = proj(mlp.gate_up_proj, x, "gate_up", **norm, epilogue="silu_mul")
    return residual_proj(mlp.down_proj, act, "down", h, next_norm)


def residual_proj(linear: nn.Module, x: torch.Tensor, role: str, residual: torch.Tensor,
                   next_norm=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(residual + linear(x), ``next_norm`` of it from the GEMM's tail where ``gemm.norm_tail`` of the stream's
    width says so, else None)."""
    if next_norm is None or not gemm.norm_tail(residual.shape[-1]):
        return proj(linear, x, role, epilogue="residual", residual=residual), None
    return proj(linear, x, role, epilogue="residual", residual=residual, tail_norm=(next_norm.weight, next_norm.eps))


def attention_block(attn, x: torch.Tensor, norm: dict, residual: torch.Tensor, cos, sin, ctx,
                    positions: torch.Tensor | None, next_norm=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``attn``: a layer's attention (or anything with its qkv_proj, o_proj, q_size, kv_size, head_dim, num_heads,
    num_kv_heads and layer_idx: an EAGLE head). qkv (``norm``: its prologue kwargs, if any; RoPE and the KV store in
    its epilogue) -> attention -> o with the residual added: (the stream after the attention block, ``next_norm`` of
    it where o_proj's tail computes it, ``residual_proj``, else None)."""
    t, d = x.shape[0], attn.head_dim
    qk_cols = attn.q_size + attn.kv_size
    store = ctx.kv_store_target(attn.layer_idx, x.dtype)
    qkv = proj(attn.qkv_proj, x, "qkv", **norm, epilogue="rope", cos=cos, sin=sin, head_dim=d, rope_cols=qk_cols,
               kv_store=store, positions=positions)
    q = qkv[:, :attn.q_size].view(t, attn.num_heads, d)  # views of one [T, N] row: strides (N, D, 1)
    k = qkv[:, attn.q_size:qk_cols].view(t, attn.num_kv_heads, d)
    v = qkv[:, qk_cols:].view(t, attn.num_kv_heads, d)
    out = ctx.attend(attn.layer_idx, q, k, v, stored=store is not None)
    return residual_proj(attn.o_proj, out.reshape(t, attn.q_size), "o", residual, next_norm)


def _normed(h: torch.Tensor, norm, prologue: bool | None = None) -> tuple:
    """A normed projection's input and prologue: by default (``gemm.norm_prologue()`` off, arm ``+normsep``) the norm
    as its own launch, (rmsnorm(h), no prologue); with arm ``+normpro``, (h, the prologue's kwargs). ``prologue``:
    that choice made by the caller instead (a cuBLAS projection has no prologue)."""
    if gemm.norm_prologue() if prologue is None else prologue:
        return h, {"norm_weight": norm.weight, "eps": norm.eps}
    from attnlab.kernels import fused

    return fused.add_rmsnorm(h, None, norm.weight, norm.eps)[0], {}


def attn_layer_forward(layer, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                       ctx, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``DecoderLayer.forward_fused``'s contract (x: the previous sublayer's output, residual: the stream before it,
    None at layer 0 -> this layer's MLP output and the stream before it) with qkv and o on this GEMM."""
    from attnlab.kernels import fused
    from attnlab.models.linear import project

    mlp, norm1 = layer.mlp, layer.input_layernorm
    x, residual = fused.add_rmsnorm(x, residual, norm1.weight, norm1.eps)
    h = attention_block(layer.self_attn, x, {}, residual, cos, sin, ctx, positions)[0]
    x = _normed(h, layer.post_attention_layernorm, prologue=False)[0]
    return project(mlp.down_proj, fused.silu_mul(project(mlp.gate_up_proj, x, ctx), mlp.intermediate_size), ctx), h
