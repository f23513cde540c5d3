"""End-to-end decode benchmarks, side by side in one process (CUDA only).

    python -m attnlab.bench.e2e [--quick] [--backends triton,flashinfer] [--host legacy,thin,thin8] [--out PREFIX]

1. target-only decode of SmolLM2-135M shapes at batch 1 and 16: attnlab eager vs attnlab with CUDA graphs
   (per backend) vs HF transformers ``generate`` on the same weights;
2. Llama-3.2-1B (draft) and Llama-3.1-8B (target) shapes at batch 1 (random weights) with CUDA graphs,
   unfused, with ``engine.fused_ops`` (attnlab/kernels/fused.py) and with ``engine.gemm=triton`` (rows
   ``-gemm``: attnlab's small-M GEMM with the norms, RoPE, SiLU-mul and residual adds fused in; attnlab/models/
   gemm_path.py), vs the weight-bandwidth roofline: the bytes of weights one decode step reads
   (every parameter but an untied embedding table, of which a step reads one row) / the measured
   device-to-device copy bandwidth;
3. the share of an iteration spent outside the model forward (per-iteration host overhead) at batch 1.

Every CUDA-graph row runs once per host path (``--host``, the ``host`` column), same weights, same process:
``legacy`` is the previous path (one pageable host-to-device copy per metadata tensor, about 8 per pass; the
argmax launched after the replay; one step per sync), ``thin`` one pinned copy per pass and the argmax inside
the graph, ``thinN`` thin plus N greedy steps per graph replay and host sync (engine.decode_steps_per_sync=N).
The ``H2D/token`` column counts the metadata copies per decoded token (ModelRunner.staging).

Weights are random (``init=random``): decode speed does not depend on their values, and no checkpoint is
needed. Speculative pairs with real acceptance are measured by the runner (``python -m attnlab``), whose
metrics.json has tau, speedup and per-phase times.
"""

from __future__ import annotations

import argparse
import re
import time

import torch

from attnlab.bench.kernels import copy_bandwidth_gb_s, versions
from attnlab.bench.output import write_report
from attnlab.engine.build import SideSpec, build_side
from attnlab.plan import GEMM_PATHS, ModelSource
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import NoDrafter

WEIGHTS = ("bf16", "fp8w", "fp8wh")  # a side's weights: bf16; e4m3 layer projections converted in the small-M GEMM
# (fp8w); those and the LM head (fp8wh: precision.fp8_lm_head)


def side(model: str, backend: str, batch: int, graphs: bool, max_context: int, dtype="bf16", fused=False,
         weights: str = "bf16"):
    """A target side; with ``graphs`` its backend is graph-capable and ``set_host_path`` captures the graphs.
    fused: False | True (engine.fused_ops) | "gemm" (engine.gemm=triton) | "gemm_attn" (engine.gemm=triton_attn).
    weights: ``bf16`` (``dtype``'s), or ``fp8w``: the layer projections' weights e4m3 with per-row scales, weight-only
    at small M (precision=fp8w-draft's weights; the KV pool stays ``dtype``); ``fp8wh``: the LM head too."""
    spec = SideSpec(ModelSource(model, init="random"), backend, kv_dtype=dtype, page_size=16, max_context=max_context,
                    max_batch=batch, device="cuda", cuda_graph=graphs, max_q_len=1, fused_ops=bool(fused),
                    gemm={path: kind for kind, path in GEMM_PATHS.items()}.get(fused, "cublas"),
                    **weights_spec(weights, dtype))
    return build_side(spec, progress=False)


