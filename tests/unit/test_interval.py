"""attnlab.metrics.interval: the order-statistic interval of a median, and a floor's verdict."""

import math
import random

import pytest

from attnlab.metrics.interval import floor_verdict, median_interval


def test_small_samples_take_min_max_with_their_coverage():
    lo, hi, cov = median_interval([1.6, 1.2, 1.87, 1.55, 1.58])
    assert (lo, hi) == (1.2, 1.87) and cov == pytest.approx(1 - 2 / 32)  # 93.75% < 95%: the best five can do
    assert median_interval([3.0]) == (3.0, 3.0, 0.0)
    assert all(math.isnan(x) for x in median_interval([]))


def test_larger_samples_narrow_to_the_asked_coverage():
    vals = list(range(1, 11))  # n = 10: [x_(2), x_(9)] covers 97.9%, [x_(3), x_(8)] only 89.1%
    lo, hi, cov = median_interval(vals, 0.95)
    assert (lo, hi) == (2, 9) and cov == pytest.approx(1 - 2 * 11 / 1024)
    lo, hi, cov = median_interval(vals, 0.80)
    assert (lo, hi) == (3, 8) and cov == pytest.approx(1 - 2 * 56 / 1024)
    with pytest.raises(ValueError, match="coverage"):
        median_interval(vals, 1.0)


def test_the_interval_covers_the_median_as_often_as_it_says():
    """Empirical coverage over many samples of a skewed distribution (exponential, median ln 2) is at least the
    stated one."""
    rng = random.Random(7)
    for n in (6, 15, 40):
        hits, stated = 0, None
        for _ in range(2000):
            lo, hi, stated = median_interval([rng.expovariate(1.0) for _ in range(n)], 0.9)
            hits += lo <= math.log(2) <= hi
        assert hits / 2000 >= stated - 0.03 and stated >= 0.9


def test_floor_verdicts():
    assert floor_verdict(1.52, 1.9, 1.5) == "met"
    assert floor_verdict(1.3, 1.49, 1.5) == "missed"
    assert floor_verdict(1.33, 1.82, 1.5) == "undecided"
    assert floor_verdict(math.nan, 2.0, 1.5) == "undecided"
