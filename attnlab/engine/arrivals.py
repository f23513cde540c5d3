"""When requests arrive (workload.arrival): every one at t = 0, a seeded Poisson process, or a closed loop.

An arrival source releases request indices in workload order. Open loops (all_at_once, poisson) fix every
arrival time before the run starts, so a spec run and its target-only baseline see the same schedule; a
closed loop (workload.concurrency = C) starts C requests at t = 0 and releases the next one when one finishes
(the time of that finish is its arrival), as a benchmark client with C connections does.
"""

from __future__ import annotations

import random
from collections import deque
from itertools import pairwise


def poisson_times(n: int, rate: float, seed: int) -> list[float]:
    """n arrival times (seconds): the first at 0, then exponential gaps of mean 1 / rate (requests per second)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


class OpenLoop:
    """Arrival times fixed up front (sorted: request i arrives no later than request i + 1)."""

    def __init__(self, times: list[float]):
        if any(b < a for a, b in pairwise(times)):
            raise ValueError("arrival times must be non-decreasing")
        self.times = list(times)
        self._next = 0

    def due(self, now: float) -> list[tuple[int, float]]:
        """(index, arrival time) of every request that has arrived by ``now`` and was not released yet."""
        out = []
        while self._next < len(self.times) and self.times[self._next] <= now:
            out.append((self._next, self.times[self._next]))
            self._next += 1
        return out

    def next_time(self) -> float | None:
        """The next arrival after the released ones (None: none left)."""
        return self.times[self._next] if self._next < len(self.times) else None

    def on_finish(self, now: float) -> None:
        """Open loop: a finish releases nothing."""


class ClosedLoop:
    """``concurrency`` requests in the system: the first ones at t = 0, then one per finish."""

    def __init__(self, n: int, concurrency: int):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.n = n
        self._ready: deque[float] = deque([0.0] * min(concurrency, n))
        self._next = 0

    def due(self, now: float) -> list[tuple[int, float]]:
        out = []
        while self._ready and self._next < self.n and self._ready[0] <= now:
            out.append((self._next, self._ready.popleft()))
            self._next += 1
        return out

    def next_time(self) -> float | None:
        return self._ready[0] if self._ready and self._next < self.n else None

    def on_finish(self, now: float) -> None:
        if self._next + len(self._ready) < self.n:
            self._ready.append(now)


def arrival_source(kind: str, n: int, *, rate: float | None = None, concurrency: int | None = None,
                   seed: int = 0):
    """The source for workload.arrival (all_at_once | poisson | closed) over n requests."""
    if kind == "all_at_once":
        return OpenLoop([0.0] * n)
    if kind == "poisson":
        return OpenLoop(poisson_times(n, rate, seed))
    if kind == "closed":
        return ClosedLoop(n, concurrency)
    raise ValueError(f"no arrival source for workload.arrival={kind!r}")
