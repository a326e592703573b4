"""The Ray edge workers as the edge core's backend (``edge.core.Backend``): the scale-out
front's view of each worker (the requests in flight there, the plans booked there, its stage
times as its replies report them) and the front's dispatch rule. No socket is opened or read
here: ``runtime/scaleout/front.py`` connects each worker, forwards and reads; this file predicts.

Dispatch: for each request, per live worker, when it would finish: the one queue model
(``sched.queue_model``, the worker's own rule played forward) over every request in flight
there, every booking placed there and this one, each stage at its per-request time (from the
stage times the worker's replies report, EWMA; its warm-up measurement to begin with), plus
how much later than predicted its answers have come. The core tries them earliest first (an
accelerated stream stays on the worker holding its KV cache when that one is in time too).

Bookings: a robot's announced plan is placed on the worker its request is predicted to go to
(the earliest finish, as of booking), held in that worker's ``Ledger`` and played forward with
its flights, so a robot quoted through the front sees it as it would on one edge; the request
claims it from whichever worker holds it. A lost worker's bookings move to the live ones.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

import zmq

from vlarun.runtime.edge.core import Quote, ServerConfig, robot_id
from vlarun.runtime.protocol import StageTiming
from vlarun.sched.bookings import Booking, Slot
from vlarun.sched.queue_model import (
    MAX_BOOKINGS,
    THIS,
    EdgeQueue,
    Ledger,
    Pending,
    StageTimes,
    finish,
    play,
)

MAX_AFFINITY = 4096  # (robot, stream) -> worker pairs remembered, the oldest forgotten first


def dispatch_order(finish: dict[int, float], sticky: int | None, deadline: float) -> list[int]:
    """The front's rule, as one function its projection (``bench.scaleout.simulate``) calls
    too: workers in the order of their predicted finish (each worker's forecast plus its lag),
    except that the worker holding the request's stream (its KV cache) goes first whenever it
    can still finish by the deadline."""
    order = sorted(finish, key=finish.__getitem__)
    if sticky is not None and sticky in finish and finish[sticky] <= deadline:
        order.sort(key=lambda i: i != sticky)
    return order


@dataclass
class Flight:
    """A robot request the front has sent to a worker and not yet answered."""

    identity: bytes
    rid: int  # the robot's request id
    body: list  # the robot's frames (zmq.Frame, header first), kept for a re-dispatch
    stages: tuple[str, ...]
    setting: str
    arrival: float
    deadline: float
    stream: tuple | None
    worker: int = -1
    predicted: float = 0.0  # when the front predicted the worker would answer (monotonic)
    # The robot whose share it counts against: its authenticated key
    # (``edge.core.DataRequest.holder``); empty: ``identity``.
    key: bytes = b""

    def __post_init__(self) -> None:
        if not self.key:
            self.key = self.identity


@dataclass
class Worker:
    """The front's view of one worker (touched by the I/O thread only)."""

    index: int
    sock: zmq.Socket | None = None
    monitor: zmq.Socket | None = None
    up: bool = False
    pid: int = 0
    endpoint: str = ""
    incarnation: int = 0
    times: StageTimes = field(default_factory=StageTimes)  # as the worker measures them
    flights: dict[int, Flight] = field(default_factory=dict)  # front rid -> flight
    ledger: Ledger = field(default_factory=Ledger)  # the bookings placed here
    replies: int = 0
    max_batch: int = 8  # the worker's (``ServerConfig.max_batch``): the model batches as it does
    # How much later than predicted its answers come (EWMA, >= 0): what the stage times miss
    # when the worker's machine gets busier (on a shared machine: a neighbour's restart).
    lag_s: float = 0.0

    def work_s(self, stages) -> float:
        return self.times.work_s(stages)

    def seconds(self, stages) -> tuple[float, ...]:
        """Each stage's estimated per-request time here (0 for a stage never measured)."""
        return self.times.seconds(stages)

    def load_s(self) -> float:
        """Predicted seconds of the work in flight and booked here (conservative: every flight
        counts whole, whatever part of it has run)."""
        flights = sum(self.work_s(f.stages) for f in list(self.flights.values()))
        return flights + sum(self.work_s(b.stages) for b in list(self.ledger))

    def queue(self, now: float) -> EdgeQueue:
        """The worker's queues as the front sees them, for the one queue model: every flight
        queued now for all of its stages (what has run of a request is not known here, so
        each counts whole: conservative), and every booking from when it arrives, each stage
        at the estimated per-request time."""
        q = EdgeQueue(self.max_batch, now)
        for f in list(self.flights.values()):
            q.add(
                Pending(
                    ready=now,
                    deadline=f.deadline,
                    origin=robot_id(f.key),
                    stages=f.stages,
                    seconds=self.seconds(f.stages),
                )
            )
        for p in self.ledger.pending(now, self.seconds, robot_id):
            q.add(p)
        return q

    def schedule(self, limit: int = 64) -> list[Slot]:
        """This worker's committed schedule as the front sees it (the contract of
        ``EdgeServer.schedule``): its flights and bookings played forward by its rule."""
        now = time.monotonic()
        return [s.since(now) for s in play(self.queue(now), limit)]

    def finish(
        self,
        now: float,
        stages: tuple[str, ...],
        deadline: float,
        seconds: tuple[float, ...] | None = None,
        arrive: float | None = None,
    ) -> float:
        """When a request for ``stages`` due at ``deadline``, sent now (or arriving at
        ``arrive``), would finish here (``seconds``: its stages' times, when not this
        worker's estimates)."""
        q = self.queue(now)
        own = self.seconds(stages) if seconds is None else seconds
        ready = now if arrive is None else max(arrive, now)
        q.add(
            Pending(
                ready=ready, deadline=deadline, origin=THIS, stages=stages, seconds=own, key=THIS
            )
        )
        end = finish(q, THIS)
        return now if end is None else end

    def fresh(self, stages, within_s: float, now: float) -> bool:
        return self.times.fresh_at(stages, within_s, now)

    def observe(self, timings: tuple[StageTiming, ...], now: float) -> None:
        for t in timings:
            self.times.measured(t.stage, t.compute_s, t.batch, now)


class WorkerPool:
    """The front's workers, predicted and booked for the core. The front's I/O thread changes
    them; health is read from others too (the dashboard), and reading a ledger drops its
    expired bookings, so whatever touches the ledgers holds ``lock``."""

    HOLDS = "in flight"
    COUNTERS = ("redispatched", "lost_refused", "late", "worker_down", "worker_up")

    def __init__(
        self, count: int, stages: tuple[str, ...], cfg: ServerConfig, auth_mode: str = ""
    ) -> None:
        self.stages, self.cfg, self.auth_mode = stages, cfg, auth_mode
        self.workers = [Worker(i, max_batch=cfg.max_batch) for i in range(count)]
        self.affinity: OrderedDict[tuple, int] = OrderedDict()  # (robot, stream) -> worker
        self.lock = threading.RLock()  # re-entered: a booking is placed by its quotes

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.up]

    # -- the core's backend -----------------------------------------------------------------------

    def held(self) -> int:
        return sum(len(w.flights) for w in self.workers)

    def held_by(self, key: bytes) -> int:
        return sum(f.key == key for w in self.workers for f in list(w.flights.values()))

    def quotes(
        self,
        stages: tuple[str, ...],
        deadline: float,
        now: float,
        stream: Hashable | None = None,
        arrive: float | None = None,
    ) -> list[Quote]:
        """Each live worker's predicted finish (its forecast plus its lag), in dispatch order."""
        live = self.live()
        with self.lock:
            at = {
                w.index: self._finish(w, live, stages, deadline, now, arrive) + w.lag_s
                for w in live
            }
        sticky = self.affinity.get(stream) if stream is not None else None
        fresh_s = self.cfg.admission_fresh_s
        return [
            Quote(i, at[i], self.workers[i].fresh(stages, fresh_s, now))
            for i in dispatch_order(at, sticky, deadline)
        ]

    def _finish(
        self,
        w: Worker,
        live: list[Worker],
        stages: tuple[str, ...],
        deadline: float,
        now: float,
        arrive: float | None = None,
    ) -> float:
        """When ``w`` would finish a request: the one queue model over its flights and
        bookings with the request in, its stages at ``w``'s estimates; one not refreshed for
        ``admission_fresh_s`` counts as the best live worker's: a worker once measured slow
        (a warm-up on a busy machine) still gets a request now and then, and is measured
        again, instead of being passed over for good."""
        seconds = w.seconds(stages)
        if not w.fresh(stages, self.cfg.admission_fresh_s, now):
            seconds = min([seconds, *(x.seconds(stages) for x in live)], key=sum)
        return w.finish(now, stages, deadline, seconds, arrive)

    def book(self, booking: Booking, now: float, per_robot: int) -> bool:
        """Place ``booking`` on the worker its request is predicted to go to; False (nothing
        held) when no worker is up, the pool holds ``MAX_BOOKINGS`` or the robot its share."""
        with self.lock:
            for w in self.workers:
                w.ledger.expire(now)
            held = [b for w in self.workers for b in w.ledger]
            mine = sum(b.origin == booking.origin for b in held)
            if len(held) >= MAX_BOOKINGS or mine >= per_robot:
                return False
            return self._place(booking, now)

    def _place(self, booking: Booking, now: float) -> bool:
        with self.lock:
            quotes = self.quotes(booking.stages, booking.deadline, now, arrive=booking.arrive)
            return bool(quotes) and self.workers[quotes[0].worker].ledger.book(booking, now)

    def claim(self, key: bytes, stages: tuple[str, ...], now: float) -> bool:
        """Robot ``key``'s earliest booking for the same first stage leaves whichever worker
        holds it (its request may go elsewhere: the forecast that placed it has moved on)."""
        with self.lock:
            mine = [
                (b.arrive, w.index)
                for w in self.workers
                for b in w.ledger
                if b.origin == key and b.stages[0] == stages[0]
            ]
            return bool(mine) and self.workers[min(mine)[1]].ledger.claim(key, stages, now)

    def schedule(self, limit: int = 64) -> list[Slot]:
        with self.lock:
            best = self.best()
            return best.schedule(limit) if best is not None else []

    def best(self) -> Worker | None:
        """The worker a request sent now would go to (the least loaded live one): health
        shows its queue, stage times and schedule, the capacity a robot would get."""
        live = self.live()
        return min(live, key=lambda w: w.load_s()) if live else None

    def health(self, now: float) -> dict:
        """``queue``, ``stage_ms`` and ``backlog_ms`` of the best worker (``schedule`` too,
        through the core); ``capacity`` counts live workers, ``workers`` lists each one."""
        with self.lock:
            best = self.best()
            load = {w.index: w.load_s() for w in self.workers}
        queue = dict.fromkeys(self.stages, 0)
        if best is not None:
            for f in list(best.flights.values()):
                for s in f.stages:
                    queue[s] += 1
        workers = [
            {
                "worker": w.index,
                "up": w.up,
                "pid": w.pid,
                "endpoint": w.endpoint,
                "incarnation": w.incarnation,
                "in_flight": len(w.flights),
                "replies": w.replies,
                "load_ms": 1e3 * load[w.index],
                "lag_ms": 1e3 * w.lag_s,
                "booked": len(w.ledger),
                "stage_ms": {k: v * 1e3 for k, v in w.times.est_s.items()},
            }
            for w in self.workers
        ]
        return {
            "ok": best is not None,
            "queue": queue,
            "stage_ms": {k: v * 1e3 for k, v in best.times.est_s.items()} if best else {},
            "stage_age_s": {k: now - t for k, t in best.times.est_at.items()} if best else {},
            "backlog_ms": 1e3 * load[best.index] if best else 0.0,
            "capacity": sum(w.up for w in self.workers),
            "workers": workers,
            "ray_auth": self.auth_mode,
        }

    # -- flights ----------------------------------------------------------------------------------

    def sent(self, w: Worker, rid: int, f: Flight) -> None:
        """``f`` went to ``w`` under the front's ``rid``; its stream sticks to ``w``."""
        f.worker = w.index
        w.flights[rid] = f
        if f.stream is not None:
            self.affinity[f.stream] = w.index
            self.affinity.move_to_end(f.stream)
            while len(self.affinity) > MAX_AFFINITY:
                self.affinity.popitem(last=False)

    def answered(self, w: Worker, f: Flight, timings: tuple[StageTiming, ...], now: float) -> None:
        """``w`` answered ``f``: its stage times and its lag learn from it."""
        w.observe(timings, now)
        w.lag_s = 0.7 * w.lag_s + 0.3 * max(now - f.predicted, 0.0)
        w.replies += 1

    def expired(self, now: float) -> list[Flight]:
        """Flights whose deadline passed (by 50 ms) without a reply, forgotten here."""
        out = []
        for w in self.workers:
            late = [rid for rid, f in w.flights.items() if now > f.deadline + 0.05]
            out += [w.flights.pop(rid) for rid in late]
        return out

    def lost(self, w: Worker, now: float) -> list[Flight]:
        """``w`` is down (its sockets closed): its flights, to re-dispatch; its bookings move
        to the live workers (dropped when none is up)."""
        flights, w.flights = list(w.flights.values()), {}
        with self.lock:
            bookings, w.ledger = list(w.ledger), Ledger(w.ledger.limit)
            for b in bookings:
                self._place(b, now)
        return flights
