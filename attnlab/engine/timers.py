"""Phase timers: CUDA events on GPU (read after the iteration's one sync), perf_counter on CPU."""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    """``mark(name)`` closes the current phase and starts ``name``; ``stop()`` closes the last one and
    ``read()`` returns {phase: ms}.

    On CUDA the marks are events recorded on the current stream, so timing adds no sync; ``read`` is called
    after the next iteration's commit sync, when every event has completed.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def mark(self, name: str) -> None:
        self._marks.append((name, self._now()))

    def stop(self) -> None:
        """Close the last phase (no sync)."""
        self._marks.append(("_end", self._now()))

    def read(self) -> dict[str, float]:
        """{phase: ms}; on CUDA every event must have completed (read after a later sync)."""
        out: dict[str, float] = {}
        for (name, a), (_, b) in zip(self._marks, self._marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out[name] = out.get(name, 0.0) + ms
        return out
