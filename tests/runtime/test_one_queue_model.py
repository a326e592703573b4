"""One queue model: the edge's own forecast and admission (``StageQueues``), the scale-out
front's per-worker estimate and the fleet simulator's edge all say the same thing about one
scripted queue: which stage of which robot runs when, and when a new request would finish."""

from __future__ import annotations

import time

import pytest

from vlarun.runtime.edge.queues import Job, StageQueues
from vlarun.runtime.edge.server import robot_id
from vlarun.runtime.scaleout.worker_pool import Flight, Worker
from vlarun.sched.bookings import Booking
from vlarun.sched.queue_model import StageTimes, play
from vlarun.world.fleet import Arrival, SimEdge

STAGES = ("vision", "prefill", "decode")
EST = {"vision": 0.01, "prefill": 0.02, "decode": 0.03}
MAX_BATCH = 2
# (robot, stages still to run, seconds from now to its deadline), all queued now. Later
# arrivals are due earlier, and two want the same first stage: EDF across the queues' heads
# and batches of two both show.
SCRIPT = (
    (b"r1", STAGES, 0.9),
    (b"r2", ("decode",), 0.2),
    (b"r3", ("prefill", "decode"), 0.5),
    (b"r4", STAGES, 0.6),
)
ASK = (STAGES, 0.4)  # a new request: where would it finish?


def _rows(slots, now: float) -> list[tuple]:
    return [
        (
            s.origin,
            s.stage,
            round(s.start - now, 9),
            round(s.end - now, 9),
            round(s.deadline - now, 9),
        )
        for s in slots
    ]


def _edge(now: float) -> tuple[list[tuple], float]:
    """The edge: ``StageQueues`` holding the script's requests."""
    q = StageQueues({s: () for s in STAGES}, max_batch=MAX_BATCH)
    q.est_s = dict(EST)
    for k, (who, stages, due) in enumerate(SCRIPT):
        q.put(
            Job(
                identity=who,
                rid=k,
                stages=stages,
                want=("actions",),
                pool={},
                arrival=now,
                deadline=now + due,
                origin=who,
            )
        )
    slots = q.forecast(now, name=robot_id)
    return _rows(slots, now), q.finish(now, ASK[0], now + ASK[1]) - now


def _front(now: float) -> tuple[list[tuple], float]:
    """The scale-out front's view of one worker holding the script's requests in flight."""
    w = Worker(0, times=StageTimes(dict(EST)), max_batch=MAX_BATCH)
    for k, (who, stages, due) in enumerate(SCRIPT):
        w.flights[k] = Flight(who, k, [], stages, "full", now, now + due, None)
    return _rows(play(w.queue(now)), now), w.finish(now, ASK[0], now + ASK[1]) - now


def _fleet(now: float) -> tuple[list[tuple], float]:
    """The fleet simulator's edge, every scripted request arriving now, run batch by batch."""
    edge = SimEdge(max_batch=MAX_BATCH)
    for who, stages, due in SCRIPT:
        a = Arrival(now, now + due, stages, tuple(EST[s] for s in stages))
        assert edge.admit(a, robot_id(who), who)
    ask = edge.finish(Arrival(now, now + ASK[1], ASK[0], tuple(EST[s] for s in ASK[0]))) - now
    slots = []
    while (t := edge.next_at()) is not None:
        slots += [slot for _, slot in edge.run(t)]
    return _rows(slots, now), ask


def test_the_edge_the_front_and_the_fleet_simulator_forecast_one_queue_alike():
    now = time.monotonic()
    edge, front, fleet = _edge(now), _front(now), _fleet(now)
    assert edge == front == fleet
    slots, ask = edge
    # The worker's rule, worked by hand: decode's head r2 (due 0.2) first; then prefill's head
    # r3 (0.5) before vision's head r1 (0.9), and r3's decode (0.5) again before it; vision
    # then batches r4 and r1, earliest deadline first (2 x 10 ms), and so on, back to back.
    r = {who: robot_id(who) for who, *_ in SCRIPT}
    assert [row[:4] for row in slots] == [
        (r[b"r2"], "decode", 0.0, 0.03),
        (r[b"r3"], "prefill", 0.03, 0.05),
        (r[b"r3"], "decode", 0.05, 0.08),
        (r[b"r4"], "vision", 0.08, 0.1),
        (r[b"r1"], "vision", 0.08, 0.1),
        (r[b"r4"], "prefill", 0.1, 0.14),
        (r[b"r1"], "prefill", 0.1, 0.14),
        (r[b"r4"], "decode", 0.14, 0.2),
        (r[b"r1"], "decode", 0.14, 0.2),
    ]
    # The new request (due 0.4) takes r1's place in each batch of two: it ends with r4.
    assert ask == pytest.approx(0.2)


# (robot, stages, seconds from now it arrives, seconds from now it is due): plans booked now,
# their requests not arrived yet (the one reservation mechanism, ``queue_model.Ledger``).
BOOKED = (
    (b"b1", STAGES, 0.05, 0.9),
    (b"b2", ("prefill", "decode"), 0.0, 0.3),
    (b"b3", STAGES, 0.05, 0.4),
)


def test_the_edge_the_front_and_the_fleet_simulator_forecast_booked_plans_alike():
    """Bookings reach the next plan the same way on a real edge, behind a scale-out front (one
    worker) and on a simulated edge: held in a ledger, played forward by the one queue model
    at the measured stage times, and claimed when their request arrives."""
    from vlarun.runtime.edge.core import ServerConfig
    from vlarun.runtime.scaleout.worker_pool import WorkerPool

    now = time.monotonic()
    q = StageQueues({s: () for s in STAGES}, max_batch=MAX_BATCH)
    q.est_s = dict(EST)
    pool = WorkerPool(1, STAGES, ServerConfig(max_batch=MAX_BATCH))
    (worker,) = pool.workers
    worker.up, worker.times = True, StageTimes(dict(EST))
    sim = SimEdge(max_batch=MAX_BATCH)
    sim.times = StageTimes(dict(EST))
    for who, stages, arrive, due in BOOKED:
        assert q.book(Booking(stages, now + arrive, now + due, who), now)
        assert pool.book(Booking(stages, now + arrive, now + due, who), now, per_robot=16)
        sim.book((Booking(stages, now + arrive, now + due),), robot_id(who), now)
    edge_rows = _rows(q.forecast(now, name=robot_id), now)
    assert edge_rows == _rows(sim.forecast(now), now) == _rows(play(worker.queue(now)), now)
    assert {row[0] for row in edge_rows} == {robot_id(w) for w, *_ in BOOKED}
    # b2 arrives: every ledger lets its booking go, and the forecasts still agree.
    assert q.claim(b"b2", ("prefill", "decode"), now)
    assert pool.claim(b"b2", ("prefill", "decode"), now)
    assert sim.ledger.claim(robot_id(b"b2"), ("prefill", "decode"), now)
    left = _rows(q.forecast(now, name=robot_id), now)
    assert left == _rows(sim.forecast(now), now) == _rows(play(worker.queue(now)), now)
    assert robot_id(b"b2") not in {row[0] for row in left}
