"""Measurement of a serving run (workload.arrival = all_at_once | poisson | closed): the engine's timed runs.

The same rules as attnlab.measure, for an engine step loop instead of fixed batches:

- the warmup plan runs first, exactly as for batch runs (graph capture; untimed generations through the spec
  pair and the target-only path), then the KV page peaks and peak memory are reset;
- a timed run is one ``ServingEngine.run`` over the whole workload: from the first arrival to the last finish
  it does scheduling and decoding only (prompts are tokenized before, text is decoded after, no logits are
  recorded, no parity work is done; the KV timeline is a list append per step);
- the arrival schedule is fixed before the runs (seeded Poisson times, or all at t = 0) and the same for every
  run; a closed loop releases requests as the run's own requests finish, with the same concurrency;
- ``bench.repeats`` times: the spec run, then the target-only run on the same target runner (same warmup,
  graphs, pools, schedule, scheduler); ``speedup_vs_target_only`` is the median of the per-repeat throughput
  ratios, and the target-only latency percentiles sit beside the spec ones;
- the first ``workload.warmup_requests`` requests run but are left out of every statistic
  (attnlab.metrics.serving: the measured window starts at the first measured arrival).
"""

from __future__ import annotations

import logging
import math

from attnlab import measure
from attnlab.measure import _JOBS_MEASURED, Measured, _load, _sync, cold_kind, describe, warmup
from attnlab.metrics.memory import peak_memory_bytes, reset_peak_memory
from attnlab.metrics.serving import LATENCIES
from attnlab.plan import RunPlan
from attnlab.prepare import Prepared
from attnlab.sides import Pair

log = logging.getLogger("attnlab")


def arrivals_for(plan: RunPlan, n: int):
    from attnlab.engine.arrivals import arrival_source

    w = plan.workload
    return arrival_source(w.arrival, n, rate=w.rate, concurrency=w.concurrency, seed=plan.seed)


def serve(pair: Pair, plan: RunPlan, work: Prepared, prompts, *, k: int | None = None, clock=None):
    """One serving run of ``prompts`` through the pair (the decoder, scheduler and engine are built before
    the run's clock starts). -> attnlab.engine.serve.ServeOutput, requests in workload order."""
    from attnlab.engine.scheduler import Scheduler
    from attnlab.engine.serve import ServingEngine, WallClock
    from attnlab.spec.decoder import SpecParams, SpeculativeDecoder

    s, w = plan.spec, plan.workload
    dec = SpeculativeDecoder(pair.target, pair.drafter,
                             SpecParams(plan.k if k is None else k, s.topk, s.temperature, s.top_k, s.top_p),
                             seed=plan.seed)
    allocators = [r.allocator for r in (pair.target, pair.drafter.runner) if r is not None]
    sched = Scheduler(allocators, max_running=w.batch_size, k=dec.k, max_context=work.max_context,
                      policy=plan.engine.kv_policy)
    engine = ServingEngine(dec, sched, work.eos_ids, clock or WallClock())
    budgets = [p.max_new_tokens or w.max_new_tokens for p in prompts]
    out = engine.run([p.token_ids for p in prompts], budgets, arrivals_for(plan, len(prompts)))
    for i, r in enumerate(out.requests):
        r.measured = i >= w.warmup_requests
    return out


def _timed(plan: RunPlan, work: Prepared, pair: Pair, prompts, k=None):
    """One timed serving run; returns (output, peak memory bytes over it)."""
    reset_peak_memory(plan.device)
    _sync(plan.device)
    return serve(pair, plan, work, prompts, k=k), peak_memory_bytes(plan.device)


def timeline_events(out, run: str, repeat: int) -> list[dict]:
    """events.jsonl rows of one run's KV timeline: one per engine step."""
    return [{"event": "kv_timeline", "run": run, "repeat": repeat, **s} for s in out.timeline]


