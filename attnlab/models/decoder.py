"""A Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2) over a ragged token batch.

Tokens of all requests are packed on one axis; attention goes through ``AttnContext`` (which stores this
pass's K/V in the pool and runs the chosen backend), so the model never knows which backend runs.
Parameter names follow HF's except two fused projections: ``qkv_proj`` = [q; k; v] and
``gate_up_proj`` = [gate; up] (rows); the loader maps HF / GGUF names onto their slices.

A pass whose context says ``fused_ops`` (``engine.fused_ops``, CUDA; a property of the model side, so a
parity reference sharing these weights still runs unfused) goes through the Triton kernels of
``attnlab.kernels.fused`` (residual add + RMSNorm, RoPE on q and k with the K / V store, SiLU-mul): the same
arithmetic in 4 launches per layer instead of 32, besides the 4 GEMMs and attention. A context with ``capture`` set gets
the residual stream after those layers back in ``ctx.captured`` (EAGLE-3 features), from inside the same
forward: no extra pass, no sync, CUDA-graph safe. ``fused_ops == "gemm"`` (``engine.gemm=triton``) runs passes of
up to 16 tokens on attnlab's small-M GEMM with RoPE, the K / V store, SiLU-mul and residual adds fused into it
and the norms as their own launches or, for streams of at most 1,024 columns, in the o / down GEMMs' tails
(``attnlab.models.gemm_path``: 7 or 5 kernels per layer); longer passes take the fused path above.
``"gemm_attn"`` (``engine.gemm=triton_attn``) runs only qkv and o there, the MLP as the fused path does.
A context with ``invariant`` (``engine.invariant``: the target
side, always fused) runs the fused path's GEMMs and the LM head through ``attnlab.models.linear.invariant_linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.backends.context import AttnContext
from attnlab.models import rope
from attnlab.models.config import ModelConfig
from attnlab.models.linear import invariant_linear, project


class RMSNorm(nn.Module):
    """HF's RMSNorm: normalize in fp32, cast back, then scale (the order matters for bf16 parity)."""

    def __init__(self, dim: int, eps: float, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias, dtype=dtype)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        # x: [T, hidden]; q: [T, Hq, D], k/v: [T, Hkv, D]
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin)
        out = ctx.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(t, self.q_size))

    def forward_fused(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        from attnlab.kernels import fused

        if self.q_norm is not None:  # Qwen3's q/k norm sits between projection and RoPE: not fused
            return self.forward(x, cos, sin, ctx)
        store = ctx.kv_store_target(self.layer_idx, x.dtype) if fused.rope_store() else None
        q, k, v = fused.rope_qk(project(self.qkv_proj, x, ctx), cos, sin, self.num_heads, self.num_kv_heads,
                                self.head_dim, kv_store=store)
        out = ctx.attend(self.layer_idx, q, k, v, stored=store is not None)
        return project(self.o_proj, out.reshape(x.shape[0], self.q_size), ctx)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype=None):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def forward_fused(self, x: torch.Tensor, ctx=None) -> torch.Tensor:
        from attnlab.kernels import fused

        return project(self.down_proj, fused.silu_mul(project(self.gate_up_proj, x, ctx), self.intermediate_size), ctx)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype=None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, layer_idx, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, h: torch.Tensor, cos, sin, ctx: AttnContext) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_fused(self, x: torch.Tensor, residual: torch.Tensor | None, cos, sin,
                      ctx: AttnContext) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output (the embeddings for layer 0, residual None); returns this
        layer's MLP output and the residual stream before it (the next norm adds them)."""
        from attnlab.kernels import fused

        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        x, residual = fused.add_rmsnorm(x, residual, norm1.weight, norm1.eps)
        x, residual = fused.add_rmsnorm(self.self_attn.forward_fused(x, cos, sin, ctx), residual, norm2.weight,
                                        norm2.eps)
        return self.mlp.forward_fused(x, ctx), residual


