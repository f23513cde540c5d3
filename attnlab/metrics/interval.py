"""How sure a median is: a distribution-free confidence interval from order statistics, and a floor's verdict.

A speedup measured in rounds (bench.spec: each round times target-only and the speculative row back to back) is a
sample of per-round ratios whose spread on an H200 at batch 1 is wide (1.20-1.87x over 5 rounds). Its median alone
cannot say whether a floor like 1.5x is met: the interval says whether the rounds decide it. For n values, sorted,
[x_(j), x_(n+1-j)] covers the median with probability 1 - 2 P(Binomial(n, 1/2) < j), whatever the distribution;
the narrowest such interval with at least the asked coverage is taken. Five values reach 93.75% only as [min, max];
95% needs six, and ten give [x_(2), x_(9)] at 97.9%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _coverage(n: int, j: int) -> float:
    """1 - 2 P(Bin(n, 1/2) <= j - 1): the coverage of [x_(j), x_(n+1-j)] (1-based order statistics)."""
    tail = sum(math.comb(n, i) for i in range(j)) / 2 ** n
    return 1.0 - 2.0 * tail


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage) of the median of ``values``: the narrowest order-statistic interval whose coverage is
    >= level, or, with too few values for that, [min, max] and its coverage (< level). NaNs for no values."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}: a coverage in (0, 1)")
    v = sorted(float(x) for x in values)
    n = len(v)
    if n == 0:
        return math.nan, math.nan, math.nan
    if n == 1:
        return v[0], v[0], 0.0
    j = 1
    while j + 1 <= (n + 1) // 2 and _coverage(n, j + 1) >= level:
        j += 1
    return v[j - 1], v[n - j], _coverage(n, j)


def floor_verdict(low: float, high: float, floor: float) -> str:
    """"met" when the interval lies at or above ``floor``, "missed" when below it, else "undecided"."""
    if math.isnan(low) or math.isnan(high):
        return "undecided"
    if low >= floor:
        return "met"
    return "missed" if high < floor else "undecided"
