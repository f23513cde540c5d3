"""Small-M GEMMs side by side: cuBLAS (``F.linear``) vs attnlab's Triton GEMM (attnlab.kernels.gemm), bf16
and fp8 weights, per layer GEMM of real model shapes, with a row-invariance check.

    python -m attnlab.bench.gemm [--models llama8b,llama1b,smollm2] [--ms 1,2,4,8,16] [--quick] [--repeats 3]
        [--split-modes fill/pass,lean/ticket] [--out FILE.json]
    python -m attnlab.bench.gemm --interpret     # CPU, TRITON_INTERPRET=1, tiny shapes: a CI smoke

Cells: model, GEMM (qkv, o, gate_up, down, lm_head: N x K), M; cuBLAS us and attnlab us (median over the
repeats, +- spread = (max - min) / median), ratio = cuBLAS / attnlab (> 1: attnlab faster), each's share of
copy bandwidth (weight + x + out bytes / time / device-to-device copy bandwidth), fp8w us (attnlab with e4m3
weights and per-row scales) and its speedup over cuBLAS bf16, and ``inv``: whether rows of M = 1 equal, bit
for bit, the same rows inside M = 5, 9, 16, for attnlab and for cuBLAS.

``--split-modes``: attnlab (bf16 and fp8w) is timed in each arm (``attnlab.kernels.gemm.arm``: a split mode of
engine.gemm_split, optionally a K loop, ``+k<BK>s<S>w<W>`` or a role's ``+qkv.k<BK>s<S>w<W>``); the first is the
``attnlab`` and ``fp8w`` columns, the others two extra columns each (their rows are checked for invariance too). Each
GEMM runs as its role (qkv, o, gate_up, down, lm_head), so it takes the K loop a decode step gives it.

Time: CUDA events around a CUDA graph that replays ``reps`` calls, each on its own copy of the weights (enough
copies that the walk is > 4x the L2, so weights come from HBM as in a real step); the median of ``iters``
replays is one measurement, repeated ``--repeats`` times with cuBLAS / attnlab / fp8 interleaved.
Under --interpret everything runs eagerly on CPU (times are the interpreter's and mean nothing; the
correctness and invariance columns are real).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

MODELS = {"llama8b": "llama-3.1-8b", "llama1b": "llama-3.2-1b", "smollm2": "smollm2-135m", "tiny": "tiny-llama"}
GEMMS = ("qkv", "o", "gate_up", "down", "lm_head")
MS = [1, 2, 4, 8, 16]
QUICK_MS = [1, 4, 16]
INVARIANCE_MS = (5, 9, 16)
WALK_BYTES = 256 << 20  # > 4x the H200's 50 MB L2
MAX_COPIES = 64


def shapes(model: str) -> list[tuple[str, int, int]]:
    """(gemm, N, K) of one layer (and the LM head) of a preset."""
    from attnlab.models.presets import get_preset

    c = get_preset(MODELS.get(model, model)).config()
    return [("qkv", c.q_size + 2 * c.kv_size, c.hidden_size), ("o", c.hidden_size, c.q_size),
            ("gate_up", 2 * c.intermediate_size, c.hidden_size), ("down", c.hidden_size, c.intermediate_size),
            ("lm_head", c.vocab_size, c.hidden_size)]


def row_invariant(fn, x16) -> bool:
    """fn(x[:1]) per row r equals row r of fn(x[:m]) for m in 5, 9, 16 (first and last row)."""
    for m in INVARIANCE_MS:
        full = fn(x16[:m])
        for r in (0, m - 1):
            if not (full[r:r + 1] == fn(x16[r:r + 1])).all():
                return False
    return True


def in_mode(fn, split: str | None = None, pdl_on: bool = False, device: str = "cuda"):
    """fn(i) run under the GEMM arm ``split`` (``gemm.arm``: a split mode, optionally +pf<chunks>; None: the current
    mode and prefetch) and PDL on / off: what a bench times (and captures) per arm, the process-wide switches
    restored after each call."""
    import contextlib

    from attnlab.kernels import gemm, pdl

    def run(i):
        with pdl.using(pdl_on, device if pdl_on else None), gemm.arm(split) if split else contextlib.nullcontext():
            return fn(i)
    return run


def check_target(interpret: bool, models_text: str, bench: str) -> tuple[str, list[str]]:
    """(device, models) of a GEMM bench: the interpreter's tiny model on CPU, else CUDA and presets of MODELS;
    ValueError says what is wrong."""
    import torch

    device = "cpu" if interpret else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{bench} needs CUDA (or --interpret on CPU)")
    models = ["tiny"] if interpret else [s for s in models_text.split(",") if s]
    unknown = [s for s in models if s not in MODELS]
    if unknown or not models:
        raise ValueError(f"--models {','.join(unknown)}: choose from {', '.join(MODELS)}")
    return device, models


class GraphTimer:
    """``reps`` calls of fn(i) (i = weight copy) captured in one CUDA graph; measure() -> median us per call."""

    def __init__(self, fn, copies: int, reps: int, iters: int):
        import torch

        from attnlab.engine.graphs import record_graph

        self.iters, self.reps = iters, reps
        self.graph, _ = record_graph(lambda: [fn(i % copies) for i in range(reps)], warmups=1)
        self.graph.replay()
        torch.cuda.synchronize()

    def measure(self) -> float:
        from attnlab.bench.kernels import event_median_ms

        return event_median_ms(self.graph.replay, self.iters) * 1e3 / self.reps


class EagerTimer:
    def __init__(self, fn, copies: int, reps: int, iters: int):
        self.fn, self.copies, self.iters = fn, copies, iters

    def measure(self) -> float:
        times = []
        for i in range(self.iters):
            t0 = time.perf_counter()
            self.fn(i % self.copies)
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


def cell(model, name, n, k, m, args, device, copy_gb_s) -> dict:
    import torch
    import torch.nn.functional as F

    from attnlab.kernels import gemm
    from attnlab.models.fp8 import quantize_rows

    dt = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(n * 31 + k)
    w_bytes = n * k * 2
    copies = 1 if device == "cpu" else max(1, min(MAX_COPIES, WALK_BYTES // w_bytes))
    ws = [(torch.randn(n, k, device=device, generator=g) / k**0.5).to(dt) for _ in range(copies)]
    w8s = [quantize_rows(w) for w in ws]  # (e4m3 [N, K], fp32 [N, 1])
    x16 = torch.randn(max(16, m), k, device=device, generator=g).to(dt)
    x = x16[:m].clone()
    row = {"model": model, "gemm": name, "n": n, "k": k, "m": m}
    ref = F.linear(x.float(), ws[0].float())
    modes = args.split_modes
    role = name if name in gemm.ROLES else None  # the GEMM's role picks its K loop, as in a decode step

    def bf16(xx, i):
        return gemm.linear(xx, ws[i], role=role)

    def fp8(xx, i):
        return gemm.linear(xx, w8s[i][0], w_scale=w8s[i][1].view(-1), role=role)

    fns = {"cublas": lambda i: F.linear(x, ws[i]),
           "attnlab": in_mode(lambda i: bf16(x, i), modes[0]),
           "fp8w": in_mode(lambda i: fp8(x, i), modes[0]),
           **{f"split {mode}": in_mode(lambda i: bf16(x, i), mode) for mode in modes[1:]},
           **{f"fp8w {mode}": in_mode(lambda i: fp8(x, i), mode) for mode in modes[1:]}}
    row["arm_errors"] = {}
    for key in [k for k in fns if k.startswith(("split ", "fp8w "))]:
        try:  # an arm whose loop this GPU cannot run (its shared memory): that column says so, the others go on
            fns[key](0)
        except Exception as e:  # noqa: BLE001
            row["arm_errors"][key] = f"{type(e).__name__}: {str(e)[:120]}"
            del fns[key]
    row["max_err_attnlab"] = (fns["attnlab"](0).float() - ref).abs().max().item()
    row["max_err_fp8w"] = (fns["fp8w"](0).float() - x.float() @ (w8s[0][0].float() * w8s[0][1]).t()).abs().max().item()
    runs = [(mode, f) for i, mode in enumerate(modes) for key, f in (("split", bf16), ("fp8w", fp8))
            if i == 0 or f"{key} {mode}" in fns]
    row["inv_attnlab"] = all(row_invariant(in_mode(lambda xx, f=f: f(xx, 0), mode), x16) for mode, f in runs)
    row["inv_cublas"] = row_invariant(lambda xx: F.linear(xx, ws[0]), x16)
    timer = GraphTimer if device == "cuda" else EagerTimer
    timers = {key: timer(fn, copies, args.reps, args.iters) for key, fn in fns.items()}
    samples = {key: [] for key in fns}
    for _ in range(args.repeats):  # interleaved: drift hits all three alike
        for key, t in timers.items():
            samples[key].append(t.measure())
    row["split_us"], row["fp8w_split_us"] = {}, {}
    for key, s in samples.items():
        med = statistics.median(s)
        if key.startswith(("split ", "fp8w ")):
            table = row["split_us"] if key.startswith("split ") else row["fp8w_split_us"]
            table[key.split(" ", 1)[1]] = {"us": med, "spread": (max(s) - min(s)) / med if med else 0.0}
            continue
        row[f"{key}_us"] = med
        row[f"{key}_spread"] = (max(s) - min(s)) / med if med else 0.0
        nbytes = (n * k * (1 if key == "fp8w" else 2) + (n * 4 if key == "fp8w" else 0) + m * (k + n) * 2)
        row[f"{key}_bw"] = nbytes / (med * 1e-6) / 1e9 / copy_gb_s if copy_gb_s else None
    row["ratio"] = row["cublas_us"] / row["attnlab_us"]
    row["fp8w_speedup"] = row["cublas_us"] / row["fp8w_us"]
    return row


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def markdown(rows: list[dict], modes: list[str] | None = None) -> str:
    """The table; with ``modes`` (split modes) the attnlab column is the first mode's and each further mode has a
    column ``us (cuBLAS / it)``."""
    modes = modes or [None]
    extra = "".join(f" {m} us (ratio) |" for m in modes[1:])
    extra8 = "".join(f" fp8w {m} us (vs bf16) |" for m in modes[1:])
    head = (f"| model | gemm | N x K | M | cuBLAS us | attnlab{f' {modes[0]}' if modes[0] else ''} us | ratio |{extra} "
            f"BW cuBLAS | BW attnlab | fp8w us | fp8w vs bf16 |{extra8} inv attnlab | inv cuBLAS |")
    lines = [head, "|" + "---|" * (13 + 2 * (len(modes) - 1))]
    for r in rows:
        cols = "".join(f" {r['split_us'][m]['us']:.1f} ±{100 * r['split_us'][m]['spread']:.0f}% "
                       f"({r['cublas_us'] / r['split_us'][m]['us']:.2f}x) |" if m in r["split_us"] else " error |"
                       for m in modes[1:])
        cols8 = "".join(f" {r['fp8w_split_us'][m]['us']:.1f} ({r['cublas_us'] / r['fp8w_split_us'][m]['us']:.2f}x) |"
                        if m in r["fp8w_split_us"] else " error |" for m in modes[1:])
        lines.append(
            f"| {r['model']} | {r['gemm']} | {r['n']} x {r['k']} | {r['m']} | {r['cublas_us']:.1f} "
            f"±{100 * r['cublas_spread']:.0f}% | {r['attnlab_us']:.1f} ±{100 * r['attnlab_spread']:.0f}% | "
            f"{r['ratio']:.2f}x |{cols} {_pct(r['cublas_bw'])} | {_pct(r['attnlab_bw'])} | {r['fp8w_us']:.1f} | "
            f"{r['fp8w_speedup']:.2f}x |{cols8} {'yes' if r['inv_attnlab'] else 'NO'} | "
            f"{'yes' if r['inv_cublas'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.gemm",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama8b,llama1b,smollm2", help=f"of {', '.join(MODELS)}")
    ap.add_argument("--gemms", default=",".join(GEMMS))
    ap.add_argument("--ms", default=None, help="rows per GEMM (default 1,2,4,8,16; --quick 1,4,16)")
    ap.add_argument("--quick", action="store_true", help="M 1,4,16, 2 repeats: under a minute on an H200")
    ap.add_argument("--interpret", action="store_true", help="CPU, Triton interpreter, tiny shapes (a smoke)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--split-modes", default=None, help="attnlab's split modes to time (engine.gemm_split; default: "
                                                        "the default mode)")
    ap.add_argument("--out", default=None, help="also write the rows and versions as JSON here")
    a = ap.parse_args(argv)
    if a.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before the first import of a @triton.jit module
    from attnlab.bench.kernels import copy_bandwidth_gb_s, versions

    try:
        device, models = check_target(a.interpret, a.models, "bench.gemm")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ms = [int(s) for s in a.ms.split(",")] if a.ms else ([1, 4] if a.interpret else QUICK_MS if a.quick else MS)
    if any(m < 1 or m > 16 for m in ms):
        print("error: --ms: rows 1..16 (the small-M GEMM's range)", file=sys.stderr)
        return 2
    a.repeats = a.repeats or (1 if a.interpret else 2 if a.quick else 3)
    from attnlab.kernels import gemm

    try:
        a.split_modes = gemm.parse_split_modes(a.split_modes or gemm.DEFAULT_SPLIT_MODE)
    except ValueError as e:
        print(f"error: --split-modes: {e}", file=sys.stderr)
        return 2
    a.reps, a.iters = (1, 1) if a.interpret else (20, 10 if a.quick else 20)
    gemms = [s for s in a.gemms.split(",") if s]
    copy_gb_s = copy_bandwidth_gb_s() if device == "cuda" else None
    info = versions()
    print(f"# bench.gemm on {info.get('gpu') or 'CPU (interpreter)'}: torch {info['torch']}, triton "
          f"{info.get('triton')}, CUDA {info.get('cuda')}; copy bandwidth "
          f"{f'{copy_gb_s:.0f} GB/s' if copy_gb_s else '-'}; {a.repeats} repeats")
    rows = []
    t0 = time.perf_counter()
    for model in models:
        for name, n, k in shapes(model):
            if name not in gemms:
                continue
            for m in ms:
                rows.append(cell(model, name, n, k, m, a, device, copy_gb_s))
                print(f"  {model} {name} M={m}: cuBLAS {rows[-1]['cublas_us']:.1f} us, attnlab "
                      f"{rows[-1]['attnlab_us']:.1f} us", file=sys.stderr, flush=True)
    print(markdown(rows, a.split_modes))
    errors = {(key, err) for r in rows for key, err in r["arm_errors"].items()}
    for key, err in sorted(errors):
        print(f"arm {key!r} failed (its cells say error): {err}")
    print(f"\n{len(rows)} cells in {time.perf_counter() - t0:.0f} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"versions": info, "copy_gb_s": copy_gb_s, "rows": rows}, f, indent=1)
    return 0 if all(r["inv_attnlab"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
