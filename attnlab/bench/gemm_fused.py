"""The gemm path's four layer GEMMs as the decoder launches them (prologue and epilogue fused), in each split
mode, beside cuBLAS ``F.linear`` alone.

    python -m attnlab.bench.gemm_fused [--models smollm2,llama1b,llama8b] [--ms 1,5]
        [--splits fill/pass,fill/ticket,lean/ticket] [--pdl] [--repeats 3] [--out FILE.json]
    python -m attnlab.bench.gemm_fused --interpret     # CPU, TRITON_INTERPRET=1, the tiny model: a CI smoke

Calls (attnlab.models.gemm_path.layer_forward), the norms where the arm puts them (``gemm.norm_place``): ``qkv``
RoPE epilogue + the KV store into a pool (+normpro: and the RMSNorm prologue); ``o`` residual epilogue (+normtail: and
the next norm in its tail); ``gate_up`` SiLU-mul epilogue (+normpro: the RMSNorm prologue); ``down`` residual epilogue
(+normtail: the next norm; +normauto, the default: the tail for narrow streams). ``layer`` is the four in a row, with
the two add_rmsnorm launches before qkv and gate_up where the norms are their own launches: what a layer's GEMMs and norms cost, less attention.
Arms: ``gemm.arm`` texts (split modes, loops, norm places).

Time: as bench.gemm (a CUDA graph of ``reps`` calls over weight copies walking > 4x the L2; the median of
``iters`` replays; repeats interleaved over the arms), per call; ``--pdl`` captures with engine.pdl on, so a
call's launch overlaps the previous one's tail as in a decode step. Each arm's outputs are checked against the
first arm's, outputs and KV-pool contents (the same bits where only the reduction differs, pass vs ticket;
across split policies within 2 bf16 ulps plus 0.01: fp32 sums in another order can flip a rounding), and for row
invariance (M = 1 rows inside M = ``max(ms)``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

CALLS = ("qkv", "o", "gate_up", "down")
DEFAULT_SPLITS = "fill/pass,fill/ticket,lean/ticket"


def layer_calls(model: str, device: str, m_max: int, copies_for):
    """-> (config, {call: fn(i, x_rows) -> tensor}, {call: cuBLAS fn(i, x_rows)}, {call: input x [m_max, K]},
    the KV pool [2, slots, kv_heads, head_dim] the qkv call stores into) for one layer of a preset, with
    ``copies_for(bytes)`` weight copies per GEMM."""
    import torch
    import torch.nn.functional as F

    from attnlab.bench.gemm import MODELS
    from attnlab.kernels import fused as fused_ops
    from attnlab.kernels import gemm
    from attnlab.models import rope
    from attnlab.models.presets import get_preset

    c = get_preset(MODELS.get(model, model)).config()
    dt = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(7)
    d, q, kv, h, inter = c.head_dim, c.q_size, c.kv_size, c.hidden_size, c.intermediate_size

    def weights(n, k):
        return [(torch.randn(n, k, device=device, generator=g) / k**0.5).to(dt) for _ in range(copies_for(n * k * 2))]

    wq, wo, wgu, wd = weights(q + 2 * kv, h), weights(h, q), weights(2 * inter, h), weights(h, inter)
    nw = (torch.rand(h, device=device, generator=g) + 0.5).to(dt)
    cos, sin = rope.cos_sin(torch.arange(m_max, device=device) + 100, rope.inv_freq(d, 10000.0).to(device), dt)
    pool = torch.zeros(2, 4 * m_max, c.num_kv_heads, d, device=device, dtype=dt)
    slots = torch.arange(m_max, device=device) * 2
    xs = {"qkv": torch.randn(m_max, h, device=device, generator=g).to(dt),
          "o": torch.randn(m_max, q, device=device, generator=g).to(dt),
          "gate_up": torch.randn(m_max, h, device=device, generator=g).to(dt),
          "down": torch.randn(m_max, inter, device=device, generator=g).to(dt)}
    res = torch.randn(m_max, h, device=device, generator=g).to(dt)

    pro = lambda: {"norm_weight": nw} if gemm.norm_prologue() else {}  # read at call time: the arm's norm place
    tail = lambda: {"tail_norm": (nw, 1e-6)} if gemm.norm_tail(h) else {}  # h: the stream's width
    fused = {
        "qkv": lambda i, x: gemm.gemm(x, wq[i % len(wq)], **pro(), epilogue="rope", cos=cos[:len(x)],
                                      sin=sin[:len(x)], head_dim=d, rope_cols=q + kv,
                                      kv_store=(pool[0], pool[1], slots[:len(x)]), role="qkv"),
        "o": lambda i, x: gemm.gemm(x, wo[i % len(wo)], epilogue="residual", residual=res[:len(x)], role="o", **tail()),
        "gate_up": lambda i, x: gemm.gemm(x, wgu[i % len(wgu)], **pro(), epilogue="silu_mul", role="gate_up"),
        "down": lambda i, x: gemm.gemm(x, wd[i % len(wd)], epilogue="residual", residual=res[:len(x)], role="down",
                                       **tail()),
        "norm": lambda i, x: fused_ops.add_rmsnorm(x, None, nw, 1e-6)[0],  # +normsep's launch before qkv / gate_up
    }  # each as its role: the K loop the decoder's gemm path gives it

    cublas = {"qkv": lambda i, x: F.linear(x, wq[i % len(wq)]), "o": lambda i, x: F.linear(x, wo[i % len(wo)]),
              "gate_up": lambda i, x: F.linear(x, wgu[i % len(wgu)]), "down": lambda i, x: F.linear(x, wd[i % len(wd)])}
    return c, fused, cublas, xs, pool


def parse_splits(text: str) -> list[str]:
    from attnlab.kernels import gemm

    try:
        return gemm.parse_split_modes(text)
    except ValueError as e:
        raise ValueError(f"--splits: {e}") from None


def bench_model(model, arms, ms, a, device) -> list[dict]:
    import torch

    from attnlab.bench.gemm import MAX_COPIES, WALK_BYTES, EagerTimer, GraphTimer, in_mode
    from attnlab.kernels import gemm

    copies_for = (lambda b: 1) if device == "cpu" else (lambda b: max(1, min(MAX_COPIES, WALK_BYTES // b)))
    m_max = max(ms)
    _, fused, cublas, xs, pool = layer_calls(model, device, m_max, copies_for)
    timer_cls = GraphTimer if device == "cuda" else EagerTimer
    rows = []
    for m in ms:
        fns = {("cuBLAS", c): in_mode(lambda i, c=c, m=m: cublas[c](i, xs[c][:m]), device=device) for c in CALLS}
        outs = {}
        for arm in arms:
            for c in CALLS:
                fns[(arm, c)] = in_mode(lambda i, c=c, m=m: fused[c](i, xs[c][:m]), arm, a.pdl, device)
            fns[(arm, "layer")] = in_mode(lambda i, m=m: _layer(fused, xs, i, m), arm, a.pdl, device)
            with gemm.arm(arm):  # correctness: the outputs and the pool, and rows of M = 1 inside M = m_max
                pool.zero_()
                outs[arm] = {c: fused[c](0, xs[c][:m]) for c in CALLS}
                outs[arm]["pool"] = pool.clone()
                full = {c: fused[c](0, xs[c]) for c in CALLS}
                one = {c: fused[c](0, xs[c][:1]) for c in CALLS}
            outs[arm]["invariant"] = all(_equal(_rows(full[c], 1), one[c]) for c in CALLS)
        timers = {key: timer_cls(fn, MAX_COPIES, a.reps, a.iters) for key, fn in fns.items()}
        samples = {key: [] for key in fns}
        for _ in range(a.repeats):
            for key, t in timers.items():
                samples[key].append(t.measure())
        first = arms[0]
        for arm_key in ["cuBLAS", *arms]:
            row = {"model": model, "m": m, "arm": arm_key}
            for c in (*CALLS, "layer") if arm_key != "cuBLAS" else CALLS:
                s = samples[(arm_key, c)]
                med = statistics.median(s)
                row[f"{c}_us"], row[f"{c}_spread"] = med, (max(s) - min(s)) / med if med else 0.0
            if arm_key == "cuBLAS":
                row["layer_us"] = sum(row[f"{c}_us"] for c in CALLS)  # four launches, timed one by one
            else:
                ref = outs[first]
                exact = gemm.sums_key(gemm.parse_arm(arm_key)) == gemm.sums_key(gemm.parse_arm(first))
                # the same sums at every call site (gemm.sums_key): only the reduction differs
                pro = (gemm.parse_arm(arm_key).norm_place == "pro") == (gemm.parse_arm(first).norm_place == "pro")
                row["same_as_first"] = all(  # the stream only where one arm has a tail norm and the other none; qkv
                    torch.equal(a, b) if exact else  # and gate_up (and so the pool) only where both or neither
                    torch.allclose(a.float(), b.float(), atol=1e-2, rtol=2 * 2.0**-8)  # normalize their input
                    for c in (*CALLS, "pool") if pro or c in ("o", "down")
                    for a, b in zip(_parts(outs[arm_key][c]), _parts(ref[c])))
                row["invariant"] = outs[arm_key]["invariant"]
            rows.append(row)
    return rows


def _layer(fused, xs, i, m):
    """The layer's four GEMMs in a row, with the two norm launches (before qkv and gate_up) where they are their own."""
    from attnlab.kernels import gemm

    sep = not gemm.norm_prologue() and not gemm.norm_tail(xs["qkv"].shape[1])  # the norms as their own launches
    outs = []
    for c in CALLS:
        if sep and c in ("qkv", "gate_up"):
            outs.append(fused["norm"](i, xs[c][:m]))
        outs.append(fused[c](i, xs[c][:m]))
    return outs


