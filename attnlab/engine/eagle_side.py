"""The draft side of ``draft=eagle``: a trained EAGLE-3 head on its own one-layer KV pool and backend.

The head shares the target's embedding and LM head (the same modules when the side's dtype is the
target's; a cast copy of those two otherwise) and is checked against the target's weights fingerprint, so a
head trained for another checkpoint is refused with one line instead of drafting garbage.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from attnlab.engine.build import SideSpec, build_side, resolve_dtype
from attnlab.engine.runner import ModelRunner
from attnlab.errors import ConfigError


def build_eagle_side(target: ModelRunner, head_path: str | None, target_name: str, spec: SideSpec,
                     check: bool = True) -> ModelRunner:
    """``head_path``: a folder written by ``python -m attnlab.train_draft`` (None = the head bundled for
    preset ``target_name``). ``spec``: the draft side's SideSpec (backend, dtypes, KV sizes, graphs; its
    ``model`` and ``layers`` are unused: the head is one layer on the target's weights)."""
    from attnlab.models.eagle_io import head_folder, load_head

    base = target.model
    if getattr(base, "parent", None) is not None:
        raise ConfigError("draft=eagle reads the full target's features; the target side cannot be a layer subset")
    wdtype = resolve_dtype(spec.dtype)
    if wdtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ConfigError(f"draft=eagle: precision.draft={spec.dtype!r} unsupported (fp32, fp16 or bf16; fp8 "
                          f"weights are for draft=self and draft=model)")
    head = load_head(head_folder(head_path, target_name), base, dtype=wdtype, device=target.device, check=check)
    if next(base.parameters()).dtype != wdtype:  # the head computes in its own dtype: cast the shared pair
        embed = copy.deepcopy(base.embed_tokens).to(wdtype)
        if base.lm_head.weight is base.embed_tokens.weight:  # tied: keep them tied in the copy
            lm_head = torch.nn.Linear(*reversed(embed.weight.shape), bias=False, device=target.device, dtype=wdtype)
            lm_head.weight = embed.weight
        else:
            lm_head = copy.deepcopy(base.lm_head).to(wdtype)
        head.bind(embed, lm_head)
    return build_side(replace(spec, layers=None), prebuilt=(head, head.config.as_model_config(), target.tokenizer))
