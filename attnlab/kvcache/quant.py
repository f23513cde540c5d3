"""FP8 KV quantization: pure functions for the scale policy and its error bounds.

A pool of dtype fp8 stores ``fp8(x / scale)`` and every reader multiplies by ``scale`` (KVPool.k_scale,
v_scale): one per-tensor scale per side and per K/V. Policy (docs/precision.md): the scale is *fixed*
(``precision.kv_scale``, default :data:`DEFAULT_KV_SCALE` = 1.0, as vLLM and SGLang do without
calibration files). There is no online calibration: a scale must be known before the first value is
stored, and a value stored with one scale cannot be re-read with another. :func:`kv_scale_for` gives the
scale that maps a measured amax onto the format's range, for a calibrated value set by hand.

Round-trip error of ``deq(q(x)) = scale * fp8(x / scale)`` with round-to-nearest, for |x / scale| within
range (a format with ``m`` mantissa bits):
  - normal range (|x / scale| >= smallest normal): spacing is 2^-m relative to the leading power of two,
    so the error is at most half of it: ``|err| <= 2^-(m+1) * |x|`` (e4m3: m = 3 -> 2^-4; e5m2: m = 2 -> 2^-3);
  - subnormal range: fixed spacing ``tiny * 2^-m`` (e4m3: 2^-9, e5m2: 2^-16), error at most half of that,
    times ``scale``.
Both together: ``|err| <= 2^-(m+1) * |x| + scale * tiny * 2^-(m+1)`` (:func:`roundtrip_bound`).
Beyond range, :func:`quantize` saturates to +-max (torch's cast saturates e4m3fn but overflows e5m2 to inf).
"""

from __future__ import annotations

import math

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
DEFAULT_KV_SCALE = 1.0
# explicit mantissa bits of each format (finfo has no field for it)
MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}


def _check(dtype: torch.dtype) -> None:
    if dtype not in FP8_DTYPES:
        raise ValueError(f"not an fp8 dtype: {dtype} (expected one of {FP8_DTYPES})")


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value: 448 (e4m3fn), 57344 (e5m2)."""
    _check(dtype)
    return float(torch.finfo(dtype).max)


def fp8_rel_err(dtype: torch.dtype) -> float:
    """Round-to-nearest relative error bound in the normal range: 2^-4 (e4m3), 2^-3 (e5m2)."""
    _check(dtype)
    return 2.0 ** -(MANTISSA_BITS[dtype] + 1)


def fp8_abs_floor(dtype: torch.dtype) -> float:
    """Absolute error bound in the subnormal range (unit scale): half the subnormal spacing,
    2^-10 (e4m3: tiny 2^-6, 3 bits) and 2^-17 (e5m2: tiny 2^-14, 2 bits)."""
    _check(dtype)
    return float(torch.finfo(dtype).tiny) * 2.0 ** -(MANTISSA_BITS[dtype] + 1)


def kv_scale_for(amax: float, dtype: torch.dtype, margin: float = 1.0) -> float:
    """The per-tensor scale that maps ``amax * margin`` onto the format's max (margin > 1 leaves headroom
    for values larger than the calibration set's). amax 0 (or not finite) gives the default 1.0."""
    _check(dtype)
    if margin <= 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    if not math.isfinite(amax) or amax <= 0:
        return DEFAULT_KV_SCALE
    return float(amax) * margin / fp8_max(dtype)


def quantize(x: torch.Tensor, scale: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp8(x / scale), saturating to +-max. x: any float tensor; scale: a float or a broadcastable tensor."""
    m = fp8_max(dtype)
    return (x.float() / scale).clamp(-m, m).to(dtype)


def dequantize(x8: torch.Tensor, scale: float | torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """scale * x8 in ``dtype`` (fp32 by default: what the reference backend computes with)."""
    return (x8.float() * scale).to(dtype)


def roundtrip_bound(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Element-wise bound on |dequantize(quantize(x)) - x| for |x| <= scale * fp8_max (module doc)."""
    return fp8_rel_err(dtype) * x.float().abs() + scale * fp8_abs_floor(dtype)
