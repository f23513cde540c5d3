"""The draft side of ``draft=eagle``: a trained EAGLE-3 head on its own one-layer KV pool and backend.

The head shares the target's embedding and LM head (the same modules when the side's dtype is the
target's; a cast copy of those two otherwise) and is checked against the target's weights fingerprint, so a
head trained for another checkpoint is refused with one line instead of drafting garbage.

fp8 weights (``precision.draft=fp8_e4m3``: precision=fp8-draft / fp8w-draft): the head is loaded in bf16 and its
projections become e4m3 FP8Linear modules (``precision.fp8_gemm``: W8A8, or weight-only at small M); with
``precision.fp8_lm_head`` the LM-head rows it scores too (an e4m3 copy of its own: the target's head stays bf16).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from attnlab.engine.build import SideSpec, build_side, resolve_dtype
from attnlab.engine.runner import ModelRunner
from attnlab.errors import ConfigError


def build_eagle_side(target: ModelRunner, head_path: str | None, target_name: str, spec: SideSpec,
                     check: bool = True, random_head: bool = False) -> ModelRunner:
    """``head_path``: a folder written by ``python -m attnlab.train_draft`` (None = the head bundled for
    preset ``target_name``). ``random_head`` (bench.spec ``--eagle-head random``; never a run's draft.path): an
    untrained head of the target's shapes instead (eagle_io.random_head), for timing at any preset's shapes, where
    its acceptance means nothing. ``spec``: the draft side's SideSpec (backend, dtypes, KV
    sizes, graphs; its ``model`` and ``layers`` are unused: the head is one layer on the target's weights)."""
    from attnlab.models.eagle_io import head_folder, load_head
    from attnlab.models.eagle_io import random_head as untrained

    base = target.model
    if getattr(base, "parent", None) is not None:
        raise ConfigError("draft=eagle reads the full target's features; the target side cannot be a layer subset")
    fp8 = spec.dtype == "fp8_e4m3"
    wdtype = torch.bfloat16 if fp8 else resolve_dtype(spec.dtype)  # fp8 weights compute in bf16
    if wdtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ConfigError(f"draft=eagle: precision.draft={spec.dtype!r} unsupported (fp32, fp16, bf16 or "
                          f"fp8_e4m3 weights)")
    if spec.fp8_lm_head and not fp8:
        raise ConfigError(f"draft=eagle: an fp8 LM head goes with fp8 weights (precision.draft=fp8_e4m3), not "
                          f"{spec.dtype}")
    if random_head:
        head = untrained(base, target.model_config, target_name, wdtype, target.device)
    else:
        head = load_head(head_folder(head_path, target_name), base, dtype=wdtype, device=target.device, check=check)
    if fp8:  # while bound to the target's own modules: e4m3 LM-head rows from its weights, rounded once
        try:
            head.quantize_fp8(small_m=spec.fp8_gemm, lm_head=spec.fp8_lm_head)
        except ValueError as e:
            raise ConfigError(f"draft=eagle with fp8 weights: {e}") from None
    if next(base.parameters()).dtype != wdtype:  # the head computes in its own dtype: cast the shared pair
        embed = copy.deepcopy(base.embed_tokens).to(wdtype)
        if fp8 and spec.fp8_lm_head:  # the head scores its e4m3 rows, never this module: no cast copy
            lm_head = base.lm_head
        elif base.lm_head.weight is base.embed_tokens.weight:  # tied: keep them tied in the copy
            lm_head = torch.nn.Linear(*reversed(embed.weight.shape), bias=False, device=target.device, dtype=wdtype)
            lm_head.weight = embed.weight
        else:
            lm_head = copy.deepcopy(base.lm_head).to(wdtype)
        head.bind(embed, lm_head)
    return build_side(replace(spec, layers=None), prebuilt=(head, head.config.as_model_config(), target.tokenizer))

