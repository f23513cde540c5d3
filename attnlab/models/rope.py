"""Rotary position embedding, NeoX / HF ``rotate_half`` convention, applied at explicit positions.

Pure functions. The inverse frequencies are computed exactly as transformers does (fp32), so logits
match HF bit for bit up to matmul reduction order. cos/sin are computed per forward pass from the
positions (one tiny kernel, no table to size, no host sync, CUDA-graph safe).
"""

from __future__ import annotations

import math

import torch

from attnlab.errors import ModelLoadError


def inv_freq(head_dim: int, theta: float, scaling: dict | None = None, freq_factors=None,
             device: torch.device | str | None = None) -> torch.Tensor:
    """[head_dim // 2] fp32 inverse frequencies, with optional llama3 / linear scaling."""
    base = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    if freq_factors is not None:  # llama.cpp's rope_freqs tensor: a divisor per frequency
        base = base / torch.as_tensor(freq_factors, dtype=torch.float32, device=device)
    if scaling is None:
        return base
    rtype = scaling.get("rope_type", scaling.get("type"))
    if rtype == "linear":
        return base / scaling["factor"]
    if rtype == "llama3":
        return _llama3(base, scaling)
    raise ModelLoadError(f"unsupported rope scaling {rtype!r} (supported: llama3, linear)")


def _llama3(inv: torch.Tensor, s: dict) -> torch.Tensor:
    # Llama-3.1: keep high frequencies, divide low ones by `factor`, interpolate in between.
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out)


def cos_sin(positions: torch.Tensor, inv: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] int, inv [D/2] fp32 -> cos, sin: [T, 1, D] in ``dtype`` (broadcast over heads)."""
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def position_tables(cache: dict, inv: torch.Tensor, dtype: torch.dtype,
                    num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin for positions 0 .. num_positions - 1: [num_positions, D] each in ``dtype``, on ``inv``'s device; row p
    holds the bits ``cos_sin`` gives position p (the same elementwise ops). Kept in ``cache`` by (num_positions,
    dtype, device) and never replaced there: a CUDA graph captured over a table keeps reading it."""
    key = (num_positions, dtype, inv.device)
    if key not in cache:
        cos, sin = cos_sin(torch.arange(num_positions, device=inv.device), inv, dtype)
        cache[key] = (cos[:, 0].contiguous(), sin[:, 0].contiguous())
    return cache[key]


def for_pass(positions: torch.Tensor, inv: torch.Tensor, dtype: torch.dtype,
             table: tuple[torch.Tensor, torch.Tensor] | None = None):
    """(cos, sin, positions for the GEMM's RoPE epilogue) of a pass: a runner's ``position_tables`` indexed by position
    in the epilogue (no torch ops per pass), else ``cos_sin``'s [T, 1, D] and None."""
    if table is not None:
        return table[0], table[1], positions
    return (*cos_sin(positions, inv, dtype), None)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> x * cos + rotate_half(x) * sin, same shape and dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
