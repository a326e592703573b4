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


def test_the_projection_and_the_front_share_one_dispatch_rule():
    """Issue 46: the projection replayed the front's dispatch with a rule of its own (fewest
    flights), without stream affinity; both now call ``dispatch_order``."""
    import inspect

    from vlarun.bench import scaleout as projection
    from vlarun.runtime.scaleout import dispatch_order
    from vlarun.runtime.worker_pool import WorkerPool

    assert dispatch_order({0: 1.0, 1: 0.5}, None, 2.0) == [1, 0]
    assert dispatch_order({0: 1.0, 1: 0.5}, 0, 2.0) == [0, 1]  # its stream's worker, in time
    assert dispatch_order({0: 3.0, 1: 0.5}, 0, 2.0) == [1, 0]  # not when that one is late
    for module in (projection.simulate, WorkerPool.quotes):  # the front's order: its pool's
        assert "dispatch_order(" in inspect.getsource(module)
