"""The serving engine: continuous batching of arriving requests over the speculative loop.

``ServingEngine.run`` feeds an arrival source (attnlab.engine.arrivals) into the scheduler
(attnlab.engine.scheduler) and steps until every request has finished. One step has the shape of
nano-vllm's ``LLMEngine.step``:

1. schedule: preempt what cannot grow, admit what fits (``Scheduler.schedule``);
2. run: a prefill of the admitted requests (they join the running batch between two iterations), else one
   speculative iteration over the running batch (``SpeculativeDecoder.prefill`` / ``step``: one host sync);
3. postprocess: finished requests leave (their pages were freed inside the step), a closed loop releases
   the next arrivals, and the KV timeline gets one sample (pages in use on every side after the step, and
   the peak within it).

Every time is on the engine's clock (seconds since the run started, perf_counter): a request's times count
from its arrival, not from when the engine got round to it, so time spent waiting for a step to end or for
pages is in its TTFT. The engine does nothing but decode: no logits, no text, no parity work; the timeline
is a list append per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from attnlab.engine.scheduler import Scheduler
from attnlab.spec.decoder import LiveRequest, PrefillRecord, SpeculativeDecoder
from attnlab.spec.records import IterRecord, RequestOutput


class WallClock:
    """Seconds since ``start`` (perf_counter); ``wait_until`` sleeps while nothing is due."""

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def perf(self, t: float) -> float:
        """The perf_counter value of clock time ``t`` (a request's time origin)."""
        return self.t0 + t

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))

    def tick(self) -> None:
        """After each engine step (the wall clock moves by itself)."""


class StepClock(WallClock):
    """For tests: every engine step takes ``dt`` seconds, idle time jumps to the next arrival, so which
    requests share a batch is deterministic. Request latencies still come from the wall clock, counted from
    when the engine released the request (``perf``): mapping step time onto the wall clock instead would make
    latencies negative wherever a step runs in less than ``dt`` (a fast machine: a flaky serving test)."""

    def __init__(self, dt: float):
        self.dt, self.t = dt, 0.0

    def perf(self, t: float) -> float:
        return time.perf_counter()

    def start(self) -> None:
        super().start()
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def tick(self) -> None:
        self.t += self.dt


@dataclass
class ServeRequest:
    """One workload request in the engine (the scheduler's view: ``id``, ``num_tokens``, ``remaining``)."""

    index: int  # position in the workload (= arrival order)
    live: LiveRequest
    arrival_s: float

    @property
    def id(self):
        return self.live.id

    @property
    def num_tokens(self) -> int:
        return len(self.live.seq)

    @property
    def remaining(self) -> int:
        return self.live.max_new - len(self.live.out.output_ids)


@dataclass
class ServeOutput:
    """One serving run. ``requests``: in workload order, each with its arrival and queue wait; ``timeline``:
    one sample per engine step. The GenerateOutput-like fields let metrics.perf.summarize read it."""

    requests: list[RequestOutput]
    iterations: list[IterRecord]
    prefills: list[PrefillRecord]
    timeline: list[dict]
    wall_s: float  # first arrival -> last finish
    num_draft_tokens: int
    num_pages: dict[str, int]  # pool size of every side
    preemptions: int = 0
    prefill_ms: float = 0.0
    draft_prefill_ms: float = 0.0  # summed over the prefills
    num_batches: int = 0  # prefills (summarize divides draft_prefill_ms by it)


@dataclass
class ServingEngine:
    decoder: SpeculativeDecoder
    scheduler: Scheduler
    eos: frozenset = frozenset()
    clock: WallClock = field(default_factory=WallClock)

    def run(self, prompts: list[list[int]], budgets: list[int], arrivals) -> ServeOutput:
        """Serve ``prompts`` (token ids, output budgets) as ``arrivals`` releases them; returns when all are done."""
        dec, sched, clock = self.decoder, self.scheduler, self.clock
        runners = {"target": dec.target, "draft": dec.drafter.runner}
        self._allocs = {side: r.allocator for side, r in runners.items() if r is not None}
        ids = dec.new_ids(len(prompts))
        self._reqs: dict = {}
        self._outs = [RequestOutput(prompt_ids=list(p)) for p in prompts]
        self._iters, self._prefills, self._timeline = [], [], []
        self._arrivals, self._left = arrivals, len(prompts)
        preempted_before = sched.num_preempted
        clock.start()
        self._batch = dec.start(self.eos)
        try:
            while self._left:
                self._release(clock.now(), prompts, budgets, ids)
                if not sched:
                    nxt = arrivals.next_time()
                    if nxt is None:
                        raise RuntimeError("serving: requests are left but none will arrive (arrival source)")
                    clock.wait_until(nxt)
                    continue
                self.step()
        finally:
            dec.close(self._batch)
        end = max((o.latency_ms / 1e3 + o.arrival_s for o in self._outs), default=0.0)
        return ServeOutput(self._outs, self._iters, self._prefills, self._timeline, end,
                           dec.k, {side: a.num_pages for side, a in self._allocs.items()},
                           sched.num_preempted - preempted_before,
                           sum(p.target_ms + p.draft_ms for p in self._prefills),
                           sum(p.draft_ms for p in self._prefills), len(self._prefills))

    def _release(self, now: float, prompts, budgets, ids) -> None:
        """Arrivals due by ``now`` join the queue, each timed from its own arrival time."""
        for i, t in self._arrivals.due(now):
            out = self._outs[i]
            out.arrival_s = t
            live = LiveRequest(ids[i], list(prompts[i]), budgets[i], out, self.clock.perf(t))
            req = ServeRequest(i, live, t)
            self._reqs[live.id] = req
            self.scheduler.add(req)

    def step(self) -> None:
        """schedule -> run (prefill of the admitted, or one speculative iteration) -> postprocess."""
        dec, sched, clock, batch = self.decoder, self.scheduler, self.clock, self._batch
        for a in self._allocs.values():
            a.max_pages_used = a.num_used  # this step's peak, read after it
        d = sched.schedule()
        if d.preempt:
            dec.drop(batch, [r.id for r in d.preempt])
            for r in d.preempt:
                r.live.out.preemptions += 1
        if d.admit:
            admitted = time.perf_counter()
            for r in d.admit:
                if r.live.out.queue_wait_ms is None:  # the first admission (a resumed request waited again)
                    r.live.out.queue_wait_ms = (admitted - r.live.t0) * 1e3
            rec, finished = dec.prefill(batch, [r.live for r in d.admit])
            self._prefills.append(rec)
            kind = "prefill"
        elif batch.rows:
            res = dec.step(batch)
            self._iters.append(res.record)
            finished = res.finished
            kind = "iteration"
        else:  # everything admitted was preempted this step: nothing runs
            finished, kind = [], "preempt"
        clock.tick()
        done = [self._reqs.pop(r.id) for r in finished]
        sched.finished(done)
        now = clock.now()
        for r in d.admit:  # arrival -> its first token, committed by its first prefill
            r.live.out.ttft_ms = r.live.out.token_times_ms[0]
        for _ in done:
            self._left -= 1
            self._arrivals.on_finish(now)
        sample = {"t_s": now, "step": kind, "running": len(batch.rows), "waiting": len(sched.waiting),
                  "preempted": len(d.preempt), "finished": len(done)}
        for side, a in self._allocs.items():
            sample[f"pages_{side}"] = a.num_used
            sample[f"peak_pages_{side}"] = a.max_pages_used
        self._timeline.append(sample)