class Decoder(nn.Module):
    """``forward(input_ids [T], positions [T], ctx) -> hidden [T, hidden]``; ``compute_logits`` -> fp32."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype | None = None):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)
        self._finish()

    def _finish(self) -> None:
        # Re-tie and recompute the fp32 RoPE frequencies after any .to()/.to_empty(): a dtype cast must not
        # round inv_freq, and moving off the meta device would otherwise untie the two weights.
        cfg = self.config
        if cfg.tie_word_embeddings and isinstance(self.lm_head, nn.Linear):  # an e4m3 head (precision.fp8_lm_head)
            self.lm_head.weight = self.embed_tokens.weight  # is its own copy: a move must not re-tie it
        self.inv_freq = rope.inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.rope_freq_factors,
                                      device=self.embed_tokens.weight.device)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._finish()
        return self

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        return self.run_layers(range(len(self.layers)), input_ids, positions, ctx)

    def run_layers(self, indices, input_ids: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        """Embed, run the layers ``indices`` (all, or a LayerSubset's), final norm -> hidden [T, hidden].
        ``ctx.capture``: layer indices whose output stream is concatenated into ``ctx.captured``."""
        h = self.embed_tokens(input_ids)
        capture = getattr(ctx, "capture", None) or ()
        feats = []
        mode = getattr(ctx, "fused_ops", False)
        table = None
        if mode in ("gemm", "gemm_attn"):  # gemm_path.GEMM / GEMM_ATTN; imported here as the other Triton paths are
            from attnlab.kernels import gemm
            from attnlab.models import gemm_path

            if not gemm_path.usable([self.layers[i] for i in indices], h.shape[0]):
                mode = True  # prefill (> 16 tokens) or Qwen3's q/k norm: the fused path, cuBLAS GEMMs
            elif gemm.rope_table():
                table = getattr(ctx, "rope_table", None)
        cos, sin, rope_pos = rope.for_pass(positions, self.inv_freq, h.dtype, table)  # table: the runner's, or None
        if mode == "gemm":
            from attnlab.kernels import fused

            order, x = list(indices), None  # x: the next norm of h, where the last GEMM's tail computed it
            for n, i in enumerate(order):
                nxt = self.layers[order[n + 1]].input_layernorm if n + 1 < len(order) else self.norm
                h, x = gemm_path.layer_forward(self.layers[i], h, cos, sin, ctx, rope_pos, x=x, next_norm=nxt)
                if i in capture:
                    feats.append(h)
            out = x if x is not None else fused.add_rmsnorm(h, None, self.norm.weight, self.norm.eps)[0]
        elif not mode:
            for i in indices:
                h = self.layers[i](h, cos, sin, ctx)
                if i in capture:
                    feats.append(h)
            out = self.norm(h)
        else:
            from attnlab.kernels import fused
            from attnlab.models.gemm_path import attn_layer_forward

            residual = None
            for i in indices:
                if mode == "gemm_attn":
                    h, residual = attn_layer_forward(self.layers[i], h, residual, cos, sin, ctx, rope_pos)
                else:
                    h, residual = self.layers[i].forward_fused(h, residual, cos, sin, ctx)
                if i in capture:  # the fused path defers the residual add to the next norm
                    feats.append(h + residual)
            out = fused.add_rmsnorm(h, residual, self.norm.weight, self.norm.eps)[0]
        if capture:
            if len(feats) != len(capture):
                raise ValueError(f"capture layers {list(capture)} not all among the layers run")
            ctx.captured = torch.cat(feats, dim=-1)
        return out

    def rope_tables(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos / sin for positions 0 .. num_positions - 1: [num_positions, head_dim] each, in the model
        dtype, on its device; row p holds the bits ``rope.cos_sin`` gives position p (the same elementwise ops).
        A gemm-path runner builds them once (AttnContext.rope_table) for its qkv epilogue to index by position."""
        # runners sharing the weights share the tables
        return rope.position_tables(self.__dict__.setdefault("_rope_tables", {}), self.inv_freq,
                                    self.embed_tokens.weight.dtype, num_positions)

    def compute_logits(self, hidden: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab] fp32 (matmul in the model dtype, as HF); ``invariant``: the
        LM head through ``invariant_linear`` (engine.invariant)."""
        return (invariant_linear(self.lm_head, hidden) if invariant else self.lm_head(hidden)).float()
