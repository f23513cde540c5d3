"""Serving metrics (attnlab.metrics.serving) on hand-made requests, then over a real tiny serving run; and the
report's serving section (table, latency-vs-throughput and KV timeline plots) over two fake job folders."""

from __future__ import annotations

import json

import pytest

from attnlab.engine.arrivals import arrival_source
from attnlab.metrics.serving import (
    itl_ms,
    latency_percentiles,
    measured_window,
    meets_slo,
    serving_summary,
    timeline_stats,
)
from attnlab.spec.records import RequestOutput
from tests.engine.test_serve import PAGE, serve


def req(arrival, times, wait=0.0):
    return RequestOutput(prompt_ids=[1], output_ids=list(range(len(times))), ttft_ms=times[0], latency_ms=times[-1],
                         token_times_ms=list(times), arrival_s=arrival, queue_wait_ms=wait)


def test_itl_is_per_chunk_and_the_window_spans_measured_requests():
    r = req(1.0, [10.0, 20.0, 20.0, 20.0, 35.0])  # three tokens accepted in one verify pass arrive together
    assert itl_ms(r) == [10.0, 15.0]
    assert measured_window([r, req(0.5, [5.0, 100.0])]) == (0.5, pytest.approx(1.035))
    p = latency_percentiles([r])
    assert p["itl_ms_p50"] == pytest.approx(12.5) and p["ttft_ms_p99"] == 10.0 and p["queue_wait_ms_p50"] == 0.0
    assert meets_slo(r, 10.0, None) and not meets_slo(r, 9.0, None)
    assert not meets_slo(r, None, 6.0)  # TPOT = (35 - 10) / 4 = 6.25 ms


def test_timeline_peak_and_time_weighted_mean():
    tl = [{"t_s": 0.0, "pages_target": 4, "peak_pages_target": 6}, {"t_s": 1.0, "pages_target": 2,
                                                                      "peak_pages_target": 5}]
    m = timeline_stats(tl, 0.0, 3.0, ["target"])
    assert m["kv_pages_used_max"] == 6 and m["kv_pages_used_mean"] == pytest.approx((4 * 1 + 2 * 2) / 3)


def test_summary_of_a_real_run_leaves_the_warmup_requests_out():
    out = serve("ngram", arrival_source("poisson", 10, rate=30.0, seed=1))
    m = serving_summary(out, PAGE, warmup_requests=2, slo_ttft_ms=1e9)
    assert m["measured_requests"] == 8 and m["slo_attained_frac"] == 1.0
    assert m["serve_window_s"] > 0 and m["output_tokens_per_s"] > 0 and m["requests_per_s"] > 0
    assert m["kv_pages_used_max"] == max(s["peak_pages_target"] for s in out.timeline) > 0
    assert m["itl_ms_p50"] <= m["itl_ms_p99"] and m["ttft_ms_p50"] <= m["ttft_ms_p99"]
    assert m["max_running"] >= 2 and m["num_prefills"] >= 2


def test_report_draws_the_serving_section(tmp_path):
    from attnlab.report import report

    for i, rate in enumerate((2.0, 8.0)):
        job = tmp_path / str(i)
        job.mkdir()
        (job / "status.json").write_text(json.dumps({"status": "ok"}))
        (job / "metrics.json").write_text(json.dumps({
            "arrival": "poisson", "request_rate": rate, "output_tokens_per_s": 100.0 * (i + 1),
            "requests_per_s": rate, "itl_ms_p50": 5.0 + i, "itl_ms_p99": 9.0 + i, "ttft_ms_p99": 30.0 + i,
            "kv_pages_used_max": 40 + i, "preemptions": 0}))
        (job / "events.jsonl").write_text("\n".join(json.dumps({"event": "kv_timeline", "run": "spec", "repeat": 0,
                                                                 "t_s": t, "pages_target": 3 * t})
                                                     for t in range(4)) + "\n")
    report(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "## Serving" in text and "2 req/s" in text and "| 41 |" in text
    assert (tmp_path / "latency_throughput.png").stat().st_size > 0 and (tmp_path / "kv_timeline.png").is_file()


def test_step_clock_latencies_are_never_negative(monkeypatch):
    """StepClock steps 10 ms of its own time per engine step; on a machine where a step takes less wall time, a
    request's latency must still count from its release (wall clock), never from a future wall time."""
    import time as _time

    from attnlab.engine.serve import StepClock

    c = StepClock(0.01)
    c.start()
    for _ in range(50):  # 0.5 s of step time, almost no wall time
        c.tick()
    t0 = c.perf(c.now())
    assert t0 <= _time.perf_counter()
    out = serve("ngram", arrival_source("poisson", 10, rate=30.0, seed=1))
    assert all(r.latency_ms >= r.ttft_ms >= 0 for r in out.requests)
