"""Attention kernels side by side: time, achieved KV bandwidth and its fraction of copy bandwidth.

    python -m attnlab.bench.kernels [--backends torch,triton,flashinfer,fa] [--phases decode,verify,prefill]
                                    [--quick] [--page-size 16] [--out FILE]

Every backend runs through the common interface (registry -> plan(meta) -> run(q, layer)) on the same
paged pool (shuffled pages). Time: CUDA events around ``reps`` back-to-back runs (replayed from a CUDA
graph where the backend supports graphs for the mode, as an engine would run them), median of ``iters``
samples after warmup; successive runs walk over enough layers that the KV read is not L2-resident.
Bandwidth counts K+V bytes read (every request's whole context) plus q and o. A backend that fails a
shape gets an error cell; an unavailable backend is skipped with its reason. CUDA only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field

import torch

from attnlab.backends.base import Mode
from attnlab.backends.cases import random_paged_case
from attnlab.backends.registry import require_available

HEADS = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # (q heads, kv heads, head_dim)
PHASES = {"decode": [0], "verify": [4, 8], "prefill": [None]}  # k draft tokens (q_len k+1); None = prefill
CONTEXTS = [512, 2048, 8192, 32768]
BATCHES = [1, 8, 32, 64]
QUICK_CONTEXTS, QUICK_BATCHES = [4096], [1, 16]
MAX_POOL_BYTES = 24 << 30  # skip shapes whose KV is larger than this
MIN_WALK_BYTES = 256 << 20  # enough layers that consecutive runs read > 4x the L2
MAX_PREFILL_TOKENS = 64 * 1024  # batch * context for prefill
TORCH_MAX_SCORE_BYTES = 8 << 30  # the reference materializes fp32 scores per request


@dataclass
class Cell:
    phase: str
    model: str
    batch: int
    context: int
    q_len: int
    backend: str
    ms: float | None = None
    kv_gb_s: float | None = None
    frac_copy: float | None = None
    tflops: float | None = None
    status: str = "ok"
    extra: dict = field(default_factory=dict)


def copy_bandwidth_gb_s(nbytes: int = 2 << 30, iters: int = 10) -> float:
    """Device-to-device copy_ of a large tensor: (read + write) bytes / median time."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    times = []
    for i in range(iters + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(times) / 1e9


def build(model: str, batch: int, context: int, q_len: int, page_size: int, dtype, seed: int = 0):
    """A pool (several layers to walk over) holding ``batch`` requests of ``context`` tokens, the last
    ``q_len`` of which are this pass's new tokens; returns (pool, meta, q, num_layers)."""
    hq, hkv, d = HEADS[model]
    elem = torch.tensor([], dtype=dtype).element_size()
    layer_bytes = 2 * batch * context * hkv * d * elem
    num_layers = max(1, min(8, -(-MIN_WALK_BYTES // max(1, layer_bytes))))
    mode = Mode.DECODE if q_len == 1 else Mode.PREFILL if q_len == context else Mode.VERIFY
    pool, meta, q = random_paged_case(kv_lens=[context] * batch, q_lens=[q_len] * batch, page_size=page_size,
                                      num_q_heads=hq, num_kv_heads=hkv, head_dim=d, dtype=dtype, device="cuda",
                                      mode=mode, num_layers=num_layers, seed=seed, spare_pages=0)
    return pool, meta, q, num_layers


def time_backend(cls, pool, meta, q, num_layers, model, iters: int, reps: int) -> tuple[float, bool]:
    """Median ms per run; CUDA-graph replay of ``reps`` runs where the backend declares graph support for
    this mode (what an engine does; takes launch overhead out), else eager. Returns (ms, graphed)."""
    hq, hkv, d = HEADS[model]
    be = cls(pool, hq, hkv, d, d ** -0.5, q.dtype)
    be.plan(meta)
    for layer in range(num_layers):  # warmup (JIT, autotune, caches)
        out = be.run(q, layer)
    if not torch.isfinite(out.float()).all():
        raise RuntimeError("non-finite output")
    torch.cuda.synchronize()
    graph = None
    if meta.mode in cls.capabilities().cuda_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for r in range(reps):  # side-stream warmup as torch.cuda.graphs recommends
                    be.run(q, r % num_layers)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                for r in range(reps):
                    be.run(q, r % num_layers)
            graph.replay()
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - a backend that cannot be captured here is timed eagerly
            graph = None
            torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph is not None:
            graph.replay()
        else:
            for r in range(reps):
                be.run(q, r % num_layers)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times), graph is not None


def shapes(phases, quick: bool):
    contexts, batches = (QUICK_CONTEXTS, QUICK_BATCHES) if quick else (CONTEXTS, BATCHES)
    for phase in phases:
        for k in PHASES[phase]:
            for model in HEADS:
                for batch in batches:
                    for ctx in contexts:
                        q_len = ctx if k is None else k + 1
                        if k is None and batch * ctx > MAX_PREFILL_TOKENS:
                            continue
                        yield phase, model, batch, ctx, q_len


def load_backends(names):
    classes = {}
    for name in names:
        try:
            classes[name] = require_available(name)
        except Exception as e:  # noqa: BLE001 - any import/availability problem: skip with its reason
            print(f"skipping backend {name}: {e}", file=sys.stderr)
    return classes


def run_cell(name, cls, pool, meta, q, num_layers, phase, model, batch, ctx, q_len, page_size, dtype_name,
             iters, reps) -> Cell:
    hq, hkv, d = HEADS[model]
    cell = Cell(phase, model, batch, ctx, q_len, name)
    problems = cls.capabilities().problems(device="cuda", dtype=dtype_name, kv_dtype=dtype_name, head_dim=d,
                                           page_size=page_size, max_context=ctx)
    if problems:
        cell.status = "unsupported: " + "; ".join(problems)
        return cell
    if name == "torch" and q_len * ctx * hq * 4 > TORCH_MAX_SCORE_BYTES:
        cell.status = "skipped: reference too large"
        return cell
    try:
        cell.ms, cell.extra["cuda_graph"] = time_backend(cls, pool, meta, q, num_layers, model, iters, reps)
    except Exception as e:  # noqa: BLE001 - one failing shape is an error cell, not a crash
        cell.status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        torch.cuda.synchronize()
        return cell
    elem = q.element_size()
    kv_bytes = 2 * batch * ctx * hkv * d * elem
    qo_bytes = 2 * q.numel() * elem
    cell.kv_gb_s = (kv_bytes + qo_bytes) / (cell.ms / 1e3) / 1e9
    # causal pairs: each new token j sees ctx - q_len + j + 1 positions
    pairs = batch * (q_len * (ctx - q_len) + q_len * (q_len + 1) // 2)
    cell.tflops = 4 * pairs * hq * d / (cell.ms / 1e3) / 1e12
    return cell


def markdown(cells: list[Cell], names: list[str], copy_gb_s: float) -> str:
    rows = {}
    for c in cells:
        rows.setdefault((c.phase, c.model, c.batch, c.context, c.q_len), {})[c.backend] = c
    head = "| phase | model | batch | context | q_len | " + " | ".join(names) + " |"
    lines = [head, "|" + " --- |" * (5 + len(names))]
    for (phase, model, batch, ctx, q_len), by in rows.items():
        cols = []
        for n in names:
            c = by.get(n)
            if c is None:
                cols.append("-")
            elif c.ms is None:
                cols.append(c.status)
            else:
                mark = "" if c.extra.get("cuda_graph") else "*"
                main = f"{c.ms:.3f} ms{mark} · {c.kv_gb_s:.0f} GB/s · " \
                       f"{100 * c.frac_copy:.0f}%"
                cols.append(main + (f" · {c.tflops:.0f} TF/s" if phase == "prefill" else ""))
        lines.append(f"| {phase} | {model} | {batch} | {ctx} | {q_len} | " + " | ".join(cols) + " |")
    lines.append(f"\ncells: median time per run (* = eager launches, else CUDA-graph replay) · "
                 f"(K+V+q+o) bytes / time · fraction of copy bandwidth "
                 f"({copy_gb_s:.0f} GB/s){' · TFLOP/s' if any(c.phase == 'prefill' for c in cells) else ''}")
    return "\n".join(lines)


def versions() -> dict:
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "cuda": torch.version.cuda}
    for dist in ("triton", "flashinfer-python", "flash-attn", "flash_attn_3"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="torch,triton,flashinfer,fa")
    ap.add_argument("--phases", default="decode,verify,prefill")
    ap.add_argument("--quick", action="store_true", help="one context, two batch sizes")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="write FILE.json and FILE.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attnlab.bench.kernels needs a CUDA GPU (none found); nothing to measure", file=sys.stderr)
        return 2
    names = [n for n in args.backends.split(",") if n]
    phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    if bad:
        ap.error(f"unknown phase(s) {bad}; choose from {list(PHASES)}")
    classes = load_backends(names)
    copy_gb_s = copy_bandwidth_gb_s()
    info = versions() | {"copy_gb_s": copy_gb_s, "page_size": args.page_size, "dtype": "bf16"}
    print(" · ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    cells: list[Cell] = []
    for phase, model, batch, ctx, q_len in shapes(phases, args.quick):
        _hq, hkv, d = HEADS[model]
        if 2 * batch * ctx * hkv * d * 2 > MAX_POOL_BYTES:
            continue
        pool, meta, q, num_layers = build(model, batch, ctx, q_len, args.page_size, torch.bfloat16)
        for name, cls in classes.items():
            cell = run_cell(name, cls, pool, meta, q, num_layers, phase, model, batch, ctx, q_len,
                            args.page_size,
                            "bf16", args.iters, args.reps)
            if cell.kv_gb_s is not None:
                cell.frac_copy = cell.kv_gb_s / copy_gb_s
            cells.append(cell)
            shown = f"{cell.ms:.3f} ms {cell.kv_gb_s:.0f} GB/s" if cell.ms is not None else cell.status
            print(f"{phase:8s} {model:8s} b={batch:<3d} ctx={ctx:<6d} q={q_len:<5d} {name:10s} {shown}",
                  flush=True)
        del pool, meta, q
        torch.cuda.empty_cache()
    table = markdown(cells, list(classes), copy_gb_s)
    header = f"GPU: {info['gpu']} · " + " · ".join(f"{k} {v}" for k, v in info.items() if k != "gpu")
    print("\n" + header + "\n\n" + table)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"info": info, "cells": [asdict(c) for c in cells]}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(header + "\n\n" + table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