def weights_spec(weights: str, dtype: str) -> dict:
    """The SideSpec fields of a side's ``weights`` (WEIGHTS): ``dtype`` for bf16; fp8w / fp8wh: e4m3 weights,
    weight-only at small M (precision=fp8w-draft), the LM head too for fp8wh."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: choose from {', '.join(WEIGHTS)}")
    if weights == "bf16":
        return {"dtype": dtype}
    return {"dtype": "fp8_e4m3", "fp8_gemm": "weight_only", "fp8_lm_head": weights == "fp8wh"}


def _suffix(fused) -> str:
    return {False: "", True: "-fused", "gemm": "-gemm", "gemm_attn": "-gemm-attn"}[fused]


def check_host(names: str) -> list[str]:
    """--host value -> host path names; each is legacy, thin or thinN (N >= 2)."""
    out = [h.strip() for h in names.split(",") if h.strip()]
    for h in out:
        if not re.fullmatch(r"legacy|thin([2-9]|[1-9][0-9]+)?", h):
            raise argparse.ArgumentTypeError(f"{h!r} is not legacy, thin or thinN (N >= 2)")
    return out


def set_host_path(runner, host: str) -> None:
    """Switch a built side to a host path (see the module doc), re-capturing its graphs."""
    runner.staging.packed = runner.graph_argmax = host != "legacy"
    runner.decode_steps_per_sync = int(host[4:]) if host.startswith("thin") and host != "thin" else 1
    if getattr(runner.backend, "cuda_graph", False):  # a graph side (built with cuda_graph=True)
        runner.capture_graphs(q_lens=(1,))


def step_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: all parameters and the fp8 projections' weights, scales and biases
    (FP8Linear buffers), minus an untied input embedding (one row read)."""
    from attnlab.models.fp8 import FP8Linear

    fp8 = [b for m in model.modules() if isinstance(m, FP8Linear) for b in m.buffers(recurse=False)]
    total = sum(p.numel() * p.element_size() for p in [*model.parameters(), *fp8])
    emb = model.embed_tokens.weight
    return total if model.lm_head.weight is emb else total - emb.numel() * emb.element_size()


def roofline_tok_s(weight_bytes: int, batch: int, copy_gb_s: float) -> float:
    """The weight-bandwidth roofline of decode: every step reads the weights once for the whole batch, at the copy
    bandwidth -> tokens per second."""
    if weight_bytes <= 0 or batch < 1 or copy_gb_s <= 0:
        raise ValueError(f"roofline_tok_s: weight_bytes {weight_bytes}, batch {batch}, copy_gb_s {copy_gb_s}")
    return batch * copy_gb_s * 1e9 / weight_bytes


