"""Repeated timed runs -> one metrics dict: medians, the spread of the timings, and a noisy flag.

Pure functions over the ``summarize`` dicts of each repeat (spec and target-only, interleaved and run under
identical conditions). Every numeric key is the median over the repeats; the timings in SPREAD_KEYS also get
``_min``, ``_max``, ``_spread`` (max / min) and ``_repeats`` (the values, in run order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attnlab.metrics.perf import percentile

# the timings a reader compares across jobs; noisy when one of them spreads more than bench.noisy_ratio
SPREAD_KEYS = ("output_tokens_per_s", "iteration_ms", "target_only_tokens_per_s", "target_only_iteration_ms",
               "speedup_vs_target_only")


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def median_of_runs(runs: Sequence[dict]) -> dict:
    """Per key: the median over the runs of a numeric value (NaNs ignored), else the first run's value."""
    out: dict = {}
    for key in runs[0]:
        vals = [r.get(key) for r in runs]
        if all(_is_num(v) for v in vals):
            finite = [float(v) for v in vals if not math.isnan(v)]
            med = percentile(finite, 50) if finite else math.nan
            out[key] = int(med) if all(isinstance(v, int) for v in vals) and med == int(med) else med
        else:
            out[key] = vals[0]
    return out


def spread(values: Sequence[float]) -> dict[str, float | list]:
    """median, min, max, max / min (None for one value or when min <= 0) and the values themselves."""
    v = [float(x) for x in values]
    lo, hi = min(v), max(v)
    ratio = (hi / lo if lo > 0 else None) if len(v) > 1 else None  # one run: no spread to tell
    return {"": percentile(v, 50), "_min": lo, "_max": hi, "_spread": ratio, "_repeats": v}


def repeat_metrics(spec_runs: Sequence[dict], base_runs: Sequence[dict], noisy_ratio: float) -> dict:
    """metrics.json keys from the repeats' summaries. ``base_runs``: the target-only runs, one per spec run,
    or empty (draft=none: the run is target-only decoding, no speedup). speedup_vs_target_only is the median of
    the per-repeat ratios (each spec run over the target-only run right after it)."""
    m = median_of_runs(spec_runs)
    series = {"output_tokens_per_s": [r["output_tokens_per_s"] for r in spec_runs],
              "iteration_ms": [r["iteration_ms"] for r in spec_runs]}
    if base_runs:
        series["target_only_tokens_per_s"] = [r["output_tokens_per_s"] for r in base_runs]
        series["target_only_iteration_ms"] = [r["iteration_ms"] for r in base_runs]
        series["speedup_vs_target_only"] = [s["output_tokens_per_s"] / b["output_tokens_per_s"]
                                            if b["output_tokens_per_s"] else math.nan
                                            for s, b in zip(spec_runs, base_runs)]
    noisy = []
    for key, vals in series.items():
        if any(not _is_num(v) or math.isnan(v) for v in vals):
            m[key] = math.nan
            continue
        for suffix, value in spread(vals).items():
            m[key + suffix] = value
        if len(vals) > 1 and (m[key + "_spread"] is None or m[key + "_spread"] > noisy_ratio):
            noisy.append(key)
    m["bench_repeats"] = len(spec_runs)
    m["noisy"] = bool(noisy) if len(spec_runs) > 1 else None  # one run: no spread to judge
    m["noisy_keys"] = noisy
    m["noisy_ratio"] = noisy_ratio
    return m
