"""The scale-out projection (bench.scaleout.simulate) runs the front's dispatch on the edge's
one queue model: the front's forecast of a worker and the worker's service are the same rule,
so with service times the forecast knows exactly, nothing it admits is late."""

from __future__ import annotations

import pytest

from vlarun.bench.scaleout import simulate


@pytest.mark.parametrize("workers, max_batch", [(1, 1), (2, 1), (3, 4)])
def test_exact_service_times_admit_nothing_late(workers, max_batch):
    r = simulate(workers, 12 * workers, 1.0, 0.35, [0.1], 60.0, seed=3, max_batch=max_batch)
    assert r["late"] == 0
    assert r["refused"] > 0 and r["ok"] > 0  # loaded past what it can serve in time


def test_spread_service_times_can_be_late_and_more_workers_serve_more():
    spread = [0.05, 0.1, 0.3]
    one = simulate(1, 10, 1.0, 0.35, spread, 60.0, seed=1)
    two = simulate(2, 10, 1.0, 0.35, spread, 60.0, seed=1)
    assert one["late"] > 0  # the forecast uses the mean; a 0.3 s draw overruns it
    assert two["served_per_s"] > 1.3 * one["served_per_s"]
