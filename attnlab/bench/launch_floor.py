"""What a batch-1 decode's time is made of: the triton decode beside empty kernels of its launch shape, with and
without programmatic dependent launch, timed the way ``bench.kernels`` times a cell (CUDA-graph replay of
back-to-back runs over the layers). CUDA, compute capability >= 9.0 for the PDL rows.

    python -m attnlab.bench.launch_floor [--models smollm2,llama8b] [--contexts 4096] [--repeats 5] [--out PREFIX]

Rows per (model, context), batch 1, bf16, page 16, the triton backend's own plan (its split count):
- ``empty x1``: one empty kernel (one program) per run: the graph's launch-to-launch floor;
- ``empty, decode grid`` and ``empty x2, decode + merge grids``: empty kernels of the decode's grid (request x kv
  head x split) and of its merge's (token x query head): what launching the real kernels costs with no work in them
  (the second only where the decode has a merge launch: under the triton backend's default ``fused_merge=auto`` a
  batch-1 decode's splits are one tile each and the kernel merges them itself);
- ``merge only``: the split merge of the plan's partials as its own launch (``merge_splits``);
- ``stream K / V, decode grid`` (and ``+ empty merge grid``, where the decode has a merge launch): a read-only pass
  over the same K / V bytes with the decode's programs, split bounds, page gathers and tile
  (``attnlab.bench.kv_stream``: loads and a sum, checked against torch), so what reading these bytes alone costs at
  this grid is measured; ``stream K / V, N splits``: the same with other split counts (``--stream-splits``; counted
  by the partitions they make: splits are multiples of the tile, so a count past context / BLOCK_N adds only empty
  programs and is skipped as a duplicate);
  ``stream K / V, decode grid, pages`` / ``contig`` (``--stream-modes``): the decode grid's read with a
  tensor-descriptor box per page (TMA on Hopper) in place of per-token gathers, or as if the pages were consecutive
  (the same byte count from other slots: a reference with no page table, left out of the floor line's fastest
  read); ``stream K / V, rows of every head, N programs`` (``--stream-modes rows``): the plan's bytes with the head
  axis folded into each program's rows (every kv head of its tokens; asked for the decode grid's program count and 4x
  that, N the programs the tile-multiple split bounds give);
  ``stream K / V, ..., hnd`` (``--stream-modes hnd``): the decode grid and the stream-splits partitions over a copy of
  the pool laid out head-major within each page (FlashInfer's HND). The rows walk the same layers as the decode (at
  SmolLM2 shapes 8 x 3.1 MB, inside an H100's 50 MB L2: partly L2 hits for both);
- ``decode``: the triton backend's decode as the engine runs it (the split kernel and its merge, inside it or
  launched after it).
Columns: PDL off; PDL on (the decode reads its plan and prefetches its first K / V tiles into L2 before its wait, and
on one-stage launches takes its first tile from those reads, since 2026-12-07 loaded before the wait:
attnlab.kernels.decode); PDL on with that prefetch off
(the wait first). The decode's output is checked to be the same bits in every column. The stream rows take the plan's
stages: a split of one tile (SmolLM2's batch-1 4k) runs one (2026-12-06e and f's runs: in every column; since
decode.early_launch only where the decode takes its early tile, the PDL on column), so those rows are not
comparable with earlier runs' three.
An issue-16 floor ("batch-1 decode 1.5x faster than on 2026-12-01") is judged against the decode's empty launches
(``empty x2`` with a merge launch, else ``empty, decode grid``): the part of the decode above them is what a kernel
change can still take away. Cells: the median over ``--repeats``
measurements (arms interleaved), its spread (max - min, % of the median), and the ratio to the decode of the same PDL
setting.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

from attnlab.bench import kv_stream
from attnlab.bench.kernels import HEADS, Timer, build, make_backend, versions
from attnlab.bench.output import write_report
from attnlab.kernels import decode, pdl
from attnlab.kernels.pdl import launch_args, pdl_start

# batch-1 decode at 4k on 2026-12-01 (bench.kernels --quick, H200), the "before" of issue 16's floor, in us
BEFORE_US = {"smollm2": 6.9, "llama8b": 14.1}


@triton.jit
def _empty_kernel(X, USE_PDL: tl.constexpr = False):
    pdl_start(USE_PDL)


class _Launches:
    """A stand-in backend for ``Timer``: ``run(q, layer)`` launches ``fn`` and returns a finite tensor."""

    def __init__(self, fn, out: torch.Tensor):
        self.fn, self.out = fn, out

    def run(self, q, layer):
        self.fn(layer)
        return self.out


def _rows(be, q, hkv: int, context: int, stream_splits: tuple[int, ...] = (),
          stream_modes: tuple[str, ...] = ()) -> tuple[dict, int]:
    """The rows' stand-ins for one backend (planned, PDL as the caller set it): ({row: runner}, its split count)."""
    from attnlab.kernels.merge import merge_splits

    be.run(q, 0)  # compiles; the plan's split count and scratch
    plan = be.active_plan
    splits = plan.params.num_splits
    out = torch.zeros_like(q)
    dummy = torch.zeros(1, device=q.device)
    decode_grid, merge_grid = (1, hkv, splits), (1, q.shape[1])

    def empty(*grids):
        def launch(layer):
            for grid in grids:
                _empty_kernel[grid](dummy, **launch_args(dummy))
        return _Launches(launch, out)

    second = splits > 1 and plan.counters is None  # a split decode's merge launch (none where the kernel merges)
    rows = {"empty x1": empty((1,)), "empty, decode grid": empty(decode_grid)}
    if second:
        rows["empty x2, decode + merge grids"] = empty(decode_grid, merge_grid)
    if splits > 1:
        rows["merge only"] = _Launches(lambda layer: merge_splits(out, plan.o_part, plan.lse_part), out)
    rows["stream K / V, decode grid"] = _stream(be, splits)
    if second:
        rows["stream K / V + empty merge grid"] = _stream(be, splits, lambda: _empty_kernel[merge_grid](
            dummy, **launch_args(dummy)))
    block_n, seen = plan.params.block_n, {kv_stream.working_splits(context, splits, plan.params.block_n)}
    parts = []  # the other partitions timed
    for n in stream_splits:  # by the partitions they make: a count past context / BLOCK_N adds only empty programs
        w = kv_stream.working_splits(context, n, block_n)
        if w in seen:
            print(f"launch_floor: --stream-splits {n} makes the same {w}-way partition of {context} tokens as a row "
                  f"already timed (splits are multiples of BLOCK_N {block_n}): skipped", flush=True)
            continue
        seen.add(w)
        rows[f"stream K / V, {w} splits"] = _stream(be, w)
        parts.append(w)
    for mode in stream_modes:  # the same bytes and grid, loaded in page boxes or as if contiguous (kv_stream)
        if mode not in ("gather", "rows"):
            rows[f"stream K / V, decode grid, {mode}"] = _stream(be, splits, mode=mode)
    if "hnd" in stream_modes:  # head-major pages: the other partitions too
        for w in parts:
            rows[f"stream K / V, {w} splits, hnd"] = _stream(be, w, mode="hnd")
    if "rows" in stream_modes:  # every head of a token in one program: the decode grid's program count, then 4x
        tile = max(1, block_n // triton.next_power_of_2(hkv))
        for n in (splits * hkv, 4 * splits * hkv):
            w = kv_stream.working_splits(context, n, tile)
            name = f"stream K / V, rows of every head, {w} programs"
            if name not in rows:
                rows[name] = _stream(be, w, mode="rows", block_n=tile)
    rows["decode"] = be
    return rows, splits


def _stream(be, splits: int, then=None, mode: str = "gather", block_n: int | None = None) -> _Launches:
    """``kv_stream.stream_kv`` over the backend's pool and plan with ``splits`` splits (the plan's tile and warps),
    its sums checked against torch once (layer 0); ``then``: a launch after it; ``mode``: kv_stream's load mode;
    ``block_n``: another tile's tokens (``rows``: the decode's tile elements spread over every head)."""
    pool, plan, p = be.pool, be.active_plan, be.active_plan.params
    block_n = block_n or p.block_n
    sums = torch.zeros(plan.kv_lens.shape[0], pool.num_kv_heads, splits, device=plan.kv_lens.device)
    # hnd: each layer's K / V copied head-major within a page, made once, outside the timing
    hnd = {i: [kv_stream.to_hnd(t, pool.page_size) for t in pool.slots_view(i)] for i in range(pool.num_layers)} \
        if mode == "hnd" else {}

    def launch(layer):
        k, v = hnd[layer] if hnd else pool.slots_view(layer)
        kv_stream.stream_kv(k, v, sums, plan.kv_indptr, plan.kv_indices, plan.kv_lens, page_size=pool.page_size,
                            num_splits=splits, block_n=block_n, num_warps=p.num_warps, num_stages=p.num_stages,
                            mode=mode)
        if then is not None:
            then()

    launch(0)
    k, v = pool.slots_view(0)  # hnd: the same values as the pool's
    kv_stream.check_sums(sums, kv_stream.expected_sums(k, v, plan.kv_indptr, plan.kv_indices, plan.kv_lens,
                                                       pool.page_size, contiguous=mode == "contig"), plan.kv_lens, k, v)
    return _Launches(launch, sums)


# the launch settings each row is captured under: (column name, PDL on, decode KV prefetch tiles)
SETTINGS = (("PDL off", False, decode.KV_PREFETCH_TILES), ("PDL on", True, decode.KV_PREFETCH_TILES),
            ("PDL on, KV prefetch off", True, 0))


def arms(model: str, context: int, page_size: int, reps: int, iters: int,
         stream_splits: tuple[int, ...] = (), layers: int | None = None,
         stream_modes: tuple[str, ...] = ()) -> tuple[dict[str, Timer], int]:
    """Every row's timer for one shape under every SETTINGS column: ({"<row> | <column>": Timer}, the decode's split
    count). The decode's output must be the same bits under each (PDL and the prefetch move no sum)."""
    from attnlab.backends.triton import TritonBackend

    pool, meta, q, num_layers = build(model, 1, context, 1, page_size, torch.bfloat16, layers=layers)
    _, hkv, _ = HEADS[model]
    timers, outs = {}, []
    for column, on, tiles in SETTINGS:
        with pdl.using(on, "cuda"), decode.kv_prefetching(tiles):  # graphs record how their kernels were launched
            be = make_backend(TritonBackend, pool, meta, q, model)
            rows, splits = _rows(be, q, hkv, context, stream_splits, stream_modes)
            for name, runner in rows.items():
                t = timers[f"{name} | {column}"] = Timer(runner, q, num_layers, True, reps, iters)
                if t.graph is None:  # eager timing would run outside this column's settings
                    raise RuntimeError(f"{model} x {context}, {name} ({column}): graph capture failed: {t.graph_error}")
            outs.append(be.run(q, 0).clone())
    if any(not torch.equal(o, outs[0]) for o in outs):
        raise RuntimeError(f"{model} x {context}: the decode's output differs between {[c for c, *_ in SETTINGS]}")
    return timers, splits


def floor_line(model: str, ctx: int, med: dict[str, float], splits: int) -> str:
    """The issue-16 floor row of one shape: the target, the best decode, its empty launches, and the fastest read
    of its K / V by a stream row (us, and TB/s: MB / us) from ``med`` ({"<row> | <column>": median us})."""
    target = BEFORE_US[model] / 1.5
    best = min(med[f"decode | {c}"] for c, *_ in SETTINGS)
    floor2 = med.get("empty x2, decode + merge grids | PDL on", med["empty, decode grid | PDL on"])
    _, hkv, d = HEADS[model]
    mb = 2 * ctx * hkv * d * 2 / 1e6  # bf16 K and V of the request
    # the plan's bytes in the pool's layout: not contig's other slots, not hnd's head-major copy
    reads = {k: v for k, v in med.items()
             if k.startswith("stream K / V") and "merge" not in k and "contig" not in k and "hnd" not in k}
    fast = min(reads, key=reads.get)
    return (f"| {model} | {ctx} | issue 16 floor: <= {target:.2f} us (2026-12-01: {BEFORE_US[model]} us / 1.5); best "
            f"decode {best:.2f} us ({splits} splits); its empty launches alone {floor2:.2f} us; the fastest read "
            f"of its {mb:.1f} MB of K / V {reads[fast]:.2f} us ({fast}: {mb / reads[fast]:.2f} TB/s) |"
            + " |" * (2 * len(SETTINGS)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.launch_floor",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,llama8b")
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reps", type=int, default=200, help="runs per graph replay")
    ap.add_argument("--iters", type=int, default=20, help="replays per measurement (their median)")
    ap.add_argument("--stream-splits", default="",
                    help="more split counts for the stream row (comma list, e.g. 8,16,64): the decode's K / V read "
                         "with other partitions (a count giving a partition already timed is skipped)")
    ap.add_argument("--stream-modes", default="",
                    help="more load modes for the stream rows (comma list of pages, contig, rows, hnd): the decode "
                         "grid's bytes in one tensor-descriptor box per page (TMA on Hopper), or as if the request's "
                         "pages were consecutive (a reference with no page table), or every kv head of a token in "
                         "one program, or from a head-major copy of the pool (attnlab.bench.kv_stream)")
    ap.add_argument("--layers", type=int, default=None,
                    help="layers the runs walk (default: bench.kernels' walk, at most 8: at SmolLM2 shapes 25 MB, "
                         "inside an H100's L2; 64 there walks 200 MB)")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in HEADS]
    if bad:
        ap.error(f"--models: unknown {bad} (choose from {', '.join(HEADS)})")
    if min(a.repeats, a.reps, a.iters) < 1:
        ap.error("--repeats, --reps and --iters must be >= 1")
    if a.layers is not None and not 1 <= a.layers <= 256:
        ap.error(f"--layers {a.layers}: 1..256")
    try:
        stream_splits = tuple(dict.fromkeys(int(n) for n in a.stream_splits.split(",") if n.strip()))
    except ValueError:
        ap.error(f"--stream-splits {a.stream_splits!r}: a comma list of ints")
    if any(not 1 <= n <= 1024 for n in stream_splits):
        ap.error(f"--stream-splits {a.stream_splits!r}: each in 1..1024")
    stream_modes = tuple(dict.fromkeys(m.strip() for m in a.stream_modes.split(",") if m.strip()))
    bad = [m for m in stream_modes if m not in kv_stream.MODES]
    if bad:
        ap.error(f"--stream-modes: unknown {bad} (choose from {', '.join(kv_stream.MODES)})")
    why = pdl.unsupported("cuda")
    if why:
        print(f"attnlab.bench.launch_floor: {why}")
        return 2
    contexts = [int(c) for c in a.contexts.split(",") if c.strip()]
    gpu = torch.cuda.get_device_name()
    res = {"gpu": gpu, "versions": versions(), "repeats": a.repeats, "layers": a.layers, "rows": []}
    lines = [(f"{gpu}; {res['versions']}; batch 1, bf16, page {a.page_size}, CUDA-graph replay of back-to-back runs "
              f"over {a.layers or 'the default walk of'} layers; median of {a.repeats} measurements (spread max - "
              f"min); ratio: to the decode of the same column"), "",
             "| model | context | row | " + " | ".join(f"{c}: us | ratio" for c, *_ in SETTINGS) + " |",
             "|---|---|---|" + "---|---|" * len(SETTINGS)]
    print(lines[0], flush=True)
    for model in models:
        for ctx in contexts:
            timers, splits = arms(model, ctx, a.page_size, a.reps, a.iters, stream_splits, a.layers, stream_modes)
            samples = {k: [] for k in timers}
            for _ in range(a.repeats):  # interleaved: drift hits every row alike
                for k, t in timers.items():
                    samples[k].append(t.measure() * 1e3)
            med = {k: statistics.median(v) for k, v in samples.items()}
            spread = {k: (max(v) - min(v)) / med[k] * 100 for k, v in samples.items()}
            for name in dict.fromkeys(k.split(" | ")[0] for k in timers):
                cells = []
                for column, on, tiles in SETTINGS:
                    k = f"{name} | {column}"
                    cells.append(f"{med[k]:.2f} ±{spread[k]:.0f}% | {med[k] / med[f'decode | {column}']:.2f}x")
                    res["rows"].append({"model": model, "context": ctx, "row": name, "pdl": on, "kv_prefetch": tiles,
                                        "splits": splits, "us": samples[k], "median_us": med[k]})
                lines.append(f"| {model} | {ctx} | {name} | {' | '.join(cells)} |")
                print(lines[-1], flush=True)
            if ctx == 4096 and model in BEFORE_US:
                lines.append(floor_line(model, ctx, med, splits))
                print(lines[-1], flush=True)
    write_report(a.out, res, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