def _parts(out) -> tuple:
    """A call's output tensors: (stream, tail norm) for a residual GEMM with a tail norm, else (out,)."""
    return tuple(out) if isinstance(out, tuple) else (out,)


def _rows(out, n: int):
    return tuple(t[:n] for t in out) if isinstance(out, tuple) else out[:n]


def _equal(a, b) -> bool:
    import torch

    return all(torch.equal(x, y) for x, y in zip(_parts(a), _parts(b), strict=True))


def markdown(rows: list[dict]) -> str:
    lines = [("| model | M | arm | qkv us | o us | gate_up us | down us | layer us | vs cuBLAS (sum of four) | "
              "matches the first arm | rows invariant |"), "|" + "---|" * 11]
    base = {(r["model"], r["m"]): r["layer_us"] for r in rows if r["arm"] == "cuBLAS"}
    for r in rows:
        cells = " | ".join(f"{r[f'{c}_us']:.1f}" for c in CALLS)
        vs = f"{base[(r['model'], r['m'])] / r['layer_us']:.2f}x"
        same = "-" if r["arm"] == "cuBLAS" else "yes" if r["same_as_first"] else "NO"
        inv = "-" if r["arm"] == "cuBLAS" else "yes" if r["invariant"] else "NO"
        lines.append(f"| {r['model']} | {r['m']} | {r['arm']} | {cells} | {r['layer_us']:.1f} | {vs} | {same} | "
                     f"{inv} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnlab.bench.gemm_fused",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,llama1b,llama8b")
    ap.add_argument("--ms", default="1,5")
    ap.add_argument("--splits", default=DEFAULT_SPLITS)
    ap.add_argument("--pdl", action="store_true", help="capture with engine.pdl on (CUDA, sm_90+)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interpret", action="store_true", help="CPU, Triton interpreter, the tiny model (a smoke)")
    ap.add_argument("--out", default=None, help="also write the rows and versions as JSON here")
    a = ap.parse_args(argv)
    if a.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before the first import of a @triton.jit module
    from attnlab.bench.gemm import check_target
    from attnlab.bench.kernels import versions

    try:
        arms = parse_splits(a.splits)
        ms = [int(s) for s in a.ms.split(",") if s]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not ms or any(m < 1 or m > 16 for m in ms) or a.repeats < 1:
        print("error: --ms: rows 1..16 (the small-M GEMM's range); --repeats >= 1", file=sys.stderr)
        return 2
    try:
        device, models = check_target(a.interpret, a.models, "bench.gemm_fused")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.pdl:
        from attnlab.kernels import pdl

        why = pdl.unsupported(device)
        if why:
            print(f"error: --pdl: {why}", file=sys.stderr)
            return 2
    a.repeats = 1 if a.interpret else a.repeats
    a.reps, a.iters = (1, 1) if a.interpret else (20, 20)
    info = versions()
    print(f"# bench.gemm_fused on {info.get('gpu') or 'CPU (interpreter)'}: torch {info['torch']}, triton "
          f"{info.get('triton')}, CUDA {info.get('cuda')}; PDL {'on' if a.pdl else 'off'}; {a.repeats} repeats; "
          f"us per call (layer: the four calls)", flush=True)
    t0 = time.perf_counter()
    rows = []
    for model in models:
        rows += bench_model(model, arms, ms, a, device)
        print(markdown([r for r in rows if r["model"] == model]).split("\n", 2)[2], file=sys.stderr, flush=True)
    print(markdown(rows))
    print(f"\n{len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"versions": info, "pdl": a.pdl, "rows": rows}, f, indent=1)
    ok = all(r.get("same_as_first", True) and r.get("invariant", True) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
