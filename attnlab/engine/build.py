"""Assemble a model side (weights, KV pool, allocator, backend) into a ModelRunner."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnlab.backends.base import DTYPE_NAMES
from attnlab.backends.registry import require_available
from attnlab.engine.runner import ModelRunner
from attnlab.errors import ConfigError
from attnlab.kvcache import KVPool, PageAllocator, pages_needed
from attnlab.kvcache.quant import DEFAULT_KV_SCALE, FP8_DTYPES
from attnlab.models.fp8 import has_fp8_linears, quantize_linears
from attnlab.models.subset import LayerSubset
from attnlab.plan import GEMM_KINDS, GEMM_PATHS, TRITON_GEMMS, ModelSource


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPE_NAMES:
        raise ConfigError(f"unknown dtype {name!r} (choose from: {', '.join(DTYPE_NAMES)})")
    return DTYPE_NAMES[name]


def auto_num_pages(max_batch: int, max_context: int, page_size: int) -> int:
    """Enough pages for every request of a full batch at max context (no back-pressure)."""
    return max_batch * pages_needed(max_context, page_size)


@dataclass(frozen=True)
class SideSpec:
    """One model side: which weights, backend, dtypes and KV sizes ``build_side`` assembles into a runner.

    ``dtype`` is the side's weights (fp8_e4m3: fp8 layer projections, bf16 compute); ``kv_dtype`` its KV pool.
    ``num_pages`` None = enough pages for ``max_batch`` requests at ``max_context``. ``layers`` keeps a subset
    of the model's layers (``draft=self``). ``kv_scale``: the per-tensor K and V scale of an fp8 KV pool
    (None = DEFAULT_KV_SCALE, 1.0; ignored for other KV dtypes). ``cuda_graph``: a graph-capable backend for
    batches up to ``max_batch`` and q_len up to ``max_q_len``. ``fused_ops``: the side's passes run
    attnlab.kernels.fused (engine.fused_ops, CUDA): a property of the side, so another side sharing the weights
    (a parity reference) still runs unfused. ``backend_options``: the side's ``backend.options`` /
    ``verify.options`` (the backend's constructor options; None for a parity reference side). ``invariant``
    (engine.invariant): the backend built with ``invariant=True`` (it must declare Capabilities.invariant), the
    side fused, its GEMMs through attnlab.models.linear.invariant_linear.
    """

    model: ModelSource
    backend: str
    dtype: str
    kv_dtype: str
    page_size: int
    max_context: int
    max_batch: int
    device: str
    name: str = "target"
    num_pages: int | None = None
    layers: tuple[int, ...] | None = None
    kv_scale: float | None = None
    fp8_gemm: str = "w8a8"  # fp8 weights: w8a8 | weight_only (FP8Linear.small_m)
    fp8_lm_head: bool = False  # fp8 weights: the LM head in e4m3 too (quantize_linears' lm_head)
    cuda_graph: bool = False
    max_q_len: int = 16
    fused_ops: bool = False
    gemm: str = "cublas"  # triton / triton_attn: passes of <= 16 tokens on attnlab.models.gemm_path (implies fused_ops)
    invariant: bool = False
    backend_options: Mapping | None = None
    decode_steps_per_sync: int = 1  # engine.decode_steps_per_sync (target-only greedy decode, multistep.py)


def build_side(spec: SideSpec, share_weights_with: ModelRunner | None = None, progress: bool = True,
               prebuilt: tuple | None = None) -> ModelRunner:
    """Build one side. ``share_weights_with`` reuses another side's model (``draft=self``, parity reference
    sides): the same module when the dtype matches, else a cast copy; ``spec.model`` is then unused.
    ``prebuilt``: (model, ModelConfig, tokenizer) of a model built elsewhere (an EAGLE head,
    attnlab.engine.eagle_side); ``spec.model`` is then unused too.

    fp8 weights: the model is built in bf16, then its layer projections are swapped for FP8Linear
    (attnlab.models.fp8); with ``share_weights_with`` that is a copy sharing every other tensor."""
    from attnlab.models.loading import load_model, load_tokenizer  # heavy imports only when building

    dev = torch.device(spec.device)
    layers = list(spec.layers) if spec.layers else None
    fp8_weights = spec.dtype == "fp8_e4m3"
    if spec.fp8_lm_head and not fp8_weights:
        raise ConfigError(f"{spec.name}: an fp8 LM head goes with fp8 weights (dtype fp8_e4m3), not {spec.dtype}")
    wdtype = torch.bfloat16 if fp8_weights else resolve_dtype(spec.dtype)  # compute dtype of the side
    if prebuilt is not None:
        model, mcfg, tok = prebuilt
    elif share_weights_with is not None:
        base = share_weights_with.model
        base = getattr(base, "parent", base)
        if fp8_weights and has_fp8_linears(base):
            model = base  # already this side's fp8 model (a rebuilt drafter for the acceptance run)
        elif fp8_weights:
            src = base if next(base.parameters()).dtype == wdtype else copy.deepcopy(base).to(wdtype)
            model = quantize_linears(src, layers=layers, inplace=src is not base, small_m=spec.fp8_gemm,
                                     lm_head=spec.fp8_lm_head)
        else:
            model = base if next(base.parameters()).dtype == wdtype else copy.deepcopy(base).to(wdtype)
        mcfg, tok = share_weights_with.model_config, share_weights_with.tokenizer
    else:
        m = spec.model
        model, mcfg = load_model(m.source, dtype=wdtype, device=dev, init=m.init, seed=m.seed,
                                 overrides=m.overrides_dict(), progress=progress)
        tok = load_tokenizer(m.source, init=m.init, config=mcfg)
        if fp8_weights:
            model = quantize_linears(model, inplace=True, small_m=spec.fp8_gemm, lm_head=spec.fp8_lm_head)
    if spec.fused_ops and dev.type != "cuda":
        raise ConfigError("engine.fused_ops=true needs device=cuda")
    if spec.gemm not in GEMM_KINDS:
        raise ConfigError(f"engine.gemm={spec.gemm!r}: choose from {', '.join(GEMM_KINDS)}")
    if spec.gemm in TRITON_GEMMS and dev.type != "cuda":
        raise ConfigError(f"engine.gemm={spec.gemm} needs device=cuda")
    # the runner hands this to every pass's AttnContext: "gemm" / "gemm_attn" select attnlab.models.gemm_path
    fused_ops = GEMM_PATHS.get(spec.gemm, spec.fused_ops)
    if layers:
        model = LayerSubset(model, list(layers))
    num_layers = len(layers) if layers else mcfg.num_layers
    max_batch, max_context, page_size, backend = spec.max_batch, spec.max_context, spec.page_size, spec.backend
    pages = spec.num_pages or auto_num_pages(max_batch, max_context, page_size)
    kv_torch_dtype = resolve_dtype(spec.kv_dtype)
    scale = ((DEFAULT_KV_SCALE if spec.kv_scale is None else float(spec.kv_scale)) if kv_torch_dtype in FP8_DTYPES
             else 1.0)
    pool = KVPool(num_layers, pages, page_size, mcfg.num_kv_heads, mcfg.head_dim, kv_torch_dtype, dev,
                  k_scale=scale, v_scale=scale)
    cls = require_available(backend, dict(spec.backend_options or {}), f"{spec.name} backend options")
    kw = {}
    if spec.cuda_graph:
        if not cls.capabilities().cuda_graph:
            raise ConfigError(f"engine.cuda_graph=true: backend {backend!r} cannot be captured in CUDA graphs "
                              f"(capabilities: no graph-safe mode); use engine.cuda_graph=false")
        if dev.type != "cuda":
            raise ConfigError("engine.cuda_graph=true needs device=cuda")
        from attnlab.engine.graphs import DEFAULT_BUCKETS

        graph_batch = next((b for b in DEFAULT_BUCKETS if b >= max_batch), max_batch)
        kw = {"cuda_graph": True, "max_batch_size": graph_batch, "max_q_len": spec.max_q_len,
              "max_context": max_context}
    if spec.invariant:
        check_invariant_side(spec, cls, mcfg)
        kw["invariant"] = True
    be = cls(pool, mcfg.num_heads, mcfg.num_kv_heads, mcfg.head_dim, mcfg.head_dim ** -0.5, wdtype, **kw)
    r = ModelRunner(model.eval(), mcfg, tok, pool, PageAllocator(pages, page_size), be, max_context, spec.name,
                    max_batch=max_batch, fused_ops=fused_ops, invariant=spec.invariant)
    r.decode_steps_per_sync = spec.decode_steps_per_sync
    return r


def check_invariant_side(spec: SideSpec, cls, mcfg) -> None:
    """What engine.invariant needs of a side that only the built model can tell (config checked the rest)."""
    if not cls.capabilities().invariant:
        raise ConfigError(f"engine.invariant=true: backend {spec.backend!r} cannot be invariant; use triton")
    if not spec.fused_ops:
        raise ConfigError("engine.invariant=true: the invariant side runs the fused one-row-per-program kernels")
    if spec.dtype == "fp8_e4m3":
        raise ConfigError("engine.invariant=true: fp8 weights (torch._scaled_mm) are not measured row-invariant; "
                          "use precision bf16/fp16/fp32")
    if mcfg.qk_norm:  # Attention.forward_fused falls back to the unfused torch path for q/k norms
        raise ConfigError("engine.invariant=true: models with q/k norms (Qwen3) run them as unfused torch ops, "
                          "whose reductions are not row-invariant; not supported yet")
