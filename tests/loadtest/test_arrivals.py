"""Arrival process: seeded Poisson mean rate, gamma burstiness, infinite rate, pacing."""
import itertools
import math
import random
import statistics

import pytest

from loadtest.arrivals import intervals, paced


def _gaps(rate, burstiness, n=20000, seed=7):
    return list(itertools.islice(intervals(rate, burstiness, random.Random(seed)), n))


def test_poisson_gaps_have_the_requested_mean_rate_and_unit_cv():
    gaps = _gaps(rate=5.0, burstiness=1.0)
    assert 1 / statistics.mean(gaps) == pytest.approx(5.0, rel=0.03)
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(1.0, rel=0.05)  # exponential gaps


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_keeps_the_mean_and_sets_cv(burstiness):
    gaps = _gaps(rate=10.0, burstiness=burstiness)
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.05)
    cv = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_same_seed_same_arrivals_other_seed_differs():
    assert _gaps(3.0, 1.0, n=50, seed=1) == _gaps(3.0, 1.0, n=50, seed=1)
    assert _gaps(3.0, 1.0, n=50, seed=1) != _gaps(3.0, 1.0, n=50, seed=2)


def test_infinite_rate_sends_everything_at_once():
    assert _gaps(math.inf, 1.0, n=10) == [0.0] * 10


@pytest.mark.parametrize("rate,burstiness", [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_bad_rate_or_burstiness_is_refused(rate, burstiness):
    with pytest.raises(ValueError):
        next(intervals(rate, burstiness, random.Random(0)))


async def test_paced_yields_every_item_in_order():
    got = [item async for item in paced(list("abcde"), 500.0, 1.0, random.Random(0))]
    assert got == list("abcde")
