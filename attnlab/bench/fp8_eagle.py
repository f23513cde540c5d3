"""fp8 weights in an EAGLE-3 drafter on real text: what e4m3 weights in the head's layer and in its LM-head rows cost
its acceptance, teacher-forced.

    python -m attnlab.bench.fp8_eagle [--model smollm2-135m] [--head PATH] [--prompts sharegpt] [--num-prompts 32]
                                      [--new 96] [--k 4,8] [--variants ...] [--device cpu] [--out PREFIX]

The bf16 target decodes each prompt greedily (``fp8_agree.continuations``); one teacher-forced target pass over prompt +
continuation gives its features at the head's capture layers and its argmax at every position. The head (bf16: the
one attnlab ships for the model unless ``--head``) is then unrolled over the sequence as it drafts at inference
(``attnlab.train_draft.ttt.unroll``: step 0 reads the target's features, step j its own step j - 1 output), once per
variant; each step's draft is matched against the target's argmax, and tau is walked over the continuation as greedy
decoding walks it (``ttt.walk_passes``): what ``python -m attnlab.train_draft`` reports as ``eval/walk_tau``.

Variants (``fp8_agree.EmulatedLinear``: attnlab's weight-only GEMM's numerics in torch; ``/f16``: fp8 mode half, the
f16 MMA that ``precision.fp8_mma=auto`` picks for weight-only fp8):

    bf16           the head as it runs today
    head8, head8/f16     its LM-head rows (the target's rows at its draft vocabulary) in e4m3, per-row scales
    layer8/f16     its layer's projections (fc, qkv, o, gate_up, down) in e4m3
    all8/f16       both

So: what an fp8 EAGLE drafter (``draft=eagle precision=fp8w-draft``, EagleHead.quantize_fp8) costs in acceptance, and in
particular the e4m3 LM head (``precision.fp8_lm_head``), which is most of an EAGLE drafter's bytes a step at 1B scale.
Runs on CPU (the default) or CUDA. Caveats as ``fp8_agree``'s: SmolLM2's GGUF is Q4_1, so "bf16" is its 4-bit grid,
which e4m3 then re-quantizes; one small model.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from attnlab.bench.fp8_agree import (
    EmulatedLinear,
    checked,
    continuations,
    load_study,
    num_or_dash,
    study_args,
    study_main,
    study_report,
    unwalked_note,
)
from attnlab.models.eagle import HEAD_ROLES

VARIANTS = {  # name -> (the layer's projections' mode, the LM-head rows' mode); None: bf16 as today
    "bf16": (None, None), "head8": (None, "bf16"), "head8/f16": (None, "f16"), "layer8/f16": ("f16", None),
    "all8/f16": ("f16", "f16")}
HEAD_LINEARS = tuple(HEAD_ROLES)  # the head's projections (fc, qkv_proj, o_proj, gate_up_proj, down_proj)


class HeadLinear(nn.Module):
    """EmulatedLinear in a head's projection's place; ``weight`` stays the original (the head casts its features to
    that dtype: the emulation changes the GEMM's numerics only)."""

    def __init__(self, lin: nn.Linear, mode: str):
        super().__init__()
        self.emu = EmulatedLinear(lin.weight, mode, lin.bias)
        self.weight = lin.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.emu(x)


class Variant:
    """The head with one variant's numerics: its projections swapped in place while entered (restored after), and
    the draft tokens of its normed outputs through its LM-head rows (``tokens``)."""

    def __init__(self, head, name: str):
        self.head, self.name = head, name
        layer_mode, head_mode = VARIANTS[name]
        self.linears = {n: HeadLinear(getattr(head, n), layer_mode) for n in HEAD_LINEARS} if layer_mode else {}
        rows = head._rows if head.config.draft_vocab_size else head.shared[1].weight
        self.lm = EmulatedLinear(rows, head_mode) if head_mode else None

    def __enter__(self):
        self.saved = {n: getattr(self.head, n) for n in self.linears}
        for n, m in self.linears.items():
            setattr(self.head, n, m)
        return self

    def __exit__(self, *exc):
        for n, m in self.saved.items():
            setattr(self.head, n, m)

    def tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (normed) -> draft token ids [N] in the target's vocabulary."""
        if self.lm is None:
            return self.head.greedy_tokens(hidden)
        idx = self.lm(hidden).argmax(dim=-1)
        return self.head.d2t[idx] if self.head.config.draft_vocab_size else idx


@torch.no_grad()
def measure(target, head, prompts: list[list[int]], new: int, ks: list[int], eos: set[int], names=tuple(VARIANTS),
            progress: bool = True) -> dict:
    """{name: {"tau": {k: walked tau}, "passes": {k: n}, "top1": [per step: draft == target argmax]}} and the
    continuations. ``target``: an attnlab Decoder (bf16); ``head``: an EagleHead bound to it."""
    from tqdm import tqdm

    from attnlab.train_draft.teacher import teacher_forward
    from attnlab.train_draft.ttt import entry_mask, unroll, walk_passes

    steps = max(ks)
    dev = target.embed_tokens.weight.device
    conts = continuations(target, prompts, new, eos, progress)
    seqs = []
    for p, c in tqdm(list(zip(prompts, conts)), desc="target features", disable=not progress):
        ids = torch.tensor([p + c], device=dev)
        feats, logits = teacher_forward(target, ids, tuple(head.config.capture_layers))
        answer = torch.zeros_like(ids, dtype=torch.bool)
        answer[:, len(p):] = True
        # entry e (position e) predicts x_{e+2}: the target's argmax at position e + 1
        seqs.append((ids, feats, logits[0, 1:].argmax(-1), entry_mask(answer)))
    res = {}
    for name in tqdm(names, desc="head variants", disable=not progress):
        v = Variant(head, name)
        passes = {k: [] for k in ks}
        hits, entries = [0] * steps, [0] * steps
        with v:
            for ids, feats, want, valid in seqs:
                outs = unroll(head, ids, feats, steps)
                matches = []
                for j, a in enumerate(outs):
                    m = v.tokens(head.norm(a[0])) == want
                    ok = valid[0] & (torch.arange(m.shape[0], device=dev) >= j)  # a step-j entry has j predecessors
                    hits[j] += int((m & ok).sum())
                    entries[j] += int(ok.sum())
                    matches.append(m[None])
                for k in ks:
                    passes[k] += walk_passes(matches, valid, k)[0]
        res[name] = {"tau": {k: sum(p) / len(p) if p else float("nan") for k, p in passes.items()},
                     "passes": {k: len(p) for k, p in passes.items()},
                     "top1": [h / n if n else float("nan") for h, n in zip(hits, entries)]}
    return {"variants": res, "continuations": conts}


def table(res: dict, ks: list[int]) -> list[str]:
    base = res["variants"].get("bf16")
    steps = len(next(iter(res["variants"].values()))["top1"])
    head = ("| variant | " + " | ".join(f"tau k={k}" for k in ks) + " | " +
            " | ".join(f"top-1 step {j}" for j in range(steps)) + " |")
    lines = [head, "|" + "---|" * (1 + len(ks) + steps)]
    for name, r in res["variants"].items():
        taus = " | ".join(num_or_dash(r["tau"][k], ".3f") + (f" ({r['tau'][k] / base['tau'][k] - 1:+.1%})"
                                                       if base and name != "bf16" and base["passes"][k]
                                                       and r["passes"][k] else "") for k in ks)
        top1 = " | ".join(num_or_dash(x, ".1%") for x in r["top1"])
        lines.append(f"| {name} | {taus} | {top1} |")
    return lines + unwalked_note(res, ks)


def parse(argv=None):
    ap = study_args(argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                        prog="python -m attnlab.bench.fp8_eagle"), VARIANTS, 32)
    ap.add_argument("--head", default=None, help="an EAGLE head folder (default: the one attnlab ships for --model)")
    return checked(ap, ap.parse_args(argv), VARIANTS)


