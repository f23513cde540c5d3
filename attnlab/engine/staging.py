"""Pinned host staging: a pass's integer metadata in one buffer, moved with one host-to-device copy.

``ModelRunner.prepare`` used to build about eight small tensors per pass (slots, positions, last_rows,
qo_indptr and the four layout tensors), each a pageable ``torch.tensor(...).to(dev, non_blocking=True)``:
eight copies that the driver stages through its own pinned bounce buffer, each a few microseconds of host
time. Here the segments are packed, 16-byte aligned, into one byte buffer allocated from torch's pinned
(page-locked) host allocator, copied with one non-blocking ``copy_`` into one device buffer, and every
tensor of the pass is a typed view of that buffer.

Lifetimes: torch's caching host allocator records the copy's stream and does not hand the pinned block out
again until the copy finished, and the device buffer comes from the caching device allocator, so several
passes prepared ahead (a multi-step draft, the N steps of a multi-step decode) each keep their own
buffer. CUDA graphs never read these tensors directly: a replay copies them into the graph's static
buffers, and graph-capable backends copy the layout into their per-slot plan buffers (device-to-device).

On CPU the code is the same with a plain host buffer (the "copy" is a memcpy), so tests count copies there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class HostStaging:
    """Packs int segments into one host buffer and moves it to ``device`` in one copy.

    ``copies`` counts the host-to-device copies made (one per ``stage`` call), for tests and benchmarks.
    ``packed=False`` is the previous path, one pageable tensor and copy per segment: bench.e2e's "legacy"
    host path, measured beside this one in the same process.
    """

    def __init__(self, device: torch.device | str, packed: bool = True):
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self.packed = packed
        self.copies = 0

    def stage(self, segments: Sequence[tuple[Sequence[int], torch.dtype]]) -> list[torch.Tensor]:
        """[(values, int32 | int64), ...] -> one 1-D device tensor per segment, views of one device buffer."""
        if not self.packed:
            self.copies += len(segments)
            return [torch.tensor(list(v), dtype=dt).to(self.device, non_blocking=True) for v, dt in segments]
        # Two typed sections, int64 first then int32, each segment padded to 16 bytes (safe for vector loads):
        # one list and one numpy assignment per section, one torch.split per section for the views. Per
        # segment, Python and torch calls used to cost a few microseconds each, which made a k - 1 step draft's
        # 8 (k - 1) segments the largest host cost of its phase.
        flat = {torch.int64: [], torch.int32: []}
        sizes = {torch.int64: [], torch.int32: []}
        for values, dt in segments:
            n = len(values)
            pad = -n % (16 // dt.itemsize)
            flat[dt] += values
            flat[dt] += _ZEROS[:pad]
            sizes[dt] += (n, pad)
        n64, n32 = len(flat[torch.int64]), len(flat[torch.int32])
        host = torch.empty(max(8 * n64 + 4 * n32, 16), dtype=torch.uint8, pin_memory=self.pin)
        raw = host.numpy()
        if n64:
            raw[:8 * n64].view(np.int64)[:] = flat[torch.int64]
        if n32:
            raw[8 * n64:8 * n64 + 4 * n32].view(np.int32)[:] = flat[torch.int32]
        dev = host.to(self.device, non_blocking=True) if self.device.type != "cpu" else host
        self.copies += 1
        views = {torch.int64: iter(torch.split(dev[:8 * n64].view(torch.int64), sizes[torch.int64])[0::2]),
                 torch.int32: iter(torch.split(dev[8 * n64:8 * n64 + 4 * n32].view(torch.int32),
                                               sizes[torch.int32])[0::2])}
        return [next(views[dt]) for _, dt in segments]


_ZEROS = [0] * 4


