"""fp8 draft weights on real text: how often an e4m3 copy of the target proposes the target's own greedy token.

    python -m attnlab.bench.fp8_agree [--model smollm2-135m] [--weights auto|real|random] [--prompts sharegpt]
                                      [--num-prompts 16] [--new 96] [--k 4,8] [--device cpu] [--out PREFIX]

The target (bf16) decodes each prompt greedily; then every variant reads prompt + continuation in one teacher-forced
pass, and at each continuation position its argmax either is the target's token or not. A variant is the target with
its GEMMs' numerics swapped for those of an fp8 precision, emulated in torch at every M (``EmulatedLinear``: the
products attnlab's GEMM forms, summed in fp32 in torch's order):

    bf16         the target itself (the floor: near-ties between a cached decode and one pass over everything)
    fp8w         precision=fp8w-draft: the layer projections' weights in e4m3 with per-row scales, x in bf16 (the
                 fp8 modes cast / ptx / wide: the exactly dequantized weights)
    fp8w/f16     and precision.fp8_mma=f16 (fp8 mode half): x rounded to f16, saturated at +-65504
    fp8wh, fp8wh/f16  the same with the LM head in e4m3 too (precision.fp8_lm_head=true)
    w8a8         precision=fp8-draft: x quantized per row to e4m3 as well (torch._scaled_mm's numerics)

Columns: agreement (the share of continuation positions whose argmax is the target's token); tau at each k: a chain
drafter made of all of the variant's layers proposing k tokens a round against the bf16 target, walked over the
agreement sequence as greedy decoding walks it (``attnlab.train_draft.ttt.walk_passes``: the first token is the
prefill's, a pass accepts the run of agreements from its start, at most k, plus the target's own token; passes whose
k drafts would run past the continuation are not walked), so the acceptance an fp8 copy of the target would have as
its own drafter: its numerics' cost alone (1 + k at no cost);
and the mean KL(target || variant) of the next-token distributions. Any drafter built from these weights (fewer layers,
a head) loses at most what this shows on top of its own disagreement.

Runs on CPU (the default, and CI's smoke on the tiny model) or CUDA. Real weights where the preset packages them
(SmolLM2-135M's GGUF), else random (acceptance then says nothing about real text, and the output says so). Caveats:
that GGUF is Q4_1, so "bf16" is its 4-bit grid dequantized, which e4m3 then re-quantizes (a bf16 checkpoint's weights
are another case); precision=fp8w-draft runs passes of more than 16 rows (prefill) W8A8, where this study runs the
weight-only numerics at every M; and one small model's activations say little about saturation (|x| > 65504) in the
f16 MMA of a larger one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
from torch import nn

F16_MAX = 65504.0
VARIANTS = {  # name -> (layer projections' mode, the LM head's mode); modes: EmulatedLinear.MODES, None: as the target
    "bf16": (None, None), "fp8w": ("bf16", None), "fp8w/f16": ("f16", None), "fp8wh": ("bf16", "bf16"),
    "fp8wh/f16": ("f16", "f16"), "w8a8": ("w8a8", None)}
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


class EmulatedLinear(nn.Module):
    """``y = x @ W.T`` with W in e4m3 (``quantize_rows``: per-row scales), in torch at any M, the numerics of the
    weight-only GEMM (attnlab.kernels.gemm): ``bf16`` its exact fp8 modes (x as it is against the e4m3 values, the row
    scale on the fp32 sum), ``f16`` its fp8 mode half (x rounded to f16 and saturated, as ``gemm._bf16_to_f16``).
    Products are exact in fp32 in both; only the summation order differs from the GPU's. Per-row scales make a fused
    projection's rows (qkv, gate_up) the same as its parts' (q, k, v, ...). W8A8 needs no emulation here: FP8Linear's
    ``emulate`` is it."""

    MODES = ("bf16", "f16")

    def __init__(self, weight: torch.Tensor, mode: str, bias: torch.Tensor | None = None):
        from attnlab.models.fp8 import quantize_rows

        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"EmulatedLinear mode {mode!r}: choose from {', '.join(self.MODES)}")
        self.mode = mode
        w8, scale = quantize_rows(weight.detach())
        self.weight = w8.float()  # exactly the e4m3 values
        self.scale = scale.view(1, -1)
        self.bias = None if bias is None else bias.detach().float()  # on the fp32 sum, as the GEMM's epilogue

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if self.mode == "f16":
            xf = xf.clamp(-F16_MAX, F16_MAX).half().float()
        y = (xf @ self.weight.T) * self.scale
        return (y if self.bias is None else y + self.bias).to(x.dtype)


def _emulated(lin: nn.Linear, mode: str) -> nn.Module:
    if mode == "w8a8":
        from attnlab.models.fp8 import FP8Linear

        return FP8Linear.from_linear(lin, emulate=True)  # x quantized per row too: torch._scaled_mm's numerics
    return EmulatedLinear(lin.weight, mode, lin.bias)


def variant(hf, name: str):
    """The HF view ``hf`` with ``name``'s numerics (VARIANTS): its projections (and LM head) swapped in place for
    EmulatedLinear (W8A8: an emulated FP8Linear); every other tensor stays shared."""
    layers_mode, head_mode = VARIANTS[name]
    if layers_mode is not None:
        for layer in hf.model.layers:
            for path in PROJECTIONS:
                parent, attr = path.split(".")
                mod = getattr(layer, parent)
                setattr(mod, attr, _emulated(getattr(mod, attr), layers_mode))
    if head_mode is not None:
        hf.lm_head = _emulated(hf.lm_head, head_mode)
    return hf


def walk(agree: list[bool], k: int) -> list[int]:
    """Tokens per verify pass of greedy chain decoding with k drafts whose draft at continuation position i is right
    iff ``agree[i]`` (the same for every draft step: the drafter reads the target's tokens up to its first miss), as
    ``attnlab.train_draft.ttt.walk_passes`` walks it (module docstring)."""
    from attnlab.train_draft.ttt import walk_passes

    row = torch.tensor([agree], dtype=torch.bool)
    return walk_passes([row] * k, torch.ones_like(row), k)[0]


@torch.no_grad()
def measure(model, prompts: list[list[int]], new: int, ks: list[int], eos: set[int], names=tuple(VARIANTS),
            progress: bool = True) -> dict:
    """Continuations of ``prompts`` by the bf16 target (an attnlab Decoder), then every variant of ``names`` read
    over them: {name: {"agreement", "tau": {k: tau}, "kl", "positions"}}, and the continuations."""
    from tqdm import tqdm

    from attnlab.bench.hf import to_hf

    dev = model.embed_tokens.weight.device
    target = to_hf(model)
    conts = continuations(model, prompts, new, eos, progress)
    ref = [_logits(target, p, c, dev) for p, c in zip(prompts, conts)]
    res = {}
    for name in tqdm(names, desc="variants", disable=not progress):
        hf = variant(to_hf(model), name)
        agree, kls = [], []
        for p, c, lr in zip(prompts, conts, ref):
            lv = _logits(hf, p, c, dev)
            agree.append((lv.argmax(-1).cpu() == torch.tensor(c)).tolist())
            kls.append(torch.nn.functional.kl_div(lv.log_softmax(-1), lr.log_softmax(-1), log_target=True,
                                                  reduction="none").sum(-1).cpu())
        flat = [a for row in agree for a in row]
        passes = {k: [t for a in agree for t in walk(a, k)] for k in ks}
        res[name] = {"agreement": sum(flat) / max(1, len(flat)), "positions": len(flat),
                     "tau": {k: sum(p) / len(p) if p else float("nan") for k, p in passes.items()},
                     "passes": {k: len(p) for k, p in passes.items()}, "kl": torch.cat(kls).mean().item()}
    return {"variants": res, "continuations": conts}


@torch.no_grad()
def continuations(model, prompts: list[list[int]], new: int, eos: set[int], progress: bool = True) -> list[list[int]]:
    """The target's greedy continuation of each prompt (at most ``new`` tokens, EOS included), via HF ``generate`` on
    its weights (attnlab.bench.hf.to_hf)."""
    from tqdm import tqdm

    from attnlab.bench.hf import to_hf

    dev = model.embed_tokens.weight.device
    target = to_hf(model)
    conts = []
    for p in tqdm(prompts, desc="target decodes", disable=not progress):
        ids = torch.tensor([p], device=dev)
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                              eos_token_id=sorted(eos) or None, pad_token_id=0)
        conts.append(out[0, len(p):].tolist())
    return conts


def _logits(hf, prompt: list[int], cont: list[int], dev) -> torch.Tensor:
    """fp32 logits at the positions that predict each continuation token: [len(cont), vocab]."""
    ids = torch.tensor([prompt + cont], device=dev)
    logits = hf(ids).logits[0, len(prompt) - 1:len(prompt) - 1 + len(cont)]
    return logits.float()


def table(res: dict, ks: list[int]) -> list[str]:
    head = "| variant | agreement | " + " | ".join(f"tau k={k}" for k in ks) + " | KL (nats) |"
    lines = [head, "|" + "---|" * (3 + len(ks))]
    for name, r in res["variants"].items():
        taus = " | ".join(num_or_dash(r["tau"][k], ".2f") for k in ks)
        lines.append(f"| {name} | {r['agreement']:.2%} ({r['positions']}) | {taus} | {r['kl']:.2e} |")
    return lines + unwalked_note(res, ks)


def num_or_dash(x: float, fmt: str) -> str:
    """``x`` in ``fmt``; ``-`` for NaN (nothing measured)."""
    return "-" if math.isnan(x) else format(x, fmt)


def unwalked_note(res: dict, ks: list[int]) -> list[str]:
    """A note under the table where a k has no pass (its tau ``-``): no continuation was k + 1 tokens long (the target
    stopped at EOS before ``--new``)."""
    empty = [k for k in ks if not any(r["passes"][k] for r in res["variants"].values())]
    if not empty:
        return []
    note = (f"\n-: no pass of k={','.join(map(str, empty))} drafts fit a continuation (a pass needs k + 1 continuation "
            "tokens; the target stopped at EOS before --new): raise --num-prompts or --new, or lower --k")
    return [note]


def study_args(ap: argparse.ArgumentParser, variants: dict, num_prompts: int) -> argparse.ArgumentParser:
    """The arguments this study and ``fp8_eagle``'s share (their variants and default prompt count differ)."""
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--weights", choices=("auto", "real", "random"), default="auto")
    ap.add_argument("--prompts", default="sharegpt", help="builtin | sharegpt (held-out split) | an exported file")
    ap.add_argument("--num-prompts", type=int, default=num_prompts)
    ap.add_argument("--new", type=int, default=96, help="continuation tokens per prompt (the target stops at EOS)")
    ap.add_argument("--k", default="4,8", help="draft tokens per round for tau, comma-separated")
    ap.add_argument("--variants", default=",".join(variants), help=f"comma-separated, from {', '.join(variants)}")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    return ap


def checked(ap: argparse.ArgumentParser, a: argparse.Namespace, variants: dict) -> argparse.Namespace:
    """``study_args``' values checked (argparse errors), with ``ks``, ``names`` and the resolved ``weights``."""
    try:
        a.ks = sorted({int(k) for k in a.k.split(",") if k.strip()})
    except ValueError:
        ap.error(f"--k {a.k!r}: comma-separated positive ints")
    if not a.ks or min(a.ks) < 1:
        ap.error(f"--k {a.k!r}: comma-separated positive ints")
    a.names = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in a.names if v not in variants]
    if bad or not a.names:
        ap.error(f"--variants: {', '.join(bad) or 'none'}: choose from {', '.join(variants)}")
    if a.num_prompts < 1 or a.new < 1:
        ap.error("--num-prompts and --new must be >= 1")
    if max(a.ks) >= a.new:  # walk_passes: a pass of k drafts reads a continuation token and needs k more after it
        too_big = ",".join(str(k) for k in a.ks if k >= a.new)
        ap.exit(2, f"{ap.prog}: error: --k {too_big} cannot be measured over --new {a.new} tokens: tau at k needs a "
                   f"continuation of >= k + 1 tokens; raise --new to >= {max(a.ks) + 1} or lower --k\n")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: no CUDA device here")
    from attnlab.bench.spec import resolve_weights

    a.weights = resolve_weights(ap, a.model, a.weights)
    return a


