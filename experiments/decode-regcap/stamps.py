"""A diagnostic, not a backend: where the fused merge's time goes inside the merging program, from timestamps it
takes itself while ``attnlab.bench.kernels`` replays its CUDA graphs (PDL on, as the floor is timed).

    python experiments/decode-regcap/stamps.py --out PREFIX [bench.kernels arguments]
    python experiments/decode-regcap/stamps.py --read FILE...   (PREFIX-stamps.json[.gz]: the quantiles, any machine)

``decode.merge_arrived`` is replaced by ``merge.merge_arrived``'s arrival and merge (``merge.merge_partials``) with
stamps around them, which its last program (the merger) takes: the SM's cycle counter (``%clock64``, low 32 bits)
before its arrival's barrier, after the add's reply and after its sums; the GPU's ``%globaltimer`` (ns, low 32 bits)
before the barrier and after the sums. (A stamp after the LSEs' max held the partials' loads back until it, in the
sm_90a SASS: without it they issue with the LSEs', as unstamped.)
A stamp after a value is written as a timer read predicated on that value. ptxas makes it an unconditional read
and a select, placed after the compare of that value, so the order holds because a warp issues in order (the SASS,
checked on the CPU: not a guarantee of the compiler's). The merger writes them, with a sequence number a kv head,
into a ring past the arrival counters (``merge.merge_counters`` is replaced to allocate it). Its output is the
merge's own (the same loads and sums); the stamps add cross-warp maxima (barriers, shared memory) before its output
store, an add and a few stores, so its times are a little longer than the unstamped merge's (run.sh 5 times both).

After the bench, PREFIX-stamps.json holds every ring that was written (per buffer: kv heads x launches x stamps) and the
console a summary per buffer, medians over the last launches of each kv head's merger:
- arrival: cycles from before the barrier to the add's reply (the fence and the round trip);
- merge: from the reply to the sums (the LSEs and partials loaded and summed);
- period: globaltimer ns between one launch's merger and the next's (a launch's time in the replay);
- tail: ns from one launch's merger's sums to the next launch's merger's arrival, the same kv head.
``--read`` gives their 10th / 50th / 90th percentiles, and per launch (all kv heads' mergers of one launch: each
merges once a launch, so their rings align) the span from the first merger's arrival to the last one's sums and the
spread of the mergers' sums.
"""

from __future__ import annotations

import gzip
import json
import math
import pathlib
import statistics
import sys

import torch
import triton
import triton.language as tl

from attnlab.bench import kernels
from attnlab.kernels import decode, merge
from attnlab.kernels.merge import merge_partials, store_merged

# The rings' layout, constants the kernel reads too (tl.constexpr globals)
BASE = tl.constexpr(4096)  # int32 slots for the arrival counters (batch x kv heads) before the rings
RING = tl.constexpr(512)  # launches a kv head's ring holds
STAMPS = tl.constexpr(5)  # clock before the barrier, after the reply, after the sums; globaltimer before, after
STRIDE = tl.constexpr(1 + RING.value * STAMPS.value)  # a kv head's sequence number, then its ring
HEADS = 1024  # kv heads x requests the rings hold
BUFFERS: list[torch.Tensor] = []


def counters(programs: int, num_kv_heads: int, device) -> torch.Tensor:
    slots = min(BASE.value, HEADS)
    if max(1, programs) * num_kv_heads > slots:
        raise SystemExit(f"stamps.py: {programs} x {num_kv_heads} counters do not fit its {slots} slots")
    buf = torch.zeros(BASE.value + HEADS * STRIDE.value, dtype=torch.int32, device=device)
    BUFFERS.append(buf)
    return buf


