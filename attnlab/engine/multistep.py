"""Multi-step greedy decode: N single-token passes per launch, one host sync per N tokens.

Target-only greedy decoding (``engine.decode_steps_per_sync = N``) prepares the N passes up front (pages
for N more tokens, their metadata in one copy, plan slots 1..N as the multi-step draft does), then runs them back to back, each step's
argmax feeding the next step's input on the device. Under CUDA graphs the N steps are one graph (a replay
per N tokens); without graphs ``greedy_steps`` runs eagerly, the same code minus the capture.

The caller commits up to N tokens per request and drops those past EOS / max_new_tokens; the target KV
then holds the committed sequence minus its last token, as after a verify pass (spec/decoder.py).

A greedy drafter's k - 1 single-token steps are the same loop (``decode_steps(..., features=...)``): an EAGLE
head's steps also pass each step's pre-norm output (``ctx.captured``) on as the next step's feature, so the
whole draft is one graph replay instead of a replay, an argmax and a feature copy per step.

Device-planned steps (a backend with ``supports_device_steps()``: triton): the host allocates the pages and
stages one small int32 buffer (each row's first position, the layout of its last step's pages), and the steps'
positions, pool slots and KV lengths are computed from it on the device (``device_step_meta``, captured in the
same graph), into the tensors the backend's step plans read (``device_step_plans``). Per launch, the host then
builds no per-step metadata and plans nothing: the draft's host cost was most of its time at batch 1 on an H200
(experiments/h200-2026-12-01e: 0.68 of 0.77 ms at k = 4). flashinfer plans the launch once on the host
(``device_steps_host_plan``: its CUDA-core decode plan depends on page counts only, through its schedule) and
rewrites each step's last-page length on the device, for launches whose first and last steps FlashInfer schedules
alike (``device_steps_fit``: no page crossed, or one the schedule does not see, backends/flashinfer_schedule.py);
the others, and backends without device steps, plan every step on the host.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def greedy_steps(r, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 features: torch.Tensor | None = None) -> torch.Tensor:
    """The body of a multi-step pass (captured into a graph, or run eagerly).

    ids: [R] int64 the first step's input tokens; positions, slots: [N, R] int64 per step (slot -1: a
    padded row); step j runs under plan slot j + 1. ``features`` [R, F]: a draft head's first-step input
    feature; each later step reads the previous step's ``ctx.captured``. Returns the argmax tokens [N, R] int64.
    """
    out = []
    for j in range(positions.shape[0]):
        r.use_step(j)
        ctx = r.context(slots[j])
        extra = {} if features is None else {"features": features}
        ids = r.greedy_tokens(r.model(ids, positions[j], ctx, **extra))
        if features is not None:
            features = ctx.captured
        out.append(ids)
    return torch.stack(out)


def device_steps_layout(rows: int) -> tuple[int, int, int, int, int]:
    """Offsets (int32 entries) of pos0, inc, lens0, kv_indptr and kv_indices in a device-steps buffer of ``rows``
    rows. Every section starts on a 16-byte boundary: Triton specializes a kernel on whether each pointer is
    16-byte aligned, so unaligned views would compile other variants mid-run than the warmup built."""
    r4, ip4 = -(-rows // 4) * 4, -(-(rows + 1) // 4) * 4
    return 0, r4, 2 * r4, 3 * r4, 3 * r4 + ip4


def device_steps_values(starts, indptr, indices, rows: int) -> list[int]:
    """The host values of a device-steps buffer: len(starts) real rows (first position ``starts[i]``, one step
    further each step), then dummies up to ``rows`` (position 0, KV length 1, no step), zeros in the gaps."""
    b = len(starts)
    _, o_inc, o_lens, o_indptr, o_indices = device_steps_layout(rows)
    pad = rows - b
    return [*starts, *[0] * (o_inc - b), *[1] * b, *[0] * (o_lens - o_inc - b), *[s + 1 for s in starts],
            *[1] * pad, *[0] * (o_indptr - o_lens - rows), *indptr, *[0] * (o_indices - o_indptr - len(indptr)),
            *indices]


def dummy_device_steps_meta(rows: int, capacity: int, scratch_page: int, device) -> torch.Tensor:
    """A device-steps buffer of ``rows`` dummy rows (each on the scratch page) with room for ``capacity`` page
    ids: what a device-planned graph is captured over."""
    *_, o_indices = device_steps_layout(rows)
    values = device_steps_values([], list(range(rows + 1)), [scratch_page] * rows, rows)
    meta = torch.zeros(o_indices + capacity, dtype=torch.int32)
    meta[:len(values)] = torch.tensor(values, dtype=torch.int32)
    return meta.to(device)


def device_step_meta(meta: torch.Tensor, rows: int, n: int, page_size: int,
                     kv_lens_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The device half of device-planned steps (runner.prepare_device_steps stages ``meta``): -> positions and
    pool slots [n, rows] int64 (slot -1: a dummy row); writes step j's KV lengths into ``kv_lens_out[j]``."""
    _, o_inc, o_lens, o_indptr, o_indices = device_steps_layout(rows)
    pos0, inc = meta[:rows].long(), meta[o_inc:o_inc + rows].long()
    lens0 = meta[o_lens:o_lens + rows]
    page_start = meta[o_indptr:o_indptr + rows].long()  # kv_indptr without its last entry
    indices = meta[o_indices:]
    step = torch.arange(n, device=meta.device)[:, None] * inc[None]  # dummies stay where they are
    pos = pos0[None] + step
    kv_lens_out.copy_(lens0[None] + step)
    page = indices[page_start[None] + pos // page_size].long()
    return pos, torch.where(inc[None] > 0, page * page_size + pos % page_size, -1)


def device_step_views(meta: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr, kv_indices) views of a device-steps buffer, for ``backend.device_step_plans``."""
    *_, o_indptr, o_indices = device_steps_layout(rows)
    return meta[o_indptr:o_indptr + rows + 1], meta[o_indices:]


def device_step_lens(n: int, rows: int, device) -> torch.Tensor:
    """[n, rows] int32 for the steps' KV lengths, each step's row 16-byte aligned (a view of [n, rows rounded up
    to 4])."""
    return torch.zeros(n, -(-rows // 4) * 4, dtype=torch.int32, device=device)[:, :rows]


@torch.inference_mode()
def decode_steps(r, reqs: Sequence[Hashable], starts: Sequence[int], last: torch.Tensor, n: int,
                 features: torch.Tensor | None = None) -> torch.Tensor:
    """Feed ``last`` [B] (each request's last committed token, at position ``starts[i]``) and decode ``n``
    greedy tokens per request: -> [B, n] int64 on device. Allocates KV for the n new positions.
    ``features`` [B, F]: a draft head's input feature for the first step (see greedy_steps)."""
    b = len(reqs)
    width = None if features is None else features.shape[1]
    if r.backend.supports_device_steps():
        bs = _device_bucket(r, b, n, width)
        if r.backend.device_steps_fit(starts, n, bs or b):
            from attnlab.backends.base import DeviceStepsUnfit

            try:
                return _device_steps(r, reqs, starts, last, n, features, bs)
            except DeviceStepsUnfit:  # its host plan disagreed with the backend's model: nothing ran; per step
                pass
    passes = r.prepare_steps(reqs, starts, n)  # one host-to-device copy for the n passes
    r.plan_steps(passes)
    bs = passes[0].padded_to
    if r.graphs is not None and bs is not None and r.graphs.has_steps(bs, n, width):
        tokens = r.graphs.replay_steps(bs, n, passes, last, features)
    else:
        rows = passes[0].positions.shape[0]
        ids = torch.cat([last, last.new_zeros(rows - b)]) if rows > b else last
        if features is not None and rows > b:
            features = torch.cat([features, features.new_zeros(rows - b, features.shape[1])])
        tokens = greedy_steps(r, ids, torch.stack([p.positions for p in passes]),
                              torch.stack([p.slots for p in passes]), features)
    return tokens[:, :b].t()


def _device_bucket(r, b: int, n: int, width) -> int | None:
    """The graph bucket a device-planned launch of ``b`` requests replays, or None (eager)."""
    from attnlab.engine.graphs import bucket_for

    bs = bucket_for(b, r.graphs.buckets) if r.graphs is not None else None
    return bs if bs is not None and r.graphs.has_steps(bs, n, width, device=True) else None


def _device_steps(r, reqs, starts, last, n, features, bs) -> torch.Tensor:
    """decode_steps on a backend that plans steps on the device: one staged buffer, then one graph replay of
    bucket ``bs`` (or, bs None, the same code eagerly, planned for this launch's lengths)."""
    b = len(reqs)
    if bs is not None:
        meta, _ = r.prepare_device_steps(reqs, starts, n, pad_to=bs)
        return r.graphs.replay_device_steps(bs, n, meta, last, features)[:, :b].t()
    meta, rows = r.prepare_device_steps(reqs, starts, n)
    kv_lens = device_step_lens(n, rows, r.device)
    r.backend.device_step_plans(rows, n, *device_step_views(meta, rows), kv_lens, max_kv_len=max(starts) + n)
    positions, slots = device_step_meta(meta, rows, n, r.allocator.page_size, kv_lens)
    return greedy_steps(r, last, positions, slots, features).t()