def random_prompts(vocab: int, batch: int, length: int = 32, seed: int = 0) -> list[list[int]]:
    """``batch`` seeded random prompts of ``length`` token ids (ids >= 100: clear of a tokenizer's specials)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(batch)]


def target_only(runner) -> SpeculativeDecoder:
    """The runner decoding alone: greedy, no drafter."""
    return SpeculativeDecoder(runner, NoDrafter("cuda"), SpecParams(0))


def timed_generate(dec: SpeculativeDecoder, prompts: list[list[int]], new: int):
    """-> (the generate output, its decode time in ms: the iterations' time, the prefill excluded)."""
    torch.cuda.synchronize()
    out = dec.generate(prompts, new)
    return out, sum(i.total_ms for i in out.iterations)


def attnlab_tok_s(runner, batch: int, prompt_len: int, new: int, reps: int = 3) -> dict:
    prompts = random_prompts(runner.model_config.vocab_size, batch, prompt_len)
    dec = target_only(runner)
    dec.generate(prompts, 8)  # untimed warmup (compiles kernels)
    best = None
    for _ in range(reps):
        copies = runner.staging.copies
        out, decode_ms = timed_generate(dec, prompts, new)
        model_ms = sum(i.verify_ms for i in out.iterations)
        tok_s = batch * (new - 1) / (decode_ms / 1e3)  # decode tokens only: prefill excluded
        if best is None or tok_s > best["tok_s"]:
            # per decoded token (one iteration = N tokens with decode_steps_per_sync = N); the prefill's copy
            # is in h2d_per_token
            best = {"tok_s": tok_s, "ms_per_step": decode_ms / (new - 1), "overhead_frac": 1 - model_ms / decode_ms,
                    "h2d_per_token": (runner.staging.copies - copies) / (new - 1),
                    "syncs_per_token": len(out.iterations) / (new - 1)}
    return best


def hf_tok_s(model_name: str, batch: int, prompt_len: int, new: int) -> dict:
    """HF transformers generate (eager decoding loop, default attention) on the same shapes, bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnlab.models.loading import read_config, resolve_source

    c = read_config(resolve_source(model_name, "random"))
    hf_cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                         num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
                         tie_word_embeddings=c.tie_word_embeddings, max_position_embeddings=c.max_position_embeddings)
    with torch.device("cuda"):
        m = LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    x = torch.randint(100, c.vocab_size, (batch, prompt_len), device="cuda")
    kw = {"attention_mask": torch.ones_like(x), "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    m.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    m.generate(x, max_new_tokens=new, min_new_tokens=new, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del m
    torch.cuda.empty_cache()
    return {"tok_s": batch * new / dt}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.e2e",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="triton,flashinfer")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--host", type=check_host, default=check_host("legacy,thin,thin8"),
                    help="host paths of every CUDA-graph row: legacy, thin, thinN (default legacy,thin,thin8)")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attnlab.bench.e2e needs a CUDA GPU")
        return 2
    new = 64 if a.quick else 256
    res: dict = {"gpu": torch.cuda.get_device_name(), "versions": versions(), "copy_gb_s": copy_bandwidth_gb_s(),
                 "rows": []}
    rows = res["rows"]
    lines = [f"GPU {res['gpu']}; copy bandwidth {res['copy_gb_s']:.0f} GB/s; {res['versions']}", "",
             "| model | batch | engine | host | tok/s | ms/step | outside-forward share | H2D/token | vs HF |",
             "|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")

    def row(model, batch, engine, r, hf=None, host=""):
        rows.append({"model": model, "batch": batch, "engine": engine, "host": host, **r})
        vs = f"{r['tok_s'] / hf:.1f}x" if hf else ""
        lines.append(f"| {model} | {batch} | {engine} | {host} | {r['tok_s']:.0f} | {r.get('ms_per_step', nan):.2f} | "
                     f"{r.get('overhead_frac', nan):.0%} | {r.get('h2d_per_token', nan):.2f} | {vs} |")
        print(lines[-1], flush=True)

    for batch in (1, 16):
        hf = hf_tok_s("smollm2-135m", batch, 32, new)
        row("smollm2-135m", batch, "hf-generate", hf)
        for be in a.backends.split(","):
            for graphs, fused in ((False, False), (True, False), (True, True), (True, "gemm")):
                name = f"attnlab-{be}{'-graphs' if graphs else '-eager'}{_suffix(fused)}"
                try:
                    rs = side("smollm2-135m", be, batch, graphs, 32 + new + 16, fused=fused)
                except Exception as e:  # noqa: BLE001 - one engine failing must not lose the table
                    lines.append(f"| smollm2-135m | {batch} | {name} | | error: {e!r} |||||")
                    print(lines[-1], flush=True)
                    continue
                for host in a.host if graphs else ["thin"]:
                    try:
                        set_host_path(rs, host)
                        row("smollm2-135m", batch, name, attnlab_tok_s(rs, batch, 32, new), hf["tok_s"], host)
                    except Exception as e:  # noqa: BLE001 - one engine failing must not lose the table
                        lines.append(f"| smollm2-135m | {batch} | {name} | {host} | error: {e!r} |||||")
                        print(lines[-1], flush=True)
                del rs
                torch.cuda.empty_cache()
    notes = []
    for model in ([] if a.skip_8b else ["llama-3.2-1b", "llama-3.1-8b"]):  # the draft / target shapes
        rm = side(model, "triton", 1, True, 32 + new + 16)
        weight_bytes = step_weight_bytes(rm.model)
        roof = roofline_tok_s(weight_bytes, 1, res["copy_gb_s"])
        for fused in (False, True, "gemm"):
            rm.fused_ops = fused  # the runner hands it to each pass's AttnContext ("gemm": models/gemm_path)
            for host in a.host:
                set_host_path(rm, host)  # re-captures the graphs: fused or not, this host path
                r = attnlab_tok_s(rm, 1, 32, new)
                r["roofline_tok_s"], r["frac_roofline"], r["weight_bytes"] = roof, r["tok_s"] / roof, weight_bytes
                row(model, 1, f"attnlab-triton-graphs{_suffix(fused)}", r, host=host)
                what = {False: "", True: ", fused ops", "gemm": ", engine.gemm=triton"}[fused]
                notes.append(f"{model} shapes, batch 1{what}, host {host}: "
                             f"{r['tok_s']:.1f} tok/s = {r['frac_roofline']:.0%} of the weight-bandwidth roofline "
                             f"({weight_bytes / 1e9:.2f} GB read per step / copy bw = {roof:.1f} tok/s)")
                print(notes[-1], flush=True)
        del rm
        torch.cuda.empty_cache()
    lines += [""] + notes if notes else []
    write_report(a.out, res, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
