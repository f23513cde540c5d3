"""Serving side by side in one process: the continuous-batching engine (attnlab.engine.serve) per backend pair
and drafter under closed-loop concurrencies and Poisson rates, each side built once for every setting.

    python -m attnlab.bench.serving [--device cuda] [--backends triton,flashinfer] [--draft-backends ...]
                                    [--drafters eagle,none] [--k 4] [--prompts builtin|sharegpt|FILE.jsonl.gz]
                                    [--output-len recorded|fixed] [--max-new 128] [--closed 1,8,32,100]
                                    [--poisson 8,32,128] [--max-running N] [--out PREFIX]

Why one process: a Hydra job per (pair, drafter, load) rebuilds the model, captures CUDA graphs and warms up
every time (30-40 s per job on an H200 for a 5 s measurement). Here each verify backend's target side is built
once (max batch = ``--max-running``; CUDA graphs for q_len 1 and k + 1 in the buckets up to it, captured once)
and serves the target-only rows (``none``) of every setting; each drafter x draft backend is then built once on
that target (its graphs captured once) and serves every setting. One untimed serving run per (pair, drafter)
comes first (up to ``--max-running`` requests at once, 8 tokens each), so JIT builds and first-use costs are out
of the timed runs.

Settings: ``--closed C,...`` (C requests in the system, the next one released when one finishes) and
``--poisson RATE,...`` (seeded arrival times, the same for every row). Requests per setting (default):
closed C: C warmup requests + max(5, 2 C) measured; Poisson rate r: 8 warmup + max(40, r) measured; then
served over the prompts in order, reused from the first when a setting asks for more than there are (a cap
would leave a closed loop's measured requests to run while it drains: on the H200, 200 prompts for c = 100 gave
a target-only TPOT p50 below c = 32's); ``--no-prompt-reuse`` caps instead (the output says which settings were
cut or reused). ``--requests-per-setting N`` and
``--warmup-requests W`` fix them for every setting. Warmup requests run but are left out of every statistic,
as in the main job (attnlab.measure_serving).

Each row: requests/s, output tok/s, TTFT / TPOT / ITL p50 and p99, peak KV pages (target / draft), preemptions,
tau, the speedup over the same verify backend's target-only row at the same setting (output tok/s ratio: under
Poisson arrivals below capacity both serve the offered load, so read the TPOT p50 ratio there, "TPOT gain") and
the share of requests whose output equals that row's (greedy fp32: all), every figure from
attnlab.metrics.serving.serving_summary of the engine's output. ``--out PREFIX`` writes PREFIX.json (args,
settings, rows with every summary key, skipped and failed cells), PREFIX.md and PREFIX_latency.png (TPOT p50 vs
tok/s, one line per drafter and pair; matplotlib). A backend that cannot run here (or not at ``--dtype``) is
skipped with its reason; a cell that raises is a failed cell (its traceback on stderr); the rest runs. Runs on
CPU too (``--device cpu --backends torch``; the tests use ``--model tiny-llama``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback

import torch

from attnlab.bench.cells import parse_spec, skip_unsupported
from attnlab.bench.serving_work import asked, cycled, make_row, serving_prompts, settings, table, write_plot
from attnlab.bench.spec import NGRAM_N, _sync, resolve_weights
from attnlab.engine.build import SideSpec, build_side
from attnlab.engine.scheduler import KV_POLICIES
from attnlab.plan import ModelSource

DRAFTERS = ("eagle", "ngram", "none")
PAGE_SIZE = 16
WARM_TOKENS = 8  # output tokens per request of the untimed warm run


def serve_settings(dec, a, prompts, budgets, sets, eos, max_ctx, progress):
    """The untimed warm run, then one timed ServingEngine.run per setting -> [(setting, summary, outputs)]."""
    from attnlab.engine.arrivals import arrival_source
    from attnlab.engine.scheduler import Scheduler
    from attnlab.engine.serve import ServingEngine, WallClock
    from attnlab.metrics.serving import serving_summary

    allocators = [r.allocator for r in (dec.target, dec.drafter.runner) if r is not None]

    def engine():  # a fresh scheduler per run (its queues and preemption count), the same sides
        sched = Scheduler(allocators, max_running=a.max_running, k=dec.k, max_context=max_ctx, policy=a.kv_policy)
        return ServingEngine(dec, sched, frozenset(eos), WallClock())

    n = min(len(prompts), a.max_running)
    engine().run(prompts[:n], [min(b, WARM_TOKENS) for b in budgets[:n]], arrival_source("all_at_once", n))
    out = []
    for s in sets:
        _sync(dec.target.device)
        res = engine().run(cycled(prompts, s.requests), cycled(budgets, s.requests), s.source(a.seed))
        for i, r in enumerate(res.requests):
            r.measured = i >= s.warmup
        out.append((s, serving_summary(res, PAGE_SIZE, s.warmup), [r.output_ids for r in res.requests]))
        progress()
    return out


def serving_rows(base, a, prompts, budgets, sets, eos, skipped: list[str], failed: list[str]):
    """Every (verify backend, drafter, draft backend) cell over every setting -> (rows, outputs per row). A cell
    that cannot run here goes to ``skipped``, one that raised (its traceback on stderr) to ``failed``."""
    from tqdm.auto import tqdm

    from attnlab.config import check_backend
    from attnlab.engine.eagle_side import build_eagle_side
    from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
    from attnlab.spec.drafters import NgramDrafter, NoDrafter
    from attnlab.spec.eagle import EagleDrafter

    dev = base.device
    graphs = a.graphs and dev.type == "cuda"
    max_ctx = max(len(p) + b for p, b in zip(prompts, budgets)) + a.k + 2
    model = ModelSource(a.model, init="pretrained" if a.weights == "real" else "random")

    def spec_for(label, name):
        backend, options = parse_spec(label)  # "flashinfer/device_steps=false": the backend's options
        check_backend("verify" if name == "target" else "backend", backend, device=dev.type, dtype=a.dtype,
                      kv_dtype=a.dtype, page_size=PAGE_SIZE, max_context=max_ctx, topk=1,
                      head_dim=base.model_config.head_dim, options=options)  # unsupported: before any build
        return SideSpec(model, backend, a.dtype, a.dtype, page_size=PAGE_SIZE, max_context=max_ctx,
                        max_batch=a.max_running, device=str(dev), name=name, cuda_graph=graphs,
                        max_q_len=a.k + 1, fused_ops=a.fused_ops, backend_options=options)

    def make_drafter(kind, draft_backend, target):
        if kind == "ngram":
            return NgramDrafter(dev, max_n=NGRAM_N)
        # random weights: the head runs unchecked against them (its acceptance means nothing, its cost is real)
        return EagleDrafter(build_eagle_side(target, a.eagle_head, a.model, spec_for(draft_backend, "draft"),
                                             check=a.weights != "random"))

    cells = [(d, b) for d in a.drafters if d != "none" for b in (a.draft_backends if d == "eagle" else ["-"])]
    bar = tqdm(total=len(a.backends) * (len(cells) + ("none" in a.drafters)) * len(sets), desc="serving",
               unit="setting", disable=None)
    rows, outputs = [], []

    def run_cell(target, drafter, name, draft_backend, verify, refs):
        try:
            serve_cell(target, drafter, name, draft_backend, verify, refs)
        except Exception as e:  # noqa: BLE001 - a failing cell is an error cell (bench.kernels), not a crash
            traceback.print_exc()
            failed.append(f"{name} {draft_backend} / {verify}: {type(e).__name__}: {str(e).strip()[:300]}")
            for req in list(target.allocator.lengths):  # its requests' pages: the next cell starts on a free pool
                target.release(req)

    def serve_cell(target, drafter, name, draft_backend, verify, refs):
        dec = SpeculativeDecoder(target, drafter, SpecParams(a.k), seed=a.seed)
        for s, m, outs in serve_settings(dec, a, prompts, budgets, sets, eos, max_ctx, lambda: bar.update(1)):
            row = make_row(name, draft_backend, verify, s, m)
            if (ref := refs.get(s.label)) is not None:
                row["speedup"] = row["output_tokens_per_s"] / ref[0]["output_tokens_per_s"]
                # open loop (Poisson): both serve the offered load, so tok/s says little; per-token latency does
                row["tpot_gain"] = ref[0]["tpot_ms_p50"] / row["tpot_ms_p50"] if row["tpot_ms_p50"] else None
                row["same_as_target_only"] = sum(x == y for x, y in zip(outs, ref[1])) / len(outs)
            rows.append(row)
            outputs.append(outs)
            if name == "none":
                refs[s.label] = (row, outs)
            tqdm.write(f"{name} {row['pair']} {s.label}: {row['output_tokens_per_s']:.1f} tok/s, TPOT p50 "
                       f"{row['tpot_ms_p50']:.2f} ms" + (f", {row['speedup']:.2f}x" if row["speedup"] else ""),
                       file=sys.stderr)

    for verify in a.backends:
        target = skip_unsupported(f"verify={verify}", lambda v=verify: build_side(
            spec_for(v, "target"), share_weights_with=base, progress=False), skipped)
        if target is None:
            bar.update((len(cells) + ("none" in a.drafters)) * len(sets))
            continue
        if graphs:  # decode (target-only) and verify (k + 1) in every bucket up to --max-running, once
            target.capture_graphs(q_lens=sorted({1, a.k + 1}))
        refs: dict = {}
        if "none" in a.drafters:
            run_cell(target, NoDrafter(dev), "none", "-", verify, refs)
        for name, draft_backend in cells:
            label = f"{name} drafter on backend={draft_backend} (verify={verify})"
            drafter = skip_unsupported(label, lambda n=name, b=draft_backend, t=target: make_drafter(n, b, t),
                                       skipped)
            if drafter is None:
                bar.update(len(sets))
                continue
            if graphs:  # EAGLE: the target's passes with features, the head's draft-extend and k - 1 steps
                drafter.capture_graphs(target, a.k)
            run_cell(target, drafter, name, draft_backend, verify, refs)
            del drafter
            _free(dev)
        del target
        _free(dev)
    bar.close()
    return rows, outputs


def _free(dev: torch.device) -> None:
    """A side's pools and graphs go before the next one is built."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _list(ap, flag: str, text: str, kind) -> list:
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"{flag} {text!r}: comma-separated numbers")
    if any(v <= 0 for v in vals):
        ap.error(f"{flag} {text!r}: every value must be > 0")
    return vals


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--weights", choices=("auto", "real", "random"), default="auto")
    ap.add_argument("--backends", default=None, help="verify side, comma-separated (default: triton,flashinfer on "
                    "CUDA, torch on CPU); a backend's options as name/key=value")
    ap.add_argument("--draft-backends", default=None, help="draft side of the eagle rows (default: --backends)")
    ap.add_argument("--drafters", default="eagle,none", help="eagle, ngram, none (target-only: the speedup's "
                    "baseline), comma-separated")
    ap.add_argument("--eagle-head", default=None, help="draft=eagle head folder (default: the one attnlab ships)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per verify pass")
    ap.add_argument("--prompts", default="builtin", help="builtin | sharegpt (held-out split) | an exported file")
    ap.add_argument("--num-prompts", type=int, default=None,
                    help="prompts to load (default: what the largest setting asks for; ShareGPT: capped by the file)")
    ap.add_argument("--max-new", type=int, default=128, help="output tokens per request (the cap when recorded)")
    ap.add_argument("--output-len", choices=("recorded", "fixed"), default="recorded",
                    help="recorded: ShareGPT's answer length capped at --max-new (other sources: fixed)")
    ap.add_argument("--closed", default="1,8,32,100", help="closed-loop concurrencies, comma-separated (may be empty)")
    ap.add_argument("--poisson", default="8,32,128", help="Poisson rates in req/s, comma-separated (may be empty)")
    ap.add_argument("--warmup-requests", type=int, default=None, help="default: C (closed), 8 (Poisson)")
    ap.add_argument("--requests-per-setting", type=int, default=None,
                    help="default: warmup + max(5, 2 C) closed, warmup + max(40, rate) Poisson; capped by the prompts")
    ap.add_argument("--no-prompt-reuse", dest="reuse_prompts", action="store_false",
                    help="cap each setting's requests at the prompts available (default: reuse them in order, so a "
                         "closed loop is measured at its concurrency, not while it drains)")
    ap.add_argument("--max-running", type=int, default=None,
                    help="running requests at most, and the CUDA graph buckets' max (default: the largest --closed)")
    ap.add_argument("--kv-policy", choices=KV_POLICIES, default="reserve")
    ap.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="eager (CUDA graphs are on)")
    ap.add_argument("--fused-ops", action="store_true", help="layers through the fused Triton kernels (CUDA only)")
    ap.add_argument("--seed", type=int, default=0, help="Poisson arrival times, synthetic prompts")
    ap.add_argument("--out", default=None, help="write PREFIX.json, PREFIX.md and PREFIX_latency.png")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    a.backends = [b for b in (a.backends or ("triton,flashinfer" if cuda else "torch")).split(",") if b]
    a.draft_backends = [b for b in a.draft_backends.split(",") if b] if a.draft_backends else list(a.backends)
    a.drafters = [d for d in a.drafters.split(",") if d]
    a.dtype = a.dtype or ("bf16" if cuda else "fp32")
    if bad := sorted(set(a.drafters) - set(DRAFTERS)):
        ap.error(f"--drafters: unknown {bad} (choose from {', '.join(DRAFTERS)})")
    if not a.drafters or not a.backends or not a.draft_backends:
        ap.error("--drafters, --backends and --draft-backends need at least one name each")
    if a.fused_ops and not cuda:
        ap.error("--fused-ops needs --device cuda (the fused layer kernels are Triton kernels for the GPU)")
    a.closed, a.rates = _list(ap, "--closed", a.closed, int), _list(ap, "--poisson", a.poisson, float)
    if not a.closed and not a.rates:
        ap.error("--closed and --poisson are both empty: no setting to serve")
    for flag, v, low in (("--k", a.k, 1), ("--max-new", a.max_new, 1), ("--num-prompts", a.num_prompts, 1),
                         ("--max-running", a.max_running, 1), ("--warmup-requests", a.warmup_requests, 0),
                         ("--requests-per-setting", a.requests_per_setting, 1)):
        if v is not None and v < low:
            ap.error(f"{flag} {v}: must be >= {low}")
    if a.requests_per_setting is not None and a.warmup_requests is not None \
            and a.warmup_requests >= a.requests_per_setting:
        ap.error("--warmup-requests must be below --requests-per-setting (at least one request is measured)")
    a.max_running = a.max_running or max(a.closed, default=128)
    a.weights = resolve_weights(ap, a.model, a.weights)
    return a


