"""The flashinfer 0.7.2.post1 modules attnlab's flashinfer backend loads, in build-priority order.

Each entry: (label, kind, q dtype, kv dtype, head_dim). kind:
  decode  - CUDA-core BatchDecode (GQA < 4, 16-bit KV): flashinfer.decode.get_batch_decode_module
  fa2     - BatchPrefill fa2 (also tensor-core decode and fp8-KV decode/prefill):
            flashinfer.prefill.get_batch_prefill_module("fa2", ...) -> _gen_batch_prefill_primary_module
            (the "_kv_stride_equal" module; the lazily-loaded independent-stride module is only for K/V
            tensors with different strides, which attnlab's (layer[0], layer[1]) views never have)
  fa3     - BatchPrefill fa3 (backend="auto" on sm90a, causal, 16-bit KV): gen_batch_prefill_module("fa3", ...)
  quant   - the "quantization" module (segment_packbits, used by plan(custom_mask=...))
Shared by build.py (CPU) and check.py (GPU); only uses torch dtypes.
"""

import torch

bf16, fp16 = torch.bfloat16, torch.float16
e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8 = (e4m3, e5m2)

VARIANTS = [
    # (1) bf16, SmolLM2 head_dim 64
    ("bf16_d64_decode", "decode", bf16, bf16, 64),
    ("bf16_d64_fa2", "fa2", bf16, bf16, 64),
    ("bf16_d64_fa3", "fa3", bf16, bf16, 64),
    ("quantization", "quant", None, None, None),
    # (2) bf16, Llama-3.1-8B head_dim 128 (decode = tensor cores = the fa2 module)
    ("bf16_d128_fa2", "fa2", bf16, bf16, 128),
    ("bf16_d128_fa3", "fa3", bf16, bf16, 128),
    # (3) fp8 KV with bf16 queries: fa3 needs fp8 queries, so decode and prefill ("auto" too) use fa2
    ("bf16_e4m3_d64_fa2", "fa2", bf16, e4m3, 64),
    ("bf16_e4m3_d128_fa2", "fa2", bf16, e4m3, 128),
    ("bf16_e5m2_d64_fa2", "fa2", bf16, e5m2, 64),
    ("bf16_e5m2_d128_fa2", "fa2", bf16, e5m2, 128),
    # (4) fp16
    ("fp16_d64_decode", "decode", fp16, fp16, 64),
    ("fp16_d64_fa2", "fa2", fp16, fp16, 64),
    ("fp16_d128_fa2", "fa2", fp16, fp16, 128),
    ("fp16_d64_fa3", "fa3", fp16, fp16, 64),
    ("fp16_d128_fa3", "fa3", fp16, fp16, 128),
]


def module_args(q, kv, d):
    """The positional args flashinfer's wrappers pass after the backend: o = q dtype, int32 indices,
    posenc NONE (0), no sliding window, no soft cap (+ no fp16 qk reduction for prefill)."""
    return (q, kv, q, torch.int32, d, d, 0, False, False)


def spec_for(kind, q, kv, d):
    """The JitSpec flashinfer itself builds for this variant (same generator, same URI)."""
    from flashinfer.jit.attention.modules import (
        _gen_batch_prefill_primary_module, gen_batch_decode_module, gen_batch_prefill_module)
    from flashinfer.jit.quantization import gen_quantization_module
    if kind == "quant":
        return gen_quantization_module()
    if kind == "decode":
        return gen_batch_decode_module(*module_args(q, kv, d))
    if kind == "fa2":
        return _gen_batch_prefill_primary_module("fa2", *module_args(q, kv, d), False)
    if kind == "fa3":
        return gen_batch_prefill_module("fa3", *module_args(q, kv, d), False)
    raise ValueError(kind)
