"""Serving metrics: pure functions over a serving run's requests and KV timeline (attnlab.engine.serve).

Per request (times from its arrival): TTFT = arrival -> first token committed (queue wait, the target's and
the drafter's prefill included); TPOT = (latency - TTFT) / (output tokens - 1); ITL = the gaps between the
moments it received tokens (one per iteration it took part in: a verify pass that accepts several drafts
delivers them at once, as a streamed chunk, so ITL is per chunk, as SGLang's bench_serving measures it);
latency = arrival -> last token; queue wait = arrival -> first admission.

Aggregates are over the measured requests (all but the first workload.warmup_requests), in the measured
window: from the first measured arrival to the last measured finish. Throughput counts every output token
committed inside the window (any request's: that is the engine's rate over it); goodput counts the measured
requests that met the SLOs (DistServe's definition), per second of the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

from attnlab.metrics.perf import percentile, summarize, tpot_ms

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "latency_ms", "queue_wait_ms")


def itl_ms(req) -> list[float]:
    """Gaps between the distinct commit times of a request's tokens (one per chunk it received)."""
    times = []
    for t in req.token_times_ms:
        if not times or t != times[-1]:
            times.append(t)
    return [b - a for a, b in pairwise(times)]


def finish_s(req) -> float:
    return req.arrival_s + req.latency_ms / 1e3


def measured_window(reqs) -> tuple[float, float]:
    """(start, end) in seconds on the run's clock: first measured arrival, last measured finish."""
    return min(r.arrival_s for r in reqs), max(finish_s(r) for r in reqs)


def meets_slo(req, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    tpot = tpot_ms(req)
    return ((slo_ttft_ms is None or req.ttft_ms <= slo_ttft_ms)
            and (slo_tpot_ms is None or tpot is None or tpot <= slo_tpot_ms))


def latency_percentiles(reqs) -> dict[str, float]:
    """{ttft,tpot,itl,latency,queue_wait}_ms_p{50,90,99} over ``reqs`` (ITL: over all their gaps)."""
    series = {
        "ttft_ms": [r.ttft_ms for r in reqs],
        "tpot_ms": [t for t in map(tpot_ms, reqs) if t is not None],
        "itl_ms": [g for r in reqs for g in itl_ms(r)],
        "latency_ms": [r.latency_ms for r in reqs],
        "queue_wait_ms": [r.queue_wait_ms for r in reqs if r.queue_wait_ms is not None],
    }
    return {f"{key}_p{q}": percentile(vals, q) for key, vals in series.items() for q in (50, 90, 99)}


def timeline_stats(timeline: Sequence[dict], start: float, end: float, sides: Sequence[str]) -> dict:
    """KV pages in use: the peak within any step, and the time-weighted mean over the window (each sample
    holds until the next one)."""
    m: dict = {}
    for side in sides:
        suffix = "" if side == "target" else f"_{side}"
        m[f"kv_pages_used_max{suffix}"] = max((s[f"peak_pages_{side}"] for s in timeline), default=0)
        area, prev_t, prev_v = 0.0, start, None
        for s in timeline:
            t = min(max(s["t_s"], start), end)
            if prev_v is not None:
                area += prev_v * (t - prev_t)
            prev_t, prev_v = t, s[f"pages_{side}"]
        if prev_v is not None:
            area += prev_v * (end - prev_t)
        m[f"kv_pages_used_mean{suffix}"] = area / (end - start) if end > start else math.nan
    return m


def serving_summary(out, page_size: int | None, warmup_requests: int = 0, slo_ttft_ms: float | None = None,
                    slo_tpot_ms: float | None = None) -> dict:
    """metrics.json keys of one serving run (ServeOutput): the loop's own (metrics.perf.summarize: tau,
    acceptance, phase times per iteration) with the serving ones over the measured window."""
    m = summarize(out, page_size)
    measured = [r for i, r in enumerate(out.requests) if i >= warmup_requests]
    start, end = measured_window(measured)
    window = end - start
    in_window = sum(start <= r.arrival_s + t / 1e3 <= end for r in out.requests for t in r.token_times_ms)
    good = [r for r in measured if meets_slo(r, slo_ttft_ms, slo_tpot_ms)]
    m.update(latency_percentiles(measured))
    m.update({
        "measured_requests": len(measured),
        "serve_window_s": window,
        "output_tokens_per_s": in_window / window if window > 0 else math.nan,
        "requests_per_s": len(measured) / window if window > 0 else math.nan,
        "goodput_requests_per_s": len(good) / window if window > 0 else math.nan,
        "slo_attained_frac": len(good) / len(measured),
        "preemptions": out.preemptions,
        "num_prefills": len(out.prefills),
        "max_running": max((s["running"] for s in out.timeline), default=0),
        "max_waiting": max((s["waiting"] for s in out.timeline), default=0),
    })
    m.update(timeline_stats(out.timeline, start, end, list(out.num_pages)))
    m.update({("kv_num_pages" if side == "target" else f"kv_num_pages_{side}"): n for side, n in out.num_pages.items()})
    return m
