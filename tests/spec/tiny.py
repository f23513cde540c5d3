"""Tiny random decoders and runners for fast speculative-decoding tests (no loader, no tokenizer)."""

from __future__ import annotations

import torch

from attnlab.backends.registry import get_backend_class
from attnlab.engine.runner import ModelRunner
from attnlab.kvcache import KVPool, PageAllocator
from attnlab.models.config import ModelConfig
from attnlab.models.decoder import Decoder
from attnlab.models.subset import LayerSubset


def tiny_config(vocab=96, layers=2, heads=4, kv_heads=2, head_dim=16, hidden=48) -> ModelConfig:
    return ModelConfig(arch="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=512)


def tiny_model(cfg: ModelConfig, seed: int, dtype=torch.float32, sharp: float = 3.0) -> Decoder:
    torch.manual_seed(seed)
    m = Decoder(cfg, dtype=dtype)
    with torch.no_grad():
        # Sharpen the output distribution so greedy argmaxes are far from ties and drafts sometimes agree.
        m.lm_head.weight.mul_(sharp)
    return m.eval()


def perturbed(model: Decoder, seed: int, noise: float) -> Decoder:
    """A second model with the same vocabulary that agrees with ``model`` part of the time."""
    import copy

    g = torch.Generator().manual_seed(seed)
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype) * noise * p.std().clamp_min(1e-3))
    return m


def runner(model, cfg: ModelConfig, page_size=16, backend="torch", max_context=256, num_pages=None,
           layers=None, name="target", max_batch=8, fused_ops=False, dtype=torch.float32) -> ModelRunner:
    """``dtype``: the pool's and the backend's (the model's compute dtype)."""
    if layers:
        model = LayerSubset(model, layers)
    n_layers = len(layers) if layers else cfg.num_layers
    pages = num_pages or max_batch * -(-max_context // page_size)
    pool = KVPool(n_layers, pages, page_size, cfg.num_kv_heads, cfg.head_dim, dtype, "cpu")
    be = get_backend_class(backend)(pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim ** -0.5,
                                    dtype)
    return ModelRunner(model, cfg, None, pool, PageAllocator(pages, page_size), be, max_context, name,
                       fused_ops=fused_ops)


def prompts(n: int, vocab: int, seed: int = 0, lengths=(1, 5, 11, 23, 8, 3)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        L = lengths[i % len(lengths)]
        # Repetitive prompts give the n-gram drafter something to find.
        base = torch.randint(0, vocab, (max(1, L // 2),), generator=g).tolist()
        out.append((base * 3)[:L])
    return out


def tiny_eagle(target: Decoder, cfg: ModelConfig, seed: int = 0, capture_layers=None, intermediate=None):
    """An untrained EAGLE-3 head for ``target`` (random weights: drafts are poor, acceptance is exact)."""
    from attnlab.models.eagle import EagleConfig, EagleHead, weights_fingerprint

    ecfg = EagleConfig.for_target(cfg, "tiny", weights_fingerprint(target), capture_layers, intermediate)
    torch.manual_seed(seed)
    head = EagleHead(ecfg, dtype=next(target.parameters()).dtype)
    return head.bind(target.embed_tokens, target.lm_head).eval().requires_grad_(False)


def eagle_runner(head, page_size=16, backend="torch", max_context=256, max_batch=8, name="draft",
                 fused_ops=False) -> ModelRunner:
    return runner(head, head.config.as_model_config(), page_size, backend, max_context, name=name,
                  max_batch=max_batch, fused_ops=fused_ops, dtype=head.dtype)
