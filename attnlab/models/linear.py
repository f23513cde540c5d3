"""The GEMM of ``engine.invariant`` (qkv, o, gate_up, down and the LM head of the target side): one function,
so the choice is made in one place.

An invariant GEMM computes each output row with a reduction order that depends on the weight's shape only,
never on M (the tokens of the pass: 1 in decode, batch x (k + 1) in verify, the graph bucket when padded).
Today that is the layer's own torch ``F.linear``: cuBLAS rows were measured bit-identical across M = 1, 2,
5, 9, 16 in every Llama-8B/1B/SmolLM2 layer shape on the H200 (bf16), which covers decode and verify up to
k = 15 at batch 1 but is a measurement, not a guarantee (cuBLAS may pick another algorithm at larger M,
another GPU or another version). The row-invariant small-M Triton GEMM (``attnlab.kernels.gemm``, another
branch) replaces it here when it lands: its rows do not depend on M by construction.

On CPU (tests, the Triton interpreter) BLAS rows do round by M: the divergence locator names layer 0's qkv
when a fp32 decode pass is compared with a q_len 5 verify pass through torch F.linear. There each row is its
own GEMV (M = 1 whatever the pass), invariant by construction and slow, which CPU tests can afford.

The layer is called as a module (``layer(x)``), not through its weight, so forward hooks (the divergence
locator's ``attnlab.probe.Recorder``) see it; a replacement must keep that (call the kernel from a hook-
visible place, or record it as the probe does the fused norms).
"""

from __future__ import annotations

import torch
from torch import nn


def invariant_linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x [M, in] -> [M, out] through ``layer`` (nn.Linear / FP8Linear) with rows independent of M."""
    if x.device.type != "cpu" or x.shape[0] <= 1:
        return layer(x)
    out = torch.cat([layer.forward(x[i:i + 1]) for i in range(x.shape[0])])
    for hook in layer._forward_hooks.values():  # as layer(x) would: the locator's recorder sees the whole output
        res = hook(layer, (x,), out)
        out = out if res is None else res
    return out


def project(layer: nn.Module, x: torch.Tensor, ctx) -> torch.Tensor:
    """A projection of a model layer: ``invariant_linear`` when the pass's context says ``invariant``
    (engine.invariant, the target side), else the layer itself."""
    return invariant_linear(layer, x) if getattr(ctx, "invariant", False) else layer(x)