def run(a) -> dict:
    from attnlab.bench.kernels import versions
    from attnlab.models.loading import load_tokenizer

    dev = torch.device(a.device)
    init = "pretrained" if a.weights == "real" else "random"
    # the weights every side shares (the torch backend runs everywhere; a.backends are checked per cell)
    base = build_side(SideSpec(ModelSource(a.model, init=init), "torch", a.dtype, a.dtype, page_size=PAGE_SIZE,
                               max_context=64, max_batch=1, device=a.device), progress=False)
    cfg = base.model_config
    tok = load_tokenizer(a.model, init=init, config=cfg) if a.weights == "real" else None
    wanted = [asked(kind, x, a.requests_per_setting, a.warmup_requests)[0]
              for kind, loads in (("closed", a.closed), ("poisson", a.rates)) for x in loads]
    prompts, budgets, what = serving_prompts(a, cfg.vocab_size, tok, a.num_prompts or max(wanted))
    sets = settings(a.closed, a.rates, len(prompts), a.requests_per_setting, a.warmup_requests, a.reuse_prompts)
    eos = set()
    if a.weights == "real":  # random weights: fixed lengths
        eos = set(cfg.eos_token_ids) | ({int(tok.eos_token_id)} if getattr(tok, "eos_token_id", None) is not None
                                       else set())
    skipped: list[str] = []
    failed: list[str] = []
    rows, outputs = serving_rows(base, a, prompts, budgets, sets, eos, skipped, failed)
    graphs = a.graphs and dev.type == "cuda"
    head = (f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}; {versions()}; {a.model} ({a.weights} "
            f"weights), {a.dtype}, k={a.k}, {len(prompts)} prompts: {what}; at most {a.max_running} running, "
            f"kv policy {a.kv_policy}, page size {PAGE_SIZE}, CUDA graphs "
            f"{f'on (buckets up to {a.max_running})' if graphs else 'off'}, fused layer ops "
            f"{'on' if a.fused_ops else 'off'}; one timed run per row (no repeats) after one untimed warm run per "
            f"pair and drafter")
    lines = [head, "", "Settings: " + "; ".join(f"{s.label}: {s.requests} requests, the first {s.warmup} warmup"
                                                for s in sets), ""] + table(rows)
    if any(s.arrival == "poisson" for s in sets):
        lines.append("\nPoisson rows: below capacity every pair serves the offered load, so their tok/s ratio is near 1 "
                     "by construction; the TPOT p50 gain is what speculation buys there.")
    if reused := [s for s in sets if s.requests > len(prompts)]:
        lines.append(f"\nPrompts reused ({len(prompts)} available; request i serves prompt i mod {len(prompts)}; no "
                     "prefix cache, so a repeat costs what its first serving did): " + "; ".join(
                         f"{s.label} {s.requests} requests" for s in reused))
    if cut := [s for s in sets if s.requests < s.asked]:
        lines.append("\nCut by the prompts available (" + str(len(prompts)) + "): " + "; ".join(
            f"{s.label} {s.requests} of {s.asked} requests" for s in cut))
    if a.weights == "random":
        lines.append("\nRandom weights: acceptance (and so tau and speedup) says nothing about real text.")
    for title, cells in (("Skipped (cannot run here)", skipped), ("Failed (the traceback is on stderr)", failed)):
        if cells:
            lines.append(f"\n{title}:\n" + "\n".join(f"- {c}" for c in cells))
    return {"header": head, "args": dict(vars(a)), "settings": [dict(s.__dict__, label=s.label) for s in sets],
            "rows": rows, "skipped": skipped, "failed": failed, "outputs": outputs, "markdown": "\n".join(lines)}


def main(argv=None) -> int:
    a = parse(argv)
    if a.out:  # before the run, not after it: a missing folder must not cost the measurements
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    res = run(a)
    if a.out:
        res["markdown"] += "\n" + write_plot(res["rows"], a.out + "_latency.png")
    print(res["markdown"])
    if a.out:
        with open(a.out + ".json", "w") as f:
            json.dump({k: v for k, v in res.items() if k not in ("outputs", "markdown")}, f, indent=1)
        with open(a.out + ".md", "w") as f:
            f.write(res["markdown"] + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