@triton.jit
def _stamp(after, SRC: tl.constexpr):
    """The low 32 bits of ``SRC`` (``"%clock64"`` or ``"%globaltimer"``), read once ``after`` (an int32 tensor; fp32
    values bitcast) is in the thread's registers: the read is predicated on it."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u64 t; .reg .b32 x; mov.b32 x, $1; setp.ne.b32 p, x, 2143289345; mov.u64 t, 0; "
        "@p mov.u64 t, " + SRC + "; cvt.u32.u64 $0, t; }", "=r,r", [after], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _merge_stamped(O, O_PART, LSE_PART, COUNTERS, ticket, num_splits, rows, heads, row_mask, offs_d, d_mask,
                   stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
                   MAX_SPLITS: tl.constexpr):
    c0 = tl.max(_stamp(rows, "%clock64"), 0)
    g0 = tl.max(_stamp(rows, "%globaltimer"), 0)
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNTERS + ticket, 1, sem="acq_rel")
    if arrived == num_splits - 1:
        c1 = tl.max(_stamp(rows * 0 + arrived, "%clock64"), 0)
        out = merge_partials(O_PART, LSE_PART, num_splits, rows, heads, row_mask, offs_d, d_mask, stride_pt,
                             stride_ph, stride_ps, stride_lt, stride_lh, MAX_SPLITS)
        bits = out.to(tl.int32, bitcast=True)
        c3 = tl.max(tl.max(_stamp(bits, "%clock64"), 1), 0)
        g3 = tl.max(tl.max(_stamp(bits, "%globaltimer"), 1), 0)
        store_merged(O, COUNTERS, ticket, out, rows, heads, row_mask, offs_d, d_mask, stride_ot, stride_oh)
        ring = COUNTERS + BASE + ticket * STRIDE
        seq = tl.atomic_add(ring, 1, sem="relaxed")
        slot = ring + 1 + (seq % RING) * STAMPS
        tl.store(slot, c0)
        tl.store(slot + 1, c1)
        tl.store(slot + 2, c3)
        tl.store(slot + 3, g0)
        tl.store(slot + 4, g3)


def rings(buf: torch.Tensor) -> list[list[list[int]]]:
    """Per kv head that stamped: its launches in order (the ring's last RING), each STAMPS ints (uint32)."""
    host = buf.cpu().to(torch.int64) & 0xFFFFFFFF
    out = []
    stride, size = STRIDE.value, RING.value
    for h in range(HEADS):
        base = BASE.value + h * stride
        seq = int(host[base])
        if seq == 0:
            continue
        ring = host[base + 1: base + stride].view(size, STAMPS.value).tolist()
        n = min(seq, size)
        order = [(seq - n + i) % size for i in range(n)]
        out.append([ring[j] for j in order])
    return out


def wrap(d: int) -> int:
    return d % (1 << 32)


def signed(d: int) -> int:
    """A difference of two 32-bit stamps less than 2^31 apart, either order."""
    return (d + (1 << 31)) % (1 << 32) - (1 << 31)


# the series of a buffer's stamps (SERIES order: its table's columns after the mergers' count)
SERIES = ("arrival_cycles", "merge_cycles", "merger_ns", "launch_span_ns", "launch_sums_spread_ns", "period_ns",
          "tail_ns")


def series(heads: list[list[list[int]]], last: int = 200) -> dict[str, list[int]]:
    """Over each merger's last ``last`` launches (all mergers hold as many: each merges once a launch, so their rings
    align): per merger and launch, the arrival (clock, before the barrier to the add's reply), the merge (the reply to
    the sums) and the merger's own span (globaltimer); per launch, across mergers, the span from the first arrival to
    the last sums and the spread of the sums; per merger, between launches, the period (arrival to arrival) and the
    tail (sums to the next arrival)."""
    n = min(len(x) for x in heads)
    n = min(n, last)
    heads = [x[-n:] for x in heads]
    out = {k: [] for k in SERIES}
    for launches in heads:
        for i, s in enumerate(launches):
            out["arrival_cycles"].append(wrap(s[1] - s[0]))
            out["merge_cycles"].append(wrap(s[2] - s[1]))
            out["merger_ns"].append(wrap(s[4] - s[3]))
            if i:
                out["period_ns"].append(wrap(s[3] - launches[i - 1][3]))
                out["tail_ns"].append(wrap(s[3] - launches[i - 1][4]))
    for i in range(n):  # across mergers: signed offsets from the first merger's arrival (the timer may wrap)
        ref = heads[0][i][3]
        arrive = [signed(h[i][3] - ref) for h in heads]
        done = [signed(h[i][4] - ref) for h in heads]
        out["launch_span_ns"].append(max(done) - min(arrive))
        out["launch_sums_spread_ns"].append(max(done) - min(done))
    return out


def summary(heads: list[list[list[int]]], last: int = 200) -> dict:
    """The medians of ``series``, the mergers and launches, and the globaltimer's step (the gcd of the mergers' spans
    on it: 1000 where it ticks once a microsecond)."""
    s = series(heads, last)
    return {"mergers": len(heads), "launches": min(len(x) for x in heads), "timer_step_ns": math.gcd(*s["merger_ns"]),
            **{k: statistics.median(v) if v else None for k, v in s.items()}}


def quantiles(xs: list[int]) -> str:
    if len(xs) < 2:
        return "-"
    q = statistics.quantiles(xs, n=10)
    return f"{q[0]:.0f} / {q[4]:.0f} / {q[8]:.0f}"


def read(paths: list[str], last: int = 200) -> None:
    """A table of the stamps in each PREFIX-stamps.json (or .json.gz), a row per buffer (one per bench side: a model's
    decode, in the order the bench built them; a merger per request and kv head): ``series``' 10th / 50th / 90th
    percentiles."""
    print("| file | buffer | mergers (requests x kv heads) | arrival (cycles) | merge (cycles) | merger, arrival to sums (ns) "
          "| launch: first arrival to last sums (ns) | launch: mergers' sums spread (ns) | period (ns) | tail (ns) |")
    print("|" + "---|" * 10)
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            report = json.load(f)
        for entry in report:
            cells = [pathlib.Path(path).name, str(entry["buffer"]), str(len(entry["rings"]))]
            cells += [quantiles(v) for v in series(entry["rings"], last).values()]
            print("| " + " | ".join(cells) + " |")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--read"]:
        read(argv[1:])
        return 0
    if "--out" not in argv:
        raise SystemExit("stamps.py: --out PREFIX is needed (PREFIX-stamps.json)")
    # every buffer a fused decode merges on must hold the rings (warmup's scratch ones too): modules that imported
    # merge_counters by name get the replacement; those that import it later read it from merge
    original = merge.merge_counters
    for mod in [m for name, m in sys.modules.items() if name.startswith("attnlab")]:
        if getattr(mod, "merge_counters", None) is original:
            mod.merge_counters = counters
    decode.merge_arrived = _merge_stamped
    print("stamps.py: the fused merge's merger stamps its arrival, loads and sums", flush=True)
    rc = kernels.main(argv)
    torch.cuda.synchronize()
    report = []
    for i, buf in enumerate(BUFFERS):
        heads = rings(buf)
        if heads:
            s = summary(heads)
            report.append({"buffer": i, "summary": s, "rings": heads})
            print(f"buffer {i}: {s}", flush=True)
    out = pathlib.Path(argv[argv.index("--out") + 1])
    out.parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(str(out) + "-stamps.json").write_text(json.dumps(report))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
