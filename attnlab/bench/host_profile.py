"""Where a drafter's host time goes: cProfile switched on only inside its ``propose`` and ``extend`` calls.

``python -m attnlab.bench.spec --host-profile N`` runs every speculative row's prompts once more after its timed
rounds (untimed) under this profiler and prints the N functions with the most own time, per row. A whole-process
profile says nothing about the draft loop (model loading dominates it); this one sees the host half of the two draft
phases only, so two draft backends' tables can be set side by side. The profiler's own overhead inflates every
Python call alike: compare rows, not absolute times.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable

PHASES = ("propose", "extend", "propose_tree", "extend_tree")  # a chain's draft phases, then a tree's


def drafter_profile(drafter, run: Callable[[], None], top: int) -> str:
    """Run ``run()`` with the profiler on inside ``drafter``'s PHASES methods; -> the ``top`` functions by cumulative
    time (which of attnlab's steps cost) and by own time (where it is spent), pstats' tables, after the calls and the
    time profiled per call."""
    prof = cProfile.Profile()
    calls, hits = [0], set()

    def wrap(fn):
        def profiled(*args, **kwargs):
            calls[0] += 1
            hits.add(fn.__name__)
            prof.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                prof.disable()
        return profiled

    wrapped = [name for name in PHASES if hasattr(drafter, name)]
    try:
        for name in wrapped:  # instance attributes shadow the class's methods until deleted
            setattr(drafter, name, wrap(getattr(drafter, name)))
        run()
    finally:
        for name in wrapped:
            if name in vars(drafter):
                delattr(drafter, name)
    if not calls[0]:
        return f"no calls of {', '.join(wrapped) or 'a draft phase'}: nothing to profile\n"
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    for key in ("cumulative", "tottime"):
        out.write(f"-- by {key} time\n")
        stats.sort_stats(key).print_stats(top)
    per_call = stats.total_tt / calls[0] * 1e3
    called = [name for name in wrapped if name in hits]
    return f"{calls[0]} calls of {', '.join(called)}: {per_call:.3f} ms each under the profiler\n{out.getvalue()}"
