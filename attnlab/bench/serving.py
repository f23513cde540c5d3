"""Serving side by side in one process: the continuous-batching engine (attnlab.engine.serve) per backend pair
and drafter under closed-loop concurrencies and Poisson rates, each side built once for every setting.

    python -m attnlab.bench.serving [--device cuda] [--backends triton,flashinfer] [--draft-backends ...]
                                    [--drafters eagle,none] [--k 4] [--prompts builtin|sharegpt|FILE.jsonl.gz]
                                    [--output-len recorded|fixed] [--max-new 128] [--closed 1,8,32,100]
                                    [--poisson 8,32,128] [--max-running N] [--repeats N] [--out PREFIX]

Why one process: a Hydra job per (pair, drafter, load) rebuilds the model, captures CUDA graphs and warms up
every time (30-40 s per job on an H200 for a 5 s measurement). Here each verify backend's target side is built
once (max batch = ``--max-running``; CUDA graphs for q_len 1 and k + 1 in the buckets up to it, captured once)
and serves the target-only rows (``none``) of every setting; each drafter x draft backend is then built once on
that target (its graphs captured once) and serves every setting. One untimed serving run per (pair, drafter)
comes first (up to ``--max-running`` requests at once, 8 tokens each), so JIT builds and first-use costs are out
of the timed runs. The cells of one verify backend are all built before any timed run; each setting's
``--repeats`` runs then go round-robin over them (target-only first), so whatever the device's speed at the time,
every cell of a round shares it (rows: medians, tok/s min-max, speedups as medians of per-round ratios).

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
import math
import os
import sys
import traceback

import torch

from attnlab.bench.cells import parse_spec, skip_unsupported
from attnlab.bench.serving_work import (
    asked,
    cycled,
    make_row,
    serving_prompts,
    settings,
    table,
    write_plot,
)
from attnlab.bench.spec import NGRAM_N, _sync, resolve_weights
from attnlab.engine.build import SideSpec, build_side
from attnlab.engine.scheduler import KV_POLICIES
from attnlab.metrics.perf import percentile
from attnlab.metrics.repeats import median_of_runs
from attnlab.plan import ModelSource

DRAFTERS = ("eagle", "ngram", "none")
PAGE_SIZE = 16
WARM_TOKENS = 8  # output tokens per request of the untimed warm run


class _Server:
    """One (drafter, draft backend) cell on a verify backend's target: its decoder, a fresh scheduler per run."""

    def __init__(self, dec, a, max_ctx, eos, name, draft_backend, verify):
        self.dec, self.a, self.max_ctx, self.eos = dec, a, max_ctx, frozenset(eos)
        self.name, self.draft_backend, self.verify = name, draft_backend, verify
        self.runs: dict[str, list] = {}  # setting label -> [(summary, outputs)] per repeat

    def engine(self):
        from attnlab.engine.scheduler import Scheduler
        from attnlab.engine.serve import ServingEngine, WallClock

        allocators = [r.allocator for r in (self.dec.target, self.dec.drafter.runner) if r is not None]
        sched = Scheduler(allocators, max_running=self.a.max_running, k=self.dec.k, max_context=self.max_ctx,
                          policy=self.a.kv_policy)
        return ServingEngine(self.dec, sched, self.eos, WallClock())

    def warm(self, prompts, budgets) -> None:
        """The untimed run: up to --max-running requests at once, a few tokens each (JIT, first-use costs)."""
        from attnlab.engine.arrivals import arrival_source

        n = min(len(prompts), self.a.max_running)
        self.engine().run(prompts[:n], [min(b, WARM_TOKENS) for b in budgets[:n]], arrival_source("all_at_once", n))

    def serve(self, s, prompts, budgets) -> None:
        """One timed run of setting ``s``."""
        from attnlab.metrics.serving import serving_summary

        _sync(self.dec.target.device)
        res = self.engine().run(cycled(prompts, s.requests), cycled(budgets, s.requests), s.source(self.a.seed))
        for i, r in enumerate(res.requests):
            r.measured = i >= s.warmup
        self.runs.setdefault(s.label, []).append((serving_summary(res, PAGE_SIZE, s.warmup),
                                                  [r.output_ids for r in res.requests]))


def _ratios(pairs: list[tuple[float, float]]) -> list[float]:
    """num / den for each pair where both are finite and den > 0 (a TPOT is NaN when no request decoded two
    tokens; a tok/s of 0 has no ratio)."""
    return [x / y for x, y in pairs if math.isfinite(x) and math.isfinite(y) and y > 0]


def setting_row(cell: _Server, s, ref: _Server | None) -> tuple[dict, list]:
    """The row of ``cell`` at setting ``s`` from its repeats: every summary key the median over them
    (metrics.repeats.median_of_runs; preemptions the most any run had), each repeat's tok/s and TPOT p50 kept;
    against the target-only cell ``ref``, the speedup and TPOT gain as medians of per-round ratios (repeat i of
    both ran in the same round)."""
    runs = cell.runs[s.label]
    ms = [m for m, _ in runs]
    row = make_row(cell.name, cell.draft_backend, cell.verify, s, median_of_runs(ms))
    row["preemptions"] = max(m["preemptions"] for m in ms)
    row["repeats"] = [{"output_tokens_per_s": m["output_tokens_per_s"], "tpot_ms_p50": m["tpot_ms_p50"]} for m in ms]
    outs = runs[0][1]
    if ref is not None and s.label in ref.runs:
        base = ref.runs[s.label]
        pairs = list(zip([m for m, _ in base], ms))
        speedups = _ratios([(m["output_tokens_per_s"], b["output_tokens_per_s"]) for b, m in pairs])
        row["speedup"] = percentile(speedups, 50) if speedups else None
        # open loop (Poisson): both serve the offered load, so tok/s says little; per-token latency does
        gains = _ratios([(b["tpot_ms_p50"], m["tpot_ms_p50"]) for b, m in pairs])
        row["tpot_gain"] = percentile(gains, 50) if gains else None
        row["same_as_target_only"] = sum(x == y for x, y in zip(outs, base[0][1])) / len(outs)
    return row, outs


