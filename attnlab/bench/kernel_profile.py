"""Where a row's device time goes: every kernel of one more (untimed) run of its prompts, per decode iteration.

``python -m attnlab.bench.spec --kernel-profile N`` runs each attnlab row's prompts once more after its group's timed
rounds under the torch profiler (CUPTI on CUDA) and prints, per row, the kernel time per iteration (one draft + verify
round; a target-only row's iteration is one decode step) by role (attention, split merge, GEMM, ..., as
``bench.profile``) and its N costliest kernels. Two verify backends' rows side by side say whether a difference in
their ``verify`` phase is the attention kernel, the work around it (a plan's device copies, a page table built per
pass) or the time between kernels: the kernel sum against the phase time of the timed rounds. The profiler's own
overhead lengthens the run, not the kernels' device time. On CPU the table lists the ops' own CPU time instead.
Under the tables: each attention kernel's launch shapes (grid, block, dynamic shared memory, from the profiler's
trace), so one kernel's launch can be compared between the engine and ``bench.kernels --launches``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlab.bench.profile import device_kernels, kernel_table, kernels_past, role_of, table_lines


def shapes_of_trace(trace: dict) -> dict[str, list[dict]]:
    """A chrome trace's kernel events (torch profiler, CUPTI) -> kernel name -> its distinct launches, most frequent
    first: [{grid, block, shared_memory, launches}]."""
    seen: dict[str, dict[tuple, int]] = {}
    for ev in trace.get("traceEvents", ()):
        if not isinstance(ev, dict) or ev.get("cat") != "kernel" or ev.get("ph") != "X":
            continue
        args = ev.get("args") or {}
        key = (tuple(args.get("grid") or ()), tuple(args.get("block") or ()), args.get("shared memory"))
        by = seen.setdefault(ev.get("name", "?"), {})
        by[key] = by.get(key, 0) + 1
    return {name: [{"grid": list(g), "block": list(b), "shared_memory": smem, "launches": n}
                   for (g, b, smem), n in sorted(by.items(), key=lambda kv: -kv[1])] for name, by in seen.items()}


def launch_shapes(prof) -> dict[str, list[dict]]:
    """The launch shapes of every CUDA kernel a finished torch profile recorded (shapes_of_trace of its trace)."""
    import json
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return shapes_of_trace(json.load(f))


def launch_lines(shapes: dict[str, list[dict]], names) -> list[str]:
    """A markdown table of the launch shapes of ``names`` (those in ``shapes``); [] where none."""
    rows = [f"| {name[:70]} | {l['grid']} | {l['block']} | {l['shared_memory']} | {l['launches']} |"
            for name in names for l in shapes.get(name, ())]
    if not rows:
        return []
    return ["| kernel | grid | block | shared memory (bytes) | launches |", "|---|---|---|---|---|", *rows]


def _profiled(run: Callable[[], int], cuda: bool, device: torch.device) -> tuple[int, dict, dict]:
    """-> (the iterations ``run`` returned, device_kernels of its profile, launch_shapes (CUDA; {} on CPU))."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        iterations = run()
        if cuda:
            torch.cuda.synchronize(device)
    return iterations, device_kernels(prof, cuda), (launch_shapes(prof) if cuda else {})


def kernel_profile(run: Callable[[int], int], new: int, device: torch.device, top: int) -> tuple[str, dict | None]:
    """Profile ``run(new)`` and ``run(1)`` (each returns the decode iterations it ran; one token is the prefills and
    the first tokens) -> (markdown: the per-iteration kernel time of the difference by role and its ``top`` kernels,
    most time first; the same as a dict for the JSON, None where the run decoded no iteration past its prefills)."""
    cuda = device.type == "cuda"
    iterations, full, shapes = _profiled(lambda: run(new), cuda, device)
    base_iterations, base, _ = _profiled(lambda: run(1), cuda, device)
    iterations -= base_iterations
    if iterations < 1:
        return "no decode iteration past the prefills (every prompt stopped at its first token): nothing to profile", None
    kernels = kernels_past(full, base)
    rows = kernel_table([(name, c, us) for name, (c, us) in kernels.items()], iterations)
    busy = sum(r["us_per_step"] for r in rows)
    launches = sum(r["launches_per_step"] for r in rows)
    ranked = sorted(((name, c / iterations, us / iterations) for name, (c, us) in kernels.items()),
                    key=lambda k: -k[2])[:top]
    what = "kernel" if cuda else "CPU op"
    lines = [(f"{iterations} iterations (the prefills' kernels subtracted): {busy:.1f} us of {what} time per "
              f"iteration in {launches:.1f} launches"),
             "", "| role | launches / iteration | us / iteration | share | us / launch |", "|---|---|---|---|---|",
             *table_lines(rows), "", f"| {what} (the {len(ranked)} costliest) | launches / iteration | us / iteration |",
             "|---|---|---|", *(f"| {name[:90]} | {n:.1f} | {us:.2f} |" for name, n, us in ranked)]
    attention = sorted(name for name in kernels if role_of(name) == "attention")
    launches_md = launch_lines(shapes, attention)
    if launches_md:
        lines += ["", "attention kernels' launches (the profiled run, its prefills included):", "", *launches_md]
    return "\n".join(lines), {"launches": {name: shapes[name] for name in attention if name in shapes},
                              "iterations": iterations, "us_per_iteration": busy, "launches_per_iteration": launches,
                              "roles": [{k: v for k, v in r.items() if k != "kernels"} for r in rows],
                              "top": [{"name": n, "launches_per_iteration": c, "us_per_iteration": us}
                                      for n, c, us in ranked]}