def measure_serving(plan: RunPlan, work: Prepared, pair: Pair, cold: dict | None = None, on_batch=None) -> Measured:
    """Warmup, then bench.repeats x (timed spec serving run, timed target-only serving run)."""
    from attnlab.metrics.perf import memory_metrics
    from attnlab.metrics.repeats import median_of_runs, repeat_metrics
    from attnlab.metrics.serving import serving_summary

    w = plan.workload
    kind = cold_kind(cold)
    _JOBS_MEASURED[0] += 1
    m = warmup(plan, work, pair)
    prompts, res, peak, events = list(work.prompts), Measured([], []), 0, []
    graphs0 = measure.graph_counts(pair.target, pair.draft_runner)
    for i in range(plan.bench.repeats):
        out, mem = _timed(plan, work, pair, prompts)
        res.spec.append(out)
        peak = max(peak, mem)
        events += timeline_events(out, "spec", i)
        if i == 0 and on_batch is not None:
            on_batch(prompts, out)
        if plan.draft.kind != "none":
            base, _ = _timed(plan, work, pair.target_only(), prompts, k=0)
            res.base.append(base)
            events += timeline_events(base, "target_only", i)
    graphed = measure.graph_metrics(graphs0, measure.graph_counts(pair.target, pair.draft_runner))

    def summary(o):
        return serving_summary(o, work.page_size, w.warmup_requests, w.slo_ttft_ms, w.slo_tpot_ms)

    spec_runs, base_runs = [summary(o) for o in res.spec], [summary(o) for o in res.base]
    m.update(repeat_metrics(spec_runs, base_runs, plan.bench.noisy_ratio))
    if base_runs:  # the baseline's latencies beside the spec run's (medians over the repeats)
        med = median_of_runs(base_runs)
        m.update({f"target_only_{key}_p{q}": med[f"{key}_p{q}"] for key in LATENCIES for q in (50, 90, 99)})
        m["target_only_requests_per_s"] = med["requests_per_s"]
        m["target_only_goodput_requests_per_s"] = med["goodput_requests_per_s"]
    first = res.spec[0].requests[0].latency_ms
    warm = res.spec[1].requests[0].latency_ms if len(res.spec) > 1 else math.nan  # no re-run: one repeat, no warm
    cold_ms = cold["first_request_ms"] if cold is not None else first
    m.update(kind, first_request_ms_cold=cold_ms, first_request_ms_in_process=first, first_request_ms_warm=warm,
             first_request_gap_frac=cold_ms / warm - 1 if not math.isnan(warm) and warm > 0 else math.nan)
    if cold is not None:
        m.update({f"cold_{k}": v for k, v in cold.items() if k not in ("first_request_ms", "empty_caches")})
    m["peak_mem_bytes"] = peak
    m.update(memory_metrics({"target": pair.target, "draft": pair.draft_runner}))
    m.update(describe(plan, work))
    m.update(arrival=w.arrival, request_rate=w.rate, concurrency=w.concurrency, warmup_requests=w.warmup_requests,
             kv_policy=plan.engine.kv_policy, output_len=w.output_len,
             slo_ttft_ms=w.slo_ttft_ms, slo_tpot_ms=w.slo_tpot_ms)
    m.update(graphed)
    measure.warn_eager(graphed)
    if m.get("noisy"):
        log.warning("noisy timings: %s spread more than %.2fx over %d repeats; host load %s",
                    ", ".join(m["noisy_keys"]), plan.bench.noisy_ratio, plan.bench.repeats, _load())
    log.info("serving (%s): %.2f req/s, %.1f tok/s, TTFT p50 %.1f ms, TPOT p50 %.2f ms, ITL p99 %.2f ms, %d "
             "preemptions", w.arrival, m["requests_per_s"], m["output_tokens_per_s"], m["ttft_ms_p50"],
             m["tpot_ms_p50"], m["itl_ms_p99"], m["preemptions"])
    res.metrics = m
    res.events = events
    return res