def serving_rows(base, a, prompts, budgets, sets, eos, skipped: list[str], failed: list[str]):
    """Every (verify backend, drafter, draft backend) cell over every setting -> (rows, outputs per row). The
    cells of one verify backend are built together on its target and each setting's ``--repeats`` timed runs go
    round-robin over them (target-only first), so the speed of the device at the time lands on every cell of a
    round alike. A cell that cannot run here goes to ``skipped``, one that raised (its traceback on stderr) to
    ``failed`` and out of the later settings."""
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

    specs = [(d, b) for d in a.drafters if d != "none" for b in (a.draft_backends if d == "eagle" else ["-"])]
    per_verify = (len(specs) + ("none" in a.drafters)) * len(sets) * a.repeats
    bar = tqdm(total=len(a.backends) * per_verify, desc="serving", unit="run", disable=None)
    rows, outputs = [], []

    def guarded(cell, target, what, fn) -> bool:
        """fn() for ``cell``; an exception makes it a failed cell (False) and frees its requests' pages."""
        try:
            fn()
            return True
        except Exception as e:  # noqa: BLE001 - a failing cell is an error cell (bench.kernels), not a crash
            traceback.print_exc()
            failed.append(f"{cell.name} {cell.draft_backend} / {cell.verify} ({what}): {type(e).__name__}: "
                          f"{str(e).strip()[:300]}")
            for r in (target, cell.dec.drafter.runner):
                for req in list(r.allocator.lengths) if r is not None else []:
                    r.release(req)
            return False

    for verify in a.backends:
        target = skip_unsupported(f"verify={verify}", lambda v=verify: build_side(
            spec_for(v, "target"), share_weights_with=base, progress=False), skipped)
        if target is None:
            bar.update(per_verify)
            continue
        if graphs:  # decode (target-only) and verify (k + 1) in every bucket up to --max-running, once
            target.capture_graphs(q_lens=sorted({1, a.k + 1}))
        cells = []
        if "none" in a.drafters:
            cells.append(_Server(SpeculativeDecoder(target, NoDrafter(dev), SpecParams(a.k), seed=a.seed), a,
                                 max_ctx, eos, "none", "-", verify))
        for name, draft_backend in specs:
            label = f"{name} drafter on backend={draft_backend} (verify={verify})"
            drafter = skip_unsupported(label, lambda n=name, b=draft_backend, t=target: make_drafter(n, b, t),
                                       skipped)
            if drafter is None:
                bar.update(len(sets) * a.repeats)
                continue
            if graphs:  # EAGLE: the target's passes with features, the head's draft-extend and k - 1 steps
                drafter.capture_graphs(target, a.k)
            cells.append(_Server(SpeculativeDecoder(target, drafter, SpecParams(a.k), seed=a.seed), a, max_ctx, eos,
                                 name, draft_backend, verify))
        alive = [c for c in cells if guarded(c, target, "warm run", lambda c=c: c.warm(prompts, budgets))]
        bar.update((len(cells) - len(alive)) * len(sets) * a.repeats)
        ref = cells[0] if cells and cells[0].name == "none" else None
        for s in sets:
            for _ in range(a.repeats):
                for c in list(alive):
                    if not guarded(c, target, s.label, lambda c=c, s=s: c.serve(s, prompts, budgets)):
                        alive.remove(c)
                        bar.update(len(sets) * a.repeats - sum(map(len, c.runs.values())) - 1)
                    bar.update(1)
        for c in cells:  # cell-major, as the table reads: every setting of a pair together
            for s in sets:
                if len(c.runs.get(s.label, [])) == a.repeats:
                    against = ref if ref is not None and c is not ref and len(ref.runs.get(s.label, [])) == a.repeats \
                        else None
                    row, outs = setting_row(c, s, against)
                    rows.append(row)
                    outputs.append(outs)
                    tqdm.write(f"{c.name} {row['pair']} {s.label}: {row['output_tokens_per_s']:.1f} tok/s, TPOT p50 "
                               f"{row['tpot_ms_p50']:.2f} ms" + (f", {row['speedup']:.2f}x" if row["speedup"] else ""),
                               file=sys.stderr)
        del cells, alive, ref, target
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
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.serving",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per row and setting, in rounds over the "
                    "cells of a verify backend (median and min-max; speedups per round)")
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
                         ("--repeats", a.repeats, 1),
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
            f"{'on' if a.fused_ops else 'off'}; "
            + (f"{a.repeats} timed runs per row, in rounds over each verify backend's cells (medians; tok/s "
               f"min-max; speedups per round)" if a.repeats > 1 else "one timed run per row (no repeats)")
            + ", after one untimed warm run per pair and drafter")
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
