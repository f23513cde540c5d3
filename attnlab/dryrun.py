"""``python -m attnlab ... dry_run=true``: compose, validate against the backends' capabilities, print the
resolved plan (device, backends, dtypes, shapes, page size, KV pool sizes against free memory, CUDA-graph
buckets, parity passes) and exit 0, or print the first problem as one line and exit 2.

Everything a run checks before reading weights runs here too (prompts are loaded and tokenized, the model
config is read, ``auto`` values are resolved), so a dry-run that passes fails later only on the weights
themselves or at run time. Nothing is written: no run folder, no W&B run. With ``-m`` every job of the
sweep is planned.
"""

from __future__ import annotations

import logging
import sys


def _graphs(plan, work) -> str:
    from attnlab.engine.graphs import DEFAULT_BUCKETS

    if not plan.engine.cuda_graph:
        return "off (engine.cuda_graph=false, warmup plan without graphs)"
    bs = plan.workload.batch_size
    buckets = [b for b in DEFAULT_BUCKETS if b < bs] + [next((b for b in DEFAULT_BUCKETS if b >= bs), bs)]
    q_target = sorted({1, plan.k + 1})
    n = len(buckets) * len(q_target)
    line = f"batch buckets {buckets}; target q_len {q_target}"
    if plan.draft.kind in ("self", "model"):
        n += len(buckets) * (1 + max(1, plan.k))
        line += f"; draft q_len 2 (catch-up) + q_len 1 x {max(1, plan.k)} plan slots"
    elif plan.draft.kind == "eagle":  # the target again with features, draft-extend, k - 1 steps
        n += len(buckets) * (len(q_target) + 1 + max(0, plan.k - 1))
        line += (f"; target again with its features captured; head q_len {plan.k + 1} (draft-extend) + q_len 1 "
                 f"x {max(0, plan.k - 1)} plan slots")
    return f"{line}: {n} graphs"


def plan(cfg) -> tuple[list[tuple[str, str]], object]:
    """(rows of the printed plan, the Prepared work). Raises a user error (AttnlabError, Hydra's) on the first
    problem."""
    from attnlab.config import validate
    from attnlab.kvcache.budget import fmt_bytes, free_bytes
    from attnlab.prepare import prepare

    run = validate(cfg)
    work = prepare(run)
    m, d, prec, w = work.model_config, run.draft, run.precision, run.workload
    rows = [("device", run.device)]
    rows.append(("target", (f"{run.model.source} ({run.model.init}): {m.arch}, {m.num_layers} "
                            f"layers, {m.num_heads} heads / {m.num_kv_heads} KV heads, head_dim {m.head_dim}, vocab "
                            f"{m.vocab_size}, max positions {m.max_position_embeddings}")))
    rows.append(("verify", f"{run.verify}: weights {prec.target}, KV {prec.kv_target}"))
    if d.kind == "none":
        rows.append(("drafter", "none (target-only decoding)"))
    elif d.kind == "ngram":
        rows.append(("drafter", f"ngram (n <= {d.ngram_n}), k = {run.k}; no draft-side attention"))
    else:
        what = (f"self, layers {list(work.draft_layers) if work.draft_layers else 'all'}" if d.kind == "self"
                else f"eagle head {d.head or '(bundled for ' + str(run.model.name) + ')'}" if d.kind == "eagle"
                else f"model {d.model.source} ({d.model.init}): {work.draft_config.num_layers} layers")
        rows.append(("drafter", f"{what}, k = {run.k}, topk {run.spec.topk}"))
        rows.append(("backend", f"{run.backend}: weights {prec.draft}, KV {prec.kv_draft}"))
    rows.append(("sampling", "greedy" if run.spec.temperature == 0 else
                 f"temperature {run.spec.temperature}, top_k {run.spec.top_k}, top_p {run.spec.top_p}"))
    longest = max(len(p.token_ids) for p in work.prompts)
    rows.append(("workload", (f"{w.kind}: {len(work.prompts)} prompts (longest {longest} tokens), batch "
                              f"{w.batch_size}, max_new_tokens {w.max_new_tokens}")))
    page = f"page_size {work.page_size}"
    if "page_size_requested" in work.notes:
        page += f" (clamped from {work.notes['page_size_requested']})"
    kv_row = f"{run.kv.layout}, {page}, max context {work.max_context}, {work.pools[0].num_pages} pages per side"
    rows.append(("kv", kv_row))
    free = free_bytes(run.device)
    pools = ", ".join(f"{p.side} {fmt_bytes(p.bytes)} ({p.num_layers} layer{'s' * (p.num_layers != 1)}, "
                      f"{p.kv_dtype})" for p in work.pools)
    rows.append(("kv pools", f"{pools}; free on {run.device}: {fmt_bytes(free) if free is not None else 'unknown'}"))
    rows.append(("cuda graphs", _graphs(run, work)))
    e = run.engine
    fused = "on" if e.fused_ops else "on (target side: engine.invariant)" if e.invariant else "off"
    rows.append(("layers", f"fused ops {fused}, gemm {e.gemm}, pdl {'on' if e.pdl else 'off'}"))
    rows.append(("warmup", run.warmup.plan + (f" (lengths {list(work.warmup_lengths)})" if run.warmup.generates
                                              else "")))
    rows.append(("timing", f"{run.bench.repeats} timed repeat(s), cold start {run.bench.cold}"))
    par = run.parity
    levels = [name for name in ("kernel", "logits", "tokens", "acceptance") if getattr(par, name)]
    rows.append(("parity", f"{', '.join(levels)} vs {par.reference} at {par.reference_precision} precision"
                 if levels else "off"))
    if work.notes.get("past_model_context"):
        rows.append(("context", "past the model's max_position_embeddings (kv.allow_past_model_context=true)"))
    lg = run.logger
    rows.append(("logger", lg.kind + (f" ({lg.mode})" if lg.kind == "wandb" else "")))
    return rows, work


def main(overrides: list[str], multirun: bool = False) -> int:
    """Print the plan of each job; 0 if every job is valid, else 2 (one stderr line per invalid job)."""
    from attnlab.cli import EXIT_USAGE, is_user_error, one_line
    from attnlab.compose import compose, sweep_jobs

    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="[%(levelname)s] %(message)s")
    jobs = sweep_jobs(overrides) if multirun else [list(overrides)]
    common = set.intersection(*(set(j) for j in jobs)) if len(jobs) > 1 else set()
    bad = 0
    for i, job_overrides in enumerate(jobs):
        # what this job of the sweep changes, as typed (cli.add_free_form's ++ dropped)
        own = [o.removeprefix("++") for o in job_overrides if o not in common]
        label = f"job {i} ({' '.join(own) or 'defaults'})" if multirun else ""
        try:
            rows, _ = plan(compose(job_overrides))
        except Exception as e:
            if not is_user_error(e):
                raise
            bad += 1
            print(f"attnlab: error: {label + ': ' if label else ''}{one_line(e)}", file=sys.stderr)
            continue
        print(f"attnlab dry run{' - ' + label if label else ''}: valid (no weights read, nothing written)")
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"  {key:<{width}}  {value}")
    if multirun:
        print(f"attnlab dry run: {len(jobs)} jobs, {len(jobs) - bad} valid, {bad} invalid")
    return EXIT_USAGE if bad else 0