def load_study(a: argparse.Namespace):
    """-> (the bf16 target, its ModelConfig, the prompts' token ids, its EOS ids) for ``a``."""
    from attnlab.bench.spec import load_prompts
    from attnlab.models.loading import load_model, load_tokenizer

    init = "pretrained" if a.weights == "real" else "random"
    model, cfg = load_model(a.model, dtype=torch.bfloat16, device=torch.device(a.device), init=init, progress=False)
    tok = load_tokenizer(a.model, init=init, config=cfg) if a.weights == "real" else None
    prompts = load_prompts(a.weights, a.num_prompts, cfg.vocab_size, tok, a.prompts)
    return model, cfg, prompts, set(cfg.eos_token_ids) if a.weights == "real" else set()


def study_main(a: argparse.Namespace, run) -> int:
    """Run a study (``run(a)`` -> a dict with "markdown"), print its table, write PREFIX.json / .md under --out."""
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    out = run(a)
    print(out["markdown"], flush=True)
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump(out, f, indent=1, default=str)
        with open(a.out + ".md", "w") as f:
            f.write(out["markdown"] + "\n")
    return 0


def parse(argv=None):
    ap = study_args(argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                        prog="python -m attnlab.bench.fp8_agree"), VARIANTS, 16)
    return checked(ap, ap.parse_args(argv), VARIANTS)


