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
    assert one["late"] > 0  # forecasts use measured averages; a 0.3 s draw overruns them
    assert two["served_per_s"] > 1.3 * one["served_per_s"]


def test_the_projection_and_the_front_share_one_dispatch_rule():
    """Issue 46: the projection replayed the front's dispatch with a rule of its own (fewest
    flights), without stream affinity; both now call ``dispatch_order``. Issue 63: it also
    forecast each worker with a copy of the pool's forecast (``predicted``, without the lag
    or the freshness check); it now asks the front's own pool, and the core's admission rule
    (``edge_core.admissible``) decides for the front, the edge and the projection alike."""
    import inspect

    from vlarun.bench import scaleout as projection
    from vlarun.runtime.edge.core import EdgeCore
    from vlarun.runtime.scaleout.front import dispatch_order
    from vlarun.runtime.scaleout.worker_pool import WorkerPool

    assert dispatch_order({0: 1.0, 1: 0.5}, None, 2.0) == [1, 0]
    assert dispatch_order({0: 1.0, 1: 0.5}, 0, 2.0) == [0, 1]  # its stream's worker, in time
    assert dispatch_order({0: 3.0, 1: 0.5}, 0, 2.0) == [1, 0]  # not when that one is late
    assert "dispatch_order(" in inspect.getsource(WorkerPool.quotes)  # the front's order
    source = inspect.getsource(projection.simulate)
    assert "WorkerPool(" in source and "pool.quotes(" in source  # the front's own forecast
    for rule in (projection.simulate, EdgeCore.place):
        assert "admissible(" in inspect.getsource(rule)


def test_admission_refuses_on_a_fresh_late_forecast_only():
    """The core's rule over quotes in dispatch order: up to the first fresh late one; a late
    forecast made of stale stage times is no reason to refuse."""
    from vlarun.runtime.edge.core import Quote, admissible

    early, stale_late, fresh_late = Quote(0, 0.5, True), Quote(1, 2.0, False), Quote(2, 3.0, True)
    assert admissible((early, stale_late, fresh_late), 1.0) == (early, stale_late)
    assert admissible((stale_late, fresh_late), 1.0) == (stale_late,)
    assert admissible((fresh_late, early), 1.0) == ()
