"""The on-time share's exact interval: known values, and 0 misses is not 0% misses."""

import pytest

from vlarun.sched.records import clopper_pearson, summarise


@pytest.mark.parametrize(
    "k,n,lo,hi",
    [
        (30, 30, 0.025 ** (1 / 30), 1.0),  # all on time: the lower bound solves p^n = 2.5%
        (0, 10, 0.0, 1 - 0.025 ** (1 / 10)),
        (5, 10, 0.187086, 0.812914),  # the textbook value
    ],
)
def test_known_intervals(k, n, lo, hi):
    got = clopper_pearson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-5)


def test_the_summary_bounds_the_miss_rate():
    rows = [
        {
            "latency_ms": 10.0,
            "energy_j": 1.0,
            "slo_met": True,
            "fallback": None,
            "ran": "vision@robot",
        }
        for _ in range(28)
    ]
    lo, hi = summarise(rows, 4)["slo_met_ci95"]
    assert hi == 1.0 and 0.87 < lo < 0.88  # 0 misses in 28 bound the miss rate at ~12%
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)