def study_report(a: argparse.Namespace, res: dict, table_lines: list[str], *, what: str, how: str, seconds: float,
                 random_note: str) -> dict:
    """A study's output (``study_main`` prints and writes it): a header naming the device, versions, model and weights,
    ``what`` ran on how many prompts and positions and ``how``, then ``table_lines``, and ``random_note`` under random
    weights."""
    from attnlab.bench.kernels import versions

    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else "CPU"
    head = (f"{dev}; {versions()}; {a.model} ({a.weights} weights), {what}; {len(res['continuations'])} {a.prompts} "
            f"prompts x <= {a.new} greedy tokens ({sum(map(len, res['continuations']))} positions), {how} "
            f"({seconds:.0f} s)")
    lines = [head, ""] + table_lines
    if a.weights == "random":
        lines.append("\n" + random_note)
    return {"header": head, "args": dict(vars(a)), **res, "markdown": "\n".join(lines)}


def run(a) -> dict:
    model, _cfg, prompts, eos = load_study(a)
    t0 = time.perf_counter()
    res = measure(model, prompts, a.new, a.ks, eos, a.names)
    return study_report(a, res, table(res, a.ks), what="bf16 target", how="teacher-forced per variant",
                        seconds=time.perf_counter() - t0,
                        random_note="Random weights: agreement says nothing about real text.")


def main(argv=None) -> int:
    return study_main(parse(argv), run)


if __name__ == "__main__":
    raise SystemExit(main())
