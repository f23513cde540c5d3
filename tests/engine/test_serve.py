"""The serving engine over the speculative loop (tiny fp32 models on CPU): outputs do not depend on arrival
order or batch composition (the lossless test under continuous batching), preemption restores state,
back-pressure never oversubscribes, a closed loop holds its concurrency, finished requests free their pages."""

from __future__ import annotations

import pytest

from attnlab.engine.arrivals import ClosedLoop, OpenLoop, arrival_source, poisson_times
from attnlab.engine.scheduler import Scheduler
from attnlab.engine.serve import ServingEngine, StepClock, WallClock
from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter, NgramDrafter, NoDrafter
from attnlab.spec.eagle import EagleDrafter
from tests.spec.tiny import eagle_runner, perturbed, prompts, runner, tiny_config, tiny_eagle, tiny_model

CFG = tiny_config(layers=3)
TARGET = tiny_model(CFG, seed=0)
OTHER = perturbed(TARGET, seed=1, noise=0.2)
PS = prompts(10, CFG.vocab_size, seed=5)
BUDGETS = [12, 3, 20, 7, 16, 1, 9, 14, 5, 18]
K, PAGE, CTX = 3, 4, 64


def pair(kind, num_pages=None):
    tgt = runner(TARGET, CFG, PAGE, max_context=CTX, num_pages=num_pages)
    if kind == "none":
        d = NoDrafter("cpu")
    elif kind == "ngram":
        d = NgramDrafter("cpu")
    elif kind == "model":
        d = ModelDrafter(runner(OTHER, CFG, PAGE, max_context=CTX, num_pages=num_pages, name="draft"), "model")
    else:
        d = EagleDrafter(eagle_runner(tiny_eagle(TARGET, CFG, seed=2), PAGE, max_context=CTX))
    return tgt, d


def serve(kind, arrivals, *, max_running=4, policy="reserve", num_pages=None, clock=None):
    tgt, d = pair(kind, num_pages)
    dec = SpeculativeDecoder(tgt, d, SpecParams(0 if kind == "none" else K))
    allocs = [r.allocator for r in (tgt, d.runner) if r is not None]
    sched = Scheduler(allocs, max_running=max_running, k=dec.k, max_context=CTX, policy=policy)
    out = ServingEngine(dec, sched, frozenset(), clock or StepClock(0.01)).run(PS, BUDGETS, arrivals)
    assert all(a.num_free == a.num_pages and not a.page_tables for a in allocs)  # every page came back
    return out


def static(kind):
    tgt, d = pair(kind)
    return SpeculativeDecoder(tgt, d, SpecParams(0 if kind == "none" else K)).generate(PS, BUDGETS)


def ids(out):
    return [r.output_ids for r in out.requests]


@pytest.mark.parametrize("kind", ["none", "ngram", "model", "eagle"])
def test_poisson_outputs_equal_all_at_once_and_static(kind):
    """Greedy fp32: the same tokens whatever joined which batch when (requests arrive ~ every 3 steps)."""
    ref = ids(static(kind))
    at_once = serve(kind, arrival_source("all_at_once", len(PS)))
    poisson = serve(kind, arrival_source("poisson", len(PS), rate=30.0, seed=1))
    assert ids(at_once) == ids(poisson) == ref
    assert [len(x) for x in ref] == BUDGETS
    # the Poisson run did continuous batching: prefills joined a running batch, the batch size changed
    joins = [s for a, s in zip(poisson.timeline, poisson.timeline[1:]) if s["step"] == "prefill" and a["running"]]
    assert joins and len({s["running"] for s in poisson.timeline}) > 2
    assert max(s["running"] for s in at_once.timeline) == 4  # max_running: later requests wait their turn
    assert all(r.arrival_s is not None and r.queue_wait_ms is not None for r in poisson.requests)


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_preemption_restores_state(kind):
    """The smallest pool the preflight allows (one request at max context: 64 / 4 = 16 pages), optimistic
    admission of four: requests get preempted (their KV freed on both sides) and recomputed later; the outputs
    stay exactly the static ones. (At 18 pages the model drafter's acceptance lets all fit: no preemption.)"""
    out = serve(kind, arrival_source("all_at_once", len(PS)), policy="preempt", num_pages=16)
    assert out.preemptions > 0 and any(r.preemptions for r in out.requests)
    assert ids(out) == ids(static(kind))
    assert max(s["peak_pages_target"] for s in out.timeline) <= 16


def test_back_pressure_never_oversubscribes():
    """reserve: with the same tight pool nothing is preempted; arrivals wait while pages are short."""
    out = serve("model", arrival_source("all_at_once", len(PS)), policy="reserve", num_pages=18)
    assert out.preemptions == 0 and ids(out) == ids(static("model"))
    assert max(s["running"] for s in out.timeline) < 4  # pages, not max_running, held them back
    assert all(s["peak_pages_target"] <= 18 and s["peak_pages_draft"] <= 18 for s in out.timeline)


def test_closed_loop_keeps_its_concurrency():
    out = serve("ngram", ClosedLoop(len(PS), 3), max_running=8)
    assert all(s["running"] + s["waiting"] <= 3 for s in out.timeline)
    assert max(s["running"] for s in out.timeline) == 3 and ids(out) == ids(static("ngram"))
    # each request after the first three arrived when an earlier one finished
    finish_steps = {s["t_s"] for s in out.timeline if s["finished"]}  # the engine clock after steps that finished
    assert all(r.arrival_s == 0 for r in out.requests[:3])
    assert all(r.arrival_s in finish_steps for r in out.requests[3:])


def test_wall_clock_run_times_requests_from_their_arrival():
    """The real clock: a request's TTFT counts from its scheduled arrival, its token times are ordered."""
    out = serve("ngram", OpenLoop(poisson_times(len(PS), 200.0, 3)), clock=WallClock())
    assert ids(out) == ids(static("ngram"))
    for r in out.requests:
        assert 0 < r.ttft_ms <= r.latency_ms and r.ttft_ms == r.token_times_ms[0] >= r.queue_wait_ms >= 0
        assert r.token_times_ms == sorted(r.token_times_ms)
    assert out.wall_s >= max(r.arrival_s for r in out.requests)


def test_arrival_sources():
    t = poisson_times(2000, 50.0, seed=7)
    assert t[0] == 0 and t == sorted(t) and t == poisson_times(2000, 50.0, seed=7)
    assert 2000 / t[-1] == pytest.approx(50.0, rel=0.1)  # the rate asked for
    loop = ClosedLoop(5, 2)
    assert loop.due(0.0) == [(0, 0.0), (1, 0.0)] and loop.next_time() is None
    loop.on_finish(1.5)
    assert loop.next_time() == 1.5 and loop.due(2.0) == [(2, 1.5)]
    for _ in range(5):
        loop.on_finish(3.0)
    assert [i for i, _ in loop.due(9.0)] == [3, 4] and loop.due(9.0) == []  # never more than n requests
    with pytest.raises(ValueError, match="non-decreasing"):
        OpenLoop([1.0, 0.5])
