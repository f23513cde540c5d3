"""An EAGLE-3 draft head: one Llama decoder layer at the target's hidden size, fed by the target's features.

Per token position t the head reads two inputs, as in EAGLE-3 (Li et al. 2025) and SGLang's
``LlamaForCausalLMEagle3``:
- the embedding of token ``x_{t+1}`` (the target's own embedding table, shared, not copied), and
- a feature: either the target's hidden states at t captured after layers ``capture_layers`` (low, mid and
  high level; default ``[2, L//2, L-3]``) and fused by ``fc`` ([n * H] -> [H]), or, in later draft steps,
  the head's own pre-norm output at t - 1.

    e = input_norm(embed(x)); f = fc(g) or a_prev
    h = f + o_proj(attn(qkv_proj([e ; hidden_norm(f)])))   # qkv reads 2H, attention over the head's own KV
    a = h + mlp(post_attention_layernorm(h))                 # the next step's feature (pre-norm)
    logits = lm_head(norm(a))                                # the target's LM head, shared

The head keeps its own paged KV (one layer, pool layer 0) and attends through any attnlab backend. The
target's embedding and LM head are bound with ``bind`` and are not part of ``state_dict``: a saved head holds
only its own ~5M parameters.

fp8 weights (``quantize_fp8``, ``draft=eagle precision=fp8w-draft``): the projections (HEAD_ROLES) become e4m3
FP8Linear modules with per-row scales and, with ``lm_head``, so do the LM-head rows the head scores (its own copy; the
target's LM head is untouched); the norms and the embedding stay in the compute dtype, bf16.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.errors import ModelLoadError
from attnlab.models import rope
from attnlab.models.config import ModelConfig
from attnlab.models.decoder import RMSNorm
from attnlab.models.fp8 import FP8Linear, is_w8a8, mark_w8a8, scaled_mm_ok

# the head's projections and each one's role in attnlab.kernels.gemm (its small-M K loop and split policy; fc, the
# feature fusion [3H -> H], has no layer counterpart and takes the role-less defaults)
HEAD_ROLES = {"fc": None, "qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}


def default_capture_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low / mid / high feature layers: outputs of layers [2, L//2, L-3] (0-based, deduplicated)."""
    if num_layers < 4:
        return sorted({0, num_layers - 1}) if num_layers > 1 else [0]
    return sorted({2, num_layers // 2, num_layers - 3})


@dataclass
class EagleConfig:
    """The head's shape; everything else (RoPE, vocabulary) follows the target it was trained for."""

    target: str  # the target's name (preset or source) the head was trained against
    target_fingerprint: str  # weights_fingerprint(target) at training time
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    capture_layers: list[int]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_freq_factors: list[float] | None = None
    # A reduced draft vocabulary (EAGLE-3's d2t): the head scores only these many target tokens, the rows
    # ``d2t`` (a buffer saved with the weights) of the target's LM head; None = the whole vocabulary.
    draft_vocab_size: int | None = None
    meta: dict = field(default_factory=dict)  # how it was trained: command, tokens, steps, data

    @classmethod
    def for_target(cls, target: ModelConfig, name: str, fingerprint: str, capture_layers=None,
                   intermediate_size: int | None = None, draft_vocab_size: int | None = None) -> EagleConfig:
        layers = list(capture_layers) if capture_layers else default_capture_layers(target.num_layers)
        if len(layers) < 2 or len(set(layers)) != len(layers) or min(layers) < 0 or max(layers) >= target.num_layers:
            raise ModelLoadError(f"eagle capture layers {layers}: need >= 2 distinct layer indices in "
                                 f"0..{target.num_layers - 1} (EAGLE-3 fuses several levels)")
        return cls(target=name, target_fingerprint=fingerprint, vocab_size=target.vocab_size,
                   hidden_size=target.hidden_size, intermediate_size=intermediate_size or target.intermediate_size,
                   num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
                   capture_layers=sorted(layers), rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
                   rope_scaling=target.rope_scaling, rope_freq_factors=target.rope_freq_factors,
                   draft_vocab_size=cls._check_vocab(draft_vocab_size, target.vocab_size))

    @staticmethod
    def _check_vocab(n: int | None, vocab: int) -> int | None:
        if n is None or n == vocab:
            return None
        if not 1 <= n < vocab:
            raise ModelLoadError(f"eagle draft vocabulary {n}: must be in 1..{vocab} (the target's) or null")
        return n

    @property
    def feature_dim(self) -> int:
        """Width of the target features the head reads: one hidden state per captured layer."""
        return len(self.capture_layers) * self.hidden_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EagleConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(n for n in names - set(d) if n not in ("rope_scaling", "rope_freq_factors", "meta",
                                                                   "rms_norm_eps", "rope_theta", "draft_vocab_size"))
        if missing:
            raise ModelLoadError(f"eagle head config lacks {missing}")
        return cls(**{k: v for k, v in d.items() if k in names})

    # the head's attention shapes, as a ModelConfig view (backends and the KV pool read these)
    def as_model_config(self) -> ModelConfig:
        return ModelConfig(arch="llama", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rope_theta=self.rope_theta,
                           rope_scaling=self.rope_scaling, rope_freq_factors=self.rope_freq_factors,
                           rms_norm_eps=self.rms_norm_eps)


def weights_fingerprint(model: nn.Module, sample: int = 4096) -> str:
    """A short hash of a decoder's weights: names, shapes and a strided sample of each tensor rounded to
    bf16 (so the same checkpoint loaded in fp32, fp16 or bf16 gives the same fingerprint). Cheap: it reads
    ``sample`` values per tensor, not the whole model."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if not t.is_floating_point():
            continue
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // sample)
        vals = flat[::step][:sample].float().to(torch.bfloat16).view(torch.int16).cpu()
        h.update(f"{name}:{tuple(t.shape)}".encode())
        h.update(vals.numpy().tobytes())
    return h.hexdigest()[:16]


class EagleHead(nn.Module):
    """``forward(input_ids [T], positions [T], ctx, features [T, F]) -> normed hidden [T, H]``; the pre-norm
    output (the next step's feature) is left in ``ctx.captured``. ``features`` of width ``feature_dim`` are
    target features (fused by ``fc``); of width H, the head's own previous outputs."""

    def __init__(self, cfg: EagleConfig, dtype: torch.dtype | None = None):
        super().__init__()
        self.config = cfg
        H, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_size, self.kv_size = q, kv
        # the attention shapes gemm_path.attention_block reads from a layer's attention (the head's KV: pool layer 0)
        self.head_dim, self.num_heads, self.num_kv_heads = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        self.layer_idx = 0
        self.fc = nn.Linear(cfg.feature_dim, H, bias=False, dtype=dtype)
        self.input_norm = RMSNorm(H, cfg.rms_norm_eps, dtype)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps, dtype)
        self.qkv_proj = nn.Linear(2 * H, q + 2 * kv, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(q, H, bias=False, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps, dtype)
        self.gate_up_proj = nn.Linear(H, 2 * cfg.intermediate_size, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(cfg.intermediate_size, H, bias=False, dtype=dtype)
        self.norm = RMSNorm(H, cfg.rms_norm_eps, dtype)
        self.register_buffer("inv_freq", torch.empty(0), persistent=False)
        if cfg.draft_vocab_size:  # draft id -> target id, sorted; filled by training (or loading)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self._bound: tuple[nn.Module, nn.Module] | None = None  # (embed_tokens, lm_head) of the target
        self._rows: torch.Tensor | None = None  # the target's LM-head rows at d2t (derived on bind, not saved)
        self._fp8_rows: str | None = None  # quantize_fp8(lm_head=True): the FP8Linear.small_m of the scored rows
        self._rows8: FP8Linear | None = None  # those rows in e4m3 (derived on bind, not saved), replacing _rows
        self._finish()

    def _finish(self) -> None:
        c = self.config
        self.inv_freq = rope.inv_freq(c.head_dim, c.rope_theta, c.rope_scaling, c.rope_freq_factors,
                                      device=self.fc.weight.device)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._finish()  # fp32 RoPE frequencies survive a dtype cast
        if self._bound is not None and (self.config.draft_vocab_size or self._fp8_rows):
            self._derive_rows()
        return self

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (the norms'): features are cast to it; fp8 projections compute in it too."""
        return self.norm.weight.dtype

    def rope_tables(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos / sin over positions (Decoder.rope_tables' contract): a gemm-path runner's qkv epilogue reads
        them by position (AttnContext.rope_table), no torch RoPE ops per draft step."""
        return rope.position_tables(self.__dict__.setdefault("_rope_tables", {}), self.inv_freq, self.dtype,
                                    num_positions)

    def quantize_fp8(self, small_m: str = "w8a8", lm_head: bool = False) -> EagleHead:
        """e4m3 weights with per-row scales, in place: the projections (HEAD_ROLES) become FP8Linear (``small_m``:
        its W8A8 or weight-only small-M GEMM), and with ``lm_head`` the LM-head rows the head scores (the draft
        vocabulary's, or the whole head's) an e4m3 copy of their own. Compute in bf16: a bf16 head."""
        if self.dtype != torch.bfloat16:
            raise ValueError(f"eagle head: fp8 weights compute in bf16, not {self.dtype} (cast the head first)")
        for name, role in HEAD_ROLES.items():  # every check before anything is swapped: a refusal leaves the head
            lin = getattr(self, name)
            if type(lin) is not nn.Linear or not scaled_mm_ok(lin.in_features, lin.out_features):
                raise ValueError(f"eagle head: {name} ({type(lin).__name__}) is not an nn.Linear that row-wise fp8 "
                                 f"takes (in and out features multiples of 16)")
        c = self.config
        rows = c.draft_vocab_size or c.vocab_size
        if lm_head and not scaled_mm_ok(c.hidden_size, rows):
            raise ValueError(f"eagle head: fp8 LM-head rows need the hidden size and the scored rows in multiples of "
                             f"16 ({rows} rows x {c.hidden_size})")
        for name, role in HEAD_ROLES.items():
            setattr(self, name, FP8Linear.from_linear(getattr(self, name), small_m=small_m, role=role))
        mark_w8a8(self, small_m)  # W8A8: the fused path under engine.gemm=triton (forward)
        self._fp8_rows = small_m if lm_head else None
        if self._bound is not None:
            self._derive_rows()
        return self

    # -- the target's shared modules ------------------------------------------------------------------
    def bind(self, embed_tokens: nn.Module, lm_head: nn.Module) -> EagleHead:
        """Use the target's embedding and LM head (kept outside this module: not saved, not moved)."""
        if embed_tokens.weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ModelLoadError(f"eagle head: target embedding {tuple(embed_tokens.weight.shape)} != "
                                 f"({self.config.vocab_size}, {self.config.hidden_size})")
        object.__setattr__(self, "_bound", (embed_tokens, lm_head))
        if self.config.draft_vocab_size or self._fp8_rows:
            self._derive_rows()
        return self

    def set_draft_vocab(self, d2t: torch.Tensor) -> None:
        """The draft vocabulary: sorted, distinct target token ids, as many as config.draft_vocab_size."""
        d2t = torch.as_tensor(d2t, dtype=torch.long).reshape(-1)
        n, V = self.config.draft_vocab_size, self.config.vocab_size
        if d2t.numel() != n or d2t.unique().numel() != n or int(d2t.min()) < 0 or int(d2t.max()) >= V:
            raise ValueError(f"draft vocabulary: need {n} distinct token ids in 0..{V - 1}")
        self.d2t.copy_(d2t.sort().values.to(self.d2t.device))
        if self._bound is not None:
            self._derive_rows()

    def _derive_rows(self) -> None:
        # the LM-head rows of the draft vocabulary, gathered once (the head never trains them); with fp8 rows, those
        # (or the whole LM head's) in e4m3 instead
        w = self.shared[1].weight.detach()
        rows = w[self.d2t.to(w.device)].contiguous() if self.config.draft_vocab_size else None
        rows8 = None
        if self._fp8_rows:  # shapes checked by quantize_fp8
            rows8 = FP8Linear.from_weight(w if rows is None else rows, small_m=self._fp8_rows, role="lm_head")
            rows = None
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "_rows8", rows8)

    def scored_tensors(self) -> list[torch.Tensor]:
        """The LM-head tensors a draft step reads besides the head's own (weight bytes: attnlab.metrics.perf)."""
        if self._rows8 is not None:
            return [self._rows8.weight, self._rows8.weight_scale]
        return [self._rows] if self._rows is not None else [self.shared[1].weight]

    @property
    def shared(self) -> tuple[nn.Module, nn.Module]:
        if self._bound is None:
            raise RuntimeError("eagle head: bind(embed_tokens, lm_head) of the target first")
        return self._bound

    @property
    def num_layers(self) -> int:
        return 1

    # -- the layer, split around attention so training can bring its own attention --------------------
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> [..., H]: target features through fc, the head's own outputs as they are."""
        if features.shape[-1] == self.config.feature_dim:
            return self.fc(features)
        if features.shape[-1] != self.config.hidden_size:
            raise ValueError(f"eagle head: feature width {features.shape[-1]} is neither the target's "
                             f"{self.config.feature_dim} nor the hidden size {self.config.hidden_size}")
        return features

    def pre_attention(self, input_ids: torch.Tensor, f: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """input_ids [T], f [T, H] (fused) -> q [T, Hq, D], k, v [T, Hkv, D] with RoPE applied."""
        c = self.config
        e = self.input_norm(self.shared[0](input_ids))
        x = torch.cat([e, self.hidden_norm(f)], dim=-1)
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        t = x.shape[:-1]
        q = q.reshape(*t, c.num_heads, c.head_dim)
        k = k.reshape(*t, c.num_kv_heads, c.head_dim)
        v = v.reshape(*t, c.num_kv_heads, c.head_dim)
        return rope.apply_rope(q, cos, sin), rope.apply_rope(k, cos, sin), v

    def post_attention(self, f: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """f [T, H] (fused feature, the residual), attn [T, Hq, D] -> the pre-norm output a [T, H]."""
        h = f + self.o_proj(attn.reshape(*attn.shape[:-2], self.q_size))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(h)).split(self.config.intermediate_size, dim=-1)
        return h + self.down_proj(F.silu(gate) * up)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx, features: torch.Tensor) -> torch.Tensor:
        mode = getattr(ctx, "fused_ops", False)
        if mode == "gemm" and not is_w8a8(self):  # engine.gemm=triton on the draft side (gemm_path.GEMM)
            from attnlab.kernels import gemm

            if input_ids.shape[0] <= gemm.MAX_M:
                return self._forward_gemm(input_ids, features.to(self.dtype), positions, ctx)
        f = self.fuse(features.to(self.dtype))
        if mode:  # engine.fused_ops on the draft side (and longer passes of engine.gemm=triton, triton_attn's)
            return self._forward_fused(input_ids, f, positions, ctx)
        cos, sin = rope.cos_sin(positions, self.inv_freq, f.dtype)
        q, k, v = self.pre_attention(input_ids, f, cos, sin)
        a = self.post_attention(f, ctx.attend(0, q, k, v))
        ctx.captured = a
        return self.norm(a)

    def _forward_fused(self, input_ids: torch.Tensor, f: torch.Tensor, positions: torch.Tensor, ctx) -> torch.Tensor:
        """``forward`` through attnlab.kernels.fused, as the target's fused layers: the four RMSNorms with their
        residual adds, RoPE on q and k, SiLU-mul, one kernel each (the head's draft steps are a few
        microseconds of math in ~60 small kernels unfused). The two input norms write the halves of the qkv
        projection's input (no cat), and RoPE computes its cos / sin from the positions in the same kernel (no
        rope.cos_sin), and stores K / V too (no store kernel): about 19 launches per draft step instead of 28."""
        from attnlab.kernels import fused

        c = self.config
        x = torch.empty(f.shape[0], 2 * c.hidden_size, dtype=f.dtype, device=f.device)
        fused.add_rmsnorm(self.shared[0](input_ids), None, self.input_norm.weight, self.input_norm.eps,
                          out=x[:, :c.hidden_size])
        fused.add_rmsnorm(f, None, self.hidden_norm.weight, self.hidden_norm.eps, out=x[:, c.hidden_size:])
        store = ctx.kv_store_target(0, x.dtype) if fused.rope_store() else None
        q, k, v = fused.rope_qk(self.qkv_proj(x), None, None, c.num_heads, c.num_kv_heads, c.head_dim,
                                positions=positions, inv_freq=self.inv_freq, kv_store=store)
        o = self.o_proj(ctx.attend(0, q, k, v, stored=store is not None).reshape(q.shape[0], self.q_size))
        x, h = fused.add_rmsnorm(o, f, self.post_attention_layernorm.weight, self.post_attention_layernorm.eps)
        d = self.down_proj(fused.silu_mul(self.gate_up_proj(x), c.intermediate_size))
        out, a = fused.add_rmsnorm(d, h, self.norm.weight, self.norm.eps)  # a = h + d: the pre-norm output
        ctx.captured = a
        return out

    def _scored(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> model-dtype logits over the scored rows (the draft vocabulary's, else the whole)."""
        if self._rows8 is not None:
            return self._rows8(hidden)
        if self._rows is not None:
            return F.linear(hidden, self._rows.to(hidden.dtype))
        return self.shared[1](hidden)

    def _forward_gemm(self, input_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                      ctx) -> torch.Tensor:
        """``forward`` on attnlab's small-M GEMM (engine.gemm=triton, passes of <= gemm.MAX_M rows, 16-bit or
        weight-only e4m3 projections: not ``is_w8a8``), as the target's layers run it (attnlab.models.gemm_path): fc
        through it too; qkv with RoPE and the KV store in its epilogue; o and down with their residual adds, and the
        next norm in their tails where ``gemm.norm_tail`` says so; gate_up with SiLU-mul. About 9 launches a draft step
        against ``_forward_fused``'s ~19, and the projections' e4m3 weights (FP8Linear) take the same epilogues."""
        from attnlab.kernels import fused, gemm
        from attnlab.models import gemm_path

        c, H = self.config, self.config.hidden_size
        f = gemm_path.proj(self.fc, features, None) if features.shape[-1] == c.feature_dim else self.fuse(features)
        x = torch.empty(f.shape[0], 2 * H, dtype=f.dtype, device=f.device)
        fused.add_rmsnorm(self.shared[0](input_ids), None, self.input_norm.weight, self.input_norm.eps, out=x[:, :H])
        fused.add_rmsnorm(f, None, self.hidden_norm.weight, self.hidden_norm.eps, out=x[:, H:])
        cos, sin, pos = rope.for_pass(positions, self.inv_freq, f.dtype,
                                      getattr(ctx, "rope_table", None) if gemm.rope_table() else None)
        post = self.post_attention_layernorm
        h, x = gemm_path.attention_block(self, x, {}, f, cos, sin, ctx, pos, post)  # the residual: f
        if x is None:
            x = fused.add_rmsnorm(h, None, post.weight, post.eps)[0]
        act = gemm_path.proj(self.gate_up_proj, x, "gate_up", epilogue="silu_mul")
        a, out = gemm_path.residual_proj(self.down_proj, act, "down", h, self.norm)  # a: the next step's feature
        if out is None:
            out = fused.add_rmsnorm(a, None, self.norm.weight, self.norm.eps)[0]
        ctx.captured = a
        return out

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (normed) -> fp32 logits over the draft vocabulary [N, draft_vocab_size] (the whole
        vocabulary when there is no reduced one): what training scores."""
        return self._scored(hidden).float()

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (normed) -> the argmax target ids [N]: ``compute_logits(hidden).argmax(-1)`` without the
        [N, vocab] -inf fill and scatter of a reduced draft vocabulary (d2t is sorted, so the first maximum of
        the draft logits maps to the first maximum of the full ones: the same id, ties included)."""
        # the argmax of the model-dtype logits: their fp32 upcast is exact and keeps the order and the ties, so
        # the same id as over draft_logits, without the [N, draft_vocab] fp32 copy
        ids = self._scored(hidden).argmax(dim=-1)
        return self.d2t[ids] if self.config.draft_vocab_size else ids

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (normed) -> logits [N, vocab] fp32 over the target's vocabulary: tokens outside a
        reduced draft vocabulary get -inf (probability 0, never drafted), so every consumer of draft logits
        (argmax, sampling, rejection sampling's q) works in target ids and stays lossless."""
        small = self.draft_logits(hidden)
        if not self.config.draft_vocab_size:
            return small
        full = small.new_full((small.shape[0], self.config.vocab_size), float("-inf"))
        return full.index_copy_(1, self.d2t, small)