def load_head_for(target, a):
    """The EAGLE head of ``--head`` (else the one shipped for ``--model``), bf16, bound to ``target``; with random
    weights an untrained head of the target's shapes (its tau then says nothing)."""
    from attnlab.models.eagle_io import head_folder, load_head, random_head

    dev = target.embed_tokens.weight.device
    if a.weights == "real":
        return load_head(head_folder(a.head, a.model), target, dtype=torch.bfloat16, device=dev)
    return random_head(target, target.config, a.model, torch.bfloat16, dev)


def run(a) -> dict:
    model, _cfg, prompts, eos = load_study(a)
    head = load_head_for(model, a)
    t0 = time.perf_counter()
    res = measure(model, head, prompts, a.new, a.ks, eos, a.names)
    hc = head.config
    return study_report(a, res, table(res, a.ks),
                        what=(f"bf16 target, EAGLE-3 head (capture layers {list(hc.capture_layers)}, draft vocabulary "
                              f"{hc.draft_vocab_size or hc.vocab_size})"),
                        how=f"teacher-forced, the head unrolled {max(a.ks)} steps per variant",
                        seconds=time.perf_counter() - t0,
                        random_note="Random weights and an untrained head: tau says nothing about real text.")


def main(argv=None) -> int:
    return study_main(parse(argv), run)


if __name__ == "__main__":
    raise SystemExit(main())
