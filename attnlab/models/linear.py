"""The GEMM of ``engine.invariant`` (qkv, o, gate_up, down and the LM head of the target side): one function,
so the choice is made in one place.

An invariant GEMM computes each output row with a reduction order that depends on the weight's shape only,
never on M (the tokens of the pass: 1 in decode, batch x (k + 1) in verify, the graph bucket when padded).
Today that is the layer's own torch ``F.linear``: cuBLAS rows were measured bit-identical across M = 1, 2,
5, 9, 16 in every Llama-8B/1B/SmolLM2 layer shape on the H200 (bf16), which covers decode and verify up to
k = 15 at batch 1 but is a measurement, not a guarantee (cuBLAS may pick another algorithm at larger M,
another GPU or another version). The row-invariant small-M Triton GEMM (``attnlab.kernels.gemm``, another
branch) replaces it here when it lands: its rows do not depend on M by construction.

The layer is called as a module (``layer(x)``), not through its weight, so forward hooks (the divergence
locator's ``attnlab.probe.Recorder``) see it; a replacement must keep that (call the kernel from a hook-
visible place, or record it as the probe does the fused norms).
"""

from __future__ import annotations

import torch
from torch import nn


def invariant_linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x [M, in] -> [M, out] through ``layer`` (nn.Linear / FP8Linear) with rows independent of M."""
    return layer(x)


def project(layer: nn.Module, x: torch.Tensor, ctx) -> torch.Tensor:
    """A projection of a model layer: ``invariant_linear`` when the pass's context says ``invariant``
    (engine.invariant, the target side), else the layer itself."""
    return invariant_linear(layer, x) if getattr(ctx, "invariant", False) else layer(x)
