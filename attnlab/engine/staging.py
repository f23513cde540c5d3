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

_NP = {torch.int32: np.int32, torch.int64: np.int64}


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
        offsets, off = [], 0
        for values, dt in segments:
            offsets.append(off)
            off += -(-len(values) * _itemsize(dt) // 16) * 16  # 16-byte aligned: safe for vector loads
        host = torch.empty(max(off, 16), dtype=torch.uint8, pin_memory=self.pin)
        raw = host.numpy()
        for (values, dt), o in zip(segments, offsets):
            if len(values):
                raw[o:o + len(values) * _itemsize(dt)].view(_NP[dt])[:] = values
        dev = host.to(self.device, non_blocking=True) if self.device.type != "cpu" else host
        self.copies += 1
        return [dev[o:o + len(values) * _itemsize(dt)].view(dt) for (values, dt), o in zip(segments, offsets)]


def _itemsize(dt: torch.dtype) -> int:
    return dt.itemsize
