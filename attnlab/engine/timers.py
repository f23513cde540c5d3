"""Phase timers: CUDA events on GPU (read after the iteration's one sync), perf_counter on CPU; and on both, the
host's own time per phase (perf_counter), which tells a host-bound phase (host ms close to its device ms: the GPU
waited for the launches) from a device-bound one (host ms far below it)."""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    """``mark(name)`` closes the current phase and starts ``name``; ``stop()`` closes the last one and
    ``read()`` returns {phase: ms}.

    On CUDA the marks are events recorded on the current stream, so timing adds no sync; ``read`` is called
    after the next iteration's commit sync, when every event has completed.
    """

    def __init__(self, device: torch.device, clock=time.perf_counter):
        self.cuda = device.type == "cuda"
        self.clock = clock  # host clock (tests pass a fake one)
        self._marks: list[tuple[str, object]] = []
        self._host: list[float] = []  # perf_counter at each mark

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self.clock()

    def mark(self, name: str) -> None:
        now = self._now()
        self._marks.append((name, now))
        self._host.append(self.clock() if self.cuda else now)  # on CPU: the same reading

    def stop(self) -> None:
        """Close the last phase (no sync)."""
        self.mark("_end")

    def read(self) -> dict[str, float]:
        """{phase: ms}; on CUDA every event must have completed (read after a later sync)."""
        out: dict[str, float] = {}
        for (name, a), (_, b) in zip(self._marks, self._marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out[name] = out.get(name, 0.0) + ms
        return out

    def host(self) -> dict[str, float]:
        """{phase: ms} of host time between the marks (no device wait; the same as ``read`` on CPU)."""
        out: dict[str, float] = {}
        for (name, _), a, b in zip(self._marks, self._host, self._host[1:]):
            out[name] = out.get(name, 0.0) + (b - a) * 1e3
        return out
