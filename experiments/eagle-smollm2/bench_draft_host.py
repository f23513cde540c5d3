"""Host time of one speculative iteration's draft-side bookkeeping (EAGLE, chain, greedy), per call.

    python experiments/eagle-smollm2/bench_draft_host.py [--backend triton] [--batch 1] [--k 4,6] [--iters 300]

On the H200 (experiments/h200-2026-12-01d) the draft phase of an EAGLE iteration took 0.61 ms at k = 4 and
0.92 ms at k = 6 (fused ops, CUDA graphs). The GPU work in it is k - 1 one-layer head steps, each a small
fraction of the 1.0-1.2 ms 30-layer target step. This script times only the host side of the phases:
- the draft-extend's truncate + prepare + plan;
- the k - 1 draft steps' prepare_steps + plan_steps, which run before the graph replay (host-planned steps);
- what device-planned steps (triton, engine/multistep.py) need instead: runner.prepare_device_steps.
It does so without a GPU. The backend's plan runs on the CPU (Triton's plan builds its tensors there;
TRITON_INTERPRET=1 lets it load without CUDA), so a per-call figure far above the GPU work says the phase
waits on the host. The SmolLM2-135M shapes use random weights, and the head config is the shipped head's.
Prints the median and p90 in microseconds per call, over --iters iterations of a growing context.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from attnlab.backends.base import Mode
from attnlab.engine.build import SideSpec, build_side
from attnlab.engine.eagle_side import build_eagle_side
from attnlab.plan import ModelSource, frozen_mapping


def side(backend: str, batch: int, k: int, graphs: bool):
    model = ModelSource("smollm2-135m", None, "random", 0, frozen_mapping({}))
    spec = SideSpec(model, backend, "fp32", "fp32", page_size=16, max_context=2048, max_batch=batch, device="cpu",
                    name="target", max_q_len=k + 1)
    target = build_side(spec, progress=False)
    draft_spec = SideSpec(model, backend, "fp32", "fp32", page_size=16, max_context=2048, max_batch=batch,
                          device="cpu", name="draft", max_q_len=k + 1)
    draft = build_eagle_side(target, None, "smollm2-135m", draft_spec, check=False)
    if graphs:  # plans become graph-safe (fixed buffers rewritten in place), as under engine.cuda_graph
        draft.backend.cuda_graph = True
    return draft


def time_iterations(r, batch: int, k: int, iters: int, prompt: int = 200) -> dict[str, list[float]]:
    reqs = list(range(batch))
    p = r.prepare(reqs, [0] * batch, [prompt] * batch, Mode.PREFILL)
    r.plan(p)
    n = prompt + 1
    out: dict[str, list[float]] = {"extend (truncate + prepare + plan)": [], "draft steps (prepare_steps + plan_steps)": [],
                                   "draft steps, device-planned (prepare_device_steps)": []}
    for _ in range(iters):
        t0 = time.perf_counter()
        for q in reqs:
            if r.kv_len(q) > n - 1:
                r.truncate(q, n - 1)
        p = r.prepare(reqs, [n - 1] * batch, [k + 1] * batch, Mode.VERIFY)
        r.plan(p)
        t1 = time.perf_counter()
        steps = r.prepare_steps(reqs, [n - 1] * batch, k - 1)
        r.plan_steps(steps)
        t2 = time.perf_counter()
        # what a device-planned graph replay needs from the host (triton): the pages and one staged buffer
        r.prepare_device_steps(reqs, [n - 1] * batch, k - 1, pad_to=batch)
        t3 = time.perf_counter()
        out["extend (truncate + prepare + plan)"].append((t1 - t0) * 1e6)
        out["draft steps (prepare_steps + plan_steps)"].append((t2 - t1) * 1e6)
        out["draft steps, device-planned (prepare_device_steps)"].append((t3 - t2) * 1e6)
        n += 2  # tau ~2: the context grows by about two tokens an iteration
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--k", default="4,6")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--no-graphs", dest="graphs", action="store_false")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, backend {a.backend}, batch {a.batch}, graph-safe plans {a.graphs}, "
          f"{a.iters} iterations (the first 20 dropped); host us per call: median (p90)")
    print("| k | phase | median us | p90 us |\n|---|---|---|---|")
    for k in (int(x) for x in a.k.split(",")):
        r = side(a.backend, a.batch, k, a.graphs)
        for name, xs in time_iterations(r, a.batch, k, a.iters + 20).items():
            xs = sorted(xs[20:])
            print(f"| {k} | {name} | {statistics.median(xs):.0f} | {xs[int(0.9 * len(xs))]:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
