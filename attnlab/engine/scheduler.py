"""Continuous-batching scheduler: waiting and running queues, admission by free KV pages on every side,
preemption with recompute (the shape of nano-vllm's Scheduler; vLLM's recompute preemption).

The scheduler decides and the engine (attnlab.engine.serve) acts: it prefills what was admitted, drops what
was preempted and reports what finished. Decisions only ask the allocators (``extra_pages``, ``pages_of``,
``num_free``), before anything is allocated, so a decision never oversubscribes a pool.

A request exposes ``id`` (its KV key on every side), ``num_tokens`` (its committed sequence: what a prefill
of it holds) and ``remaining`` (output tokens it may still emit, >= 1 while it runs). One speculative
iteration of a request with n committed tokens grows every side to at most n + k tokens (the verify pass
writes positions n - 1 .. n - 1 + k; a model drafter's and an EAGLE head's passes stay within them), capped
at max_context; a prefill of L tokens is followed by an iteration at n = L + 1.

Policies (``engine.kv_policy``):

- ``reserve``: a request is admitted only when every side can hold its whole budget (its sequence, every
  output token it may still emit, and k drafts: the most it can ever hold) on top of what the running
  requests have reserved. Running requests never run short; arrivals wait (back-pressure).
- ``preempt``: a request is admitted when every side can hold its prefill and one iteration, on top of the
  running requests' next iteration. When the running requests cannot all grow by one more iteration, the most
  recently admitted is preempted: its pages are freed on every side and it goes first in the queue, to be
  recomputed (prefill of prompt + output so far) once it fits again. No request is admitted in a step that
  preempted.

Admission is first come, first served: the head of the queue waits until it fits, nothing overtakes it. The
job checks (attnlab.preflight.serving_pages) that every pool holds one request at max context, so the head
always fits once the running requests are gone: no deadlock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from attnlab.kvcache.allocator import PageAllocator

KV_POLICIES = ("reserve", "preempt")


class Schedulable(Protocol):
    id: Hashable

    @property
    def num_tokens(self) -> int: ...

    @property
    def remaining(self) -> int: ...


@dataclass
class Decision:
    admit: list = field(default_factory=list)  # prefill these now (in this order)
    preempt: list = field(default_factory=list)  # drop these first (already back at the queue's head)


class Scheduler:
    def __init__(self, allocators: Sequence[PageAllocator], *, max_running: int, k: int, max_context: int,
                 policy: str = "reserve"):
        if policy not in KV_POLICIES:
            raise ValueError(f"kv policy {policy!r}: choose from {', '.join(KV_POLICIES)}")
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.allocators = list(allocators)
        self.max_running, self.k, self.max_context, self.policy = max_running, k, max_context, policy
        self.waiting: deque = deque()
        self.running: list = []  # in admission order: the last one is preempted first
        self.num_preempted = 0

    def add(self, req: Schedulable) -> None:
        """An arrival: it waits at the end of the queue."""
        self.waiting.append(req)

    def finished(self, reqs) -> None:
        """Requests that finished (their KV is already free): they leave the running set."""
        gone = {r.id for r in reqs}
        self.running = [r for r in self.running if r.id not in gone]

    def __bool__(self) -> bool:
        return bool(self.waiting or self.running)

    # -- token needs ---------------------------------------------------------------------------------------
    def next_tokens(self, req: Schedulable) -> int:
        """What a running request holds on every side after its next iteration (at most)."""
        return min(req.num_tokens + self.k, self.max_context)

    def budget_tokens(self, req: Schedulable) -> int:
        """The most a request can ever hold: its last iteration runs with remaining - 1 more tokens committed."""
        return min(req.num_tokens + req.remaining - 1 + self.k, self.max_context)

    def _reserved(self, req: Schedulable, running: bool) -> int:
        if self.policy == "reserve":
            return self.budget_tokens(req)
        # preempt: the running set's next iteration; an admission its prefill and the iteration after it
        return self.next_tokens(req) if running else min(req.num_tokens + 1 + self.k, self.max_context)

    def _fits(self, running: list, admitted: list, freed: list = ()) -> bool:
        """Every side can give ``running`` their reserved growth and ``admitted`` theirs, counting the pages
        ``freed`` requests hold as free (they are about to be dropped)."""
        for a in self.allocators:
            free = a.num_free + sum(a.pages_of(r.id) for r in freed)
            need = sum(a.extra_pages(r.id, self._reserved(r, True)) for r in running)
            need += sum(a.extra_pages(r.id, self._reserved(r, False)) for r in admitted)
            if need > free:
                return False
        return True

    # -- the decision of one engine step -------------------------------------------------------------------
    def schedule(self) -> Decision:
        """Preempt until the running set can run one more iteration (``preempt`` only: ``reserve`` never
        needs to), then admit from the head of the queue while the running set has room and everything fits."""
        d = Decision()
        while self.running and not self._fits(self.running, [], d.preempt):
            victim = self.running.pop()
            d.preempt.append(victim)
            self.waiting.appendleft(victim)
            self.num_preempted += 1
        if d.preempt:
            return d
        while self.waiting and len(self.running) + len(d.admit) < self.max_running:
            head = self.waiting[0]
            if not self._fits(self.running, [*d.admit, head]):
                break  # back-pressure: the head waits for pages, nothing overtakes it
            d.admit.append(self.waiting.popleft())
        self.running.extend(d.admit)
        return d
