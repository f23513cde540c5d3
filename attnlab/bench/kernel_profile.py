"""Where a row's device time goes: every kernel of one more (untimed) run of its prompts, per decode iteration.

``python -m attnlab.bench.spec --kernel-profile N`` runs each attnlab row's prompts once more after its group's timed
rounds under the torch profiler (CUPTI on CUDA) and prints, per row, the kernel time per iteration (one draft + verify
round; a target-only row's iteration is one decode step) by role (attention, split merge, GEMM, ..., as
``bench.profile``) and its N costliest kernels. Two verify backends' rows side by side say whether a difference in
their ``verify`` phase is the attention kernel, the work around it (a plan's device copies, a page table built per
pass) or the time between kernels: the kernel sum against the phase time of the timed rounds. The profiler's own
overhead lengthens the run, not the kernels' device time. On CPU the table lists the ops' own CPU time instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlab.bench.profile import device_kernels, kernel_table, table_lines


def _profiled(run: Callable[[], int], cuda: bool, device: torch.device) -> tuple[int, dict[str, tuple[int, float]]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        iterations = run()
        if cuda:
            torch.cuda.synchronize(device)
    return iterations, device_kernels(prof, cuda)


def kernel_profile(run: Callable[[int], int], new: int, device: torch.device, top: int) -> tuple[str, dict | None]:
    """Profile ``run(new)`` and ``run(1)`` (each returns the decode iterations it ran; one token is the prefills and
    the first tokens) -> (markdown: the per-iteration kernel time of the difference by role and its ``top`` kernels,
    most time first; the same as a dict for the JSON, None where the run decoded no iteration past its prefills)."""
    cuda = device.type == "cuda"
    iterations, full = _profiled(lambda: run(new), cuda, device)
    base_iterations, base = _profiled(lambda: run(1), cuda, device)
    iterations -= base_iterations
    if iterations < 1:
        return "no decode iteration past the prefills (every prompt stopped at its first token): nothing to profile", None
    kernels = {}
    for name, (c, us) in full.items():
        c0, us0 = base.get(name, (0, 0.0))
        if c > c0:
            kernels[name] = (c - c0, max(0.0, us - us0))
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
    return "\n".join(lines), {"iterations": iterations, "us_per_iteration": busy, "launches_per_iteration": launches,
                              "roles": [{k: v for k, v in r.items() if k != "kernels"} for r in rows],
                              "top": [{"name": n, "launches_per_iteration": c, "us_per_iteration": us}
                                      for n, c, us in ranked]}
