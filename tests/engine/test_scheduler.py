"""Scheduler invariants (pure bookkeeping over real page allocators, no model): 1,000 random arrivals and
finishes leave no page behind, admission never oversubscribes a pool (every allocation the decisions imply
succeeds), preempted requests resume with their state, the queue is first come first served."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from attnlab.engine.scheduler import Scheduler
from attnlab.kvcache import PageAllocator, pages_needed


@dataclass
class Req:
    id: int
    num_tokens: int  # committed sequence
    remaining: int  # outputs still allowed
    emitted: int = 0
    preempted: int = 0


def simulate(policy, *, n=1000, k=3, page_size=4, max_context=96, pages=(60, 45), max_running=8, seed=0):
    """Drive the scheduler the way attnlab.engine.serve does, with random arrivals, prompt lengths, budgets
    and acceptance; every allocation the step implies must succeed."""
    rng = random.Random(seed)
    allocs = [PageAllocator(p, page_size) for p in pages]  # target and draft pools of different sizes
    s = Scheduler(allocs, max_running=max_running, k=k, max_context=max_context, policy=policy)
    budgets, done, arrived, steps = {}, [], 0, 0
    while len(done) < n:
        for _ in range(min(rng.choice([0, 0, 1, 2, 5]), n - arrived)):  # bursts of arrivals
            prompt = rng.randint(1, 40)
            r = Req(arrived, prompt, rng.randint(1, max_context - prompt - k - 1))
            budgets[r.id] = (prompt, r.remaining)
            s.add(r)
            arrived += 1
        if not s:
            continue
        before = [(a.num_free, dict(a.lengths), {r: list(t) for r, t in a.page_tables.items()}) for a in allocs]
        d = s.schedule()
        steps += 1
        # deciding only asks: no allocator changed (the engine allocates after, for what was decided)
        assert before == [(a.num_free, dict(a.lengths), {r: list(t) for r, t in a.page_tables.items()}) for a in allocs]
        for r in d.preempt:  # the engine frees their KV on every side; their sequence stays
            for a in allocs:
                a.free(r.id)
            r.preempted += 1
        finished = []
        if d.admit:  # prefill: every side holds the sequence, then the first token is committed
            for r in d.admit:
                for a in allocs:
                    a.allocate(r.id, r.num_tokens)  # raises OutOfPages if the decision oversubscribed
                r.num_tokens, r.remaining, r.emitted = r.num_tokens + 1, r.remaining - 1, r.emitted + 1
                if not r.remaining or r.num_tokens >= max_context:
                    finished.append(r)
        else:  # one iteration over the running set: grow to n + k on every side, accept a, roll back
            kk = min([k] + [max_context - r.num_tokens for r in s.running])
            for r in s.running:
                for a in allocs:
                    a.allocate(r.id, r.num_tokens + kk)
            for r in s.running:
                acc = min(rng.randint(0, kk), r.remaining - 1, max_context - r.num_tokens - 1)
                for a in allocs:
                    a.truncate(r.id, r.num_tokens + acc)
                r.num_tokens, r.remaining, r.emitted = r.num_tokens + acc + 1, r.remaining - acc - 1, r.emitted + acc + 1
                if not r.remaining or r.num_tokens >= max_context:
                    finished.append(r)
        for r in finished:
            for a in allocs:
                a.free(r.id)
        s.finished(finished)
        done += finished
        assert len(s.running) <= max_running
        assert all(a.num_used <= a.num_pages for a in allocs)
        if policy == "reserve":  # what the running set reserved still fits: it never has to preempt
            for a in allocs:
                need = sum(a.extra_pages(r.id, s.budget_tokens(r)) for r in s.running)
                assert need <= a.num_free
    return s, allocs, done, budgets, steps


@pytest.mark.parametrize("policy", ["reserve", "preempt"])
def test_a_thousand_random_requests_leave_no_page_behind(policy):
    s, allocs, done, budgets, _ = simulate(policy)
    assert len(done) == len({r.id for r in done}) == 1000 and not s
    assert all(a.num_free == a.num_pages and not a.page_tables for a in allocs)  # no leak, on either side
    # every request ran to its budget: a preempted one resumed where it was (its emitted count carries on)
    assert all(r.emitted == budgets[r.id][1] for r in done)
    if policy == "reserve":
        assert s.num_preempted == 0
    else:
        assert s.num_preempted > 0 and any(r.preempted for r in done)  # the pools were tight enough to preempt


def test_preempt_admits_more_than_reserve():
    """Optimistic admission holds more requests at once than reserving whole budgets (why it exists)."""
    runs = {p: simulate(p, n=300, seed=3) for p in ("reserve", "preempt")}
    assert runs["preempt"][4] < runs["reserve"][4]  # fewer engine steps for the same requests


def test_head_of_queue_waits_and_nothing_overtakes_it():
    a = PageAllocator(10, 4)
    s = Scheduler([a], max_running=4, k=2, max_context=40, policy="reserve")
    big, small = Req(0, 20, 18), Req(1, 2, 2)  # big reserves 20 + 18 - 1 + 2 = 39 tokens = 10 pages
    s.add(big)
    assert s.schedule().admit == [big]
    a.allocate(big.id, 20)
    s.add(Req(2, 4, 4))
    s.add(small)
    assert s.schedule().admit == []  # back-pressure: the whole pool is reserved by the running request
    s.finished([big])
    a.free(big.id)
    assert [r.id for r in s.schedule().admit] == [2, 1]  # in arrival order


def test_preempt_takes_the_newest_and_requeues_it_first():
    a = PageAllocator(5, 4)
    s = Scheduler([a], max_running=4, k=3, max_context=20, policy="preempt")
    r0, r1, r2 = Req(0, 4, 10), Req(1, 4, 10), Req(2, 4, 10)
    for r in (r0, r1, r2):
        s.add(r)
    assert s.schedule().admit == [r0, r1]  # each needs 4 + 1 + 3 = 8 tokens = 2 pages; a third does not fit
    a.allocate(r0.id, 12)
    a.allocate(r1.id, 8)
    r0.num_tokens, r1.num_tokens = 12, 8  # next iteration: 15 and 11 tokens, one more page each; none is free
    d = s.schedule()
    assert d.preempt == [r1] and d.admit == []  # the newest goes, nothing is admitted in that step
    assert list(s.waiting) == [r1, r2] and s.running == [r0]  # first in line again, before r2


def test_bad_policy_and_sizes_are_refused():
    with pytest.raises(ValueError, match="kv policy"):
        Scheduler([], max_running=1, k=1, max_context=8, policy="lru")
    with pytest.raises(ValueError, match="max_running"):
        Scheduler([], max_running=0, k=1, max_context=8)


def test_budget_and_next_tokens():
    s = Scheduler([], max_running=1, k=4, max_context=50)
    r = Req(0, 10, 8)
    assert s.next_tokens(r) == 14 and s.budget_tokens(r) == 10 + 8 - 1 + 4
    assert s.budget_tokens(Req(1, 40, 30)) == 50  # capped at max context
    assert pages_needed(s.budget_tokens(r), 4) == 6
