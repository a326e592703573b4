"""The edge's queue model: the worker's rule, as one pure computation.

One edge worker serves per-stage FIFO queues. When it is free it takes the stage queue whose
head (its oldest request) is due first, and from it a batch of up to ``max_batch`` requests,
earliest deadline first; a batch takes the sum of its members' per-request times (the
measured per-request time x the batch, at the edge), every member ends with the batch, and a
member with stages left joins its next stage's queue then. It never preempts a batch, and it
is never idle while a request waits (the batch window is not modelled: it only ever waits
while the slack allows).

Everything that says when an edge request starts or finishes plays this rule forward: the
edge's own forecast and admission (``runtime.queues.StageQueues``), the scale-out front's
per-worker estimate (``runtime.scaleout``) and the fleet simulator's edge (``world.fleet``),
so the three cannot disagree on how long a request waits.

The one reservation mechanism lives here too. A robot that chose a plan announces its edge
segments (``plan_bookings``: ``bookings.Booking``s); the edge holds them in its ``Ledger``
until their requests arrive (``Ledger.claim``) and plays them forward with what is queued;
the forecast's slots (``bookings.Slot``s), as ``reservations``, are the edge load the next
plan is scored against. The runtime's edge (``runtime.queues``) and the fleet simulator's
(``world.fleet.SimEdge``) both do exactly this, so the load a plan sees is never the
scheduler's own bookkeeping of its earlier plans.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field, replace

from vlarun.sched.bookings import Booking, Slot
from vlarun.sched.calibration import on_time_probability
from vlarun.sched.contract import ExecutionPlan
from vlarun.sched.execution import segments

THIS = "(this request)"  # the name and key of the request admission asks about


@dataclass
class StageTimes:
    """One worker's per-request stage times: an EWMA (0.2 on the newest) of each measured
    batch's time over its size, and when each stage was last measured (monotonic seconds).
    The edge's own queues and the scale-out front's view of each worker keep one each; what
    they feed the queue model comes from here."""

    est_s: dict[str, float] = field(default_factory=dict)
    est_at: dict[str, float] = field(default_factory=dict)
    # Stages whose estimate is a warm-up's (taken on dummy inputs, perhaps while the machine
    # was busy starting): the first real execution replaces it instead of moving it 20%, so a
    # warm-up on a busy CPU does not hold the edge back for a dozen refusals.
    prior: set[str] = field(default_factory=set)

    def measured(
        self, stage: str, seconds: float, batch: int, now: float, prior: bool = False
    ) -> None:
        per = seconds / max(batch, 1)
        old = None if stage in self.prior else self.est_s.get(stage)
        self.est_s[stage] = per if old is None else 0.8 * old + 0.2 * per
        self.est_at[stage] = now
        if prior:
            self.prior.add(stage)
        else:
            self.prior.discard(stage)

    def seconds(self, stages) -> tuple[float, ...]:
        """Each stage's per-request time (0 for a stage never measured)."""
        return tuple(self.est_s.get(s, 0.0) for s in stages)

    def work_s(self, stages) -> float:
        return sum(self.seconds(stages))

    def fresh_at(self, stages, within_s: float, now: float) -> bool:
        """Whether every stage was measured in the ``within_s`` seconds before ``now``."""
        return all(now - self.est_at.get(s, -1e9) <= within_s for s in stages)


@dataclass(frozen=True, kw_only=True)
class Pending:
    """A request's stages still to run, as the queue model sees it: it joins the queue of
    ``stages[0]`` at ``ready``; ``seconds``: each stage's per-request time; ``key``: the
    caller's handle for it (the fleet simulator's request), never looked at here."""

    ready: float
    deadline: float
    origin: str
    stages: tuple[str, ...]
    seconds: tuple[float, ...]
    booked: bool = False
    key: Hashable | None = None


class EdgeQueue:
    """One worker's queues under the worker's rule. ``add`` a request (it joins when
    ``ready``), ``step`` starts the next batch. ``free_at``: when the worker finishes the
    batch it runs now (its members' next stages are added as requests ready then).

    It holds no clock and no lock: a forecast fills one and steps it to the end; the fleet
    simulator keeps one for its whole run and steps it as simulated time reaches each batch."""

    def __init__(self, max_batch: int, free_at: float = -math.inf) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.max_batch, self.free_at = max_batch, free_at
        self._later: list[tuple[float, int, Pending]] = []  # not arrived yet, by (ready, order)
        self._queued: dict[str, list[tuple[int, Pending]]] = {}  # per stage, in arrival order
        self._order = 0

    def add(self, p: Pending) -> None:
        if p.stages:
            heapq.heappush(self._later, (p.ready, self._order, p))
            self._order += 1

    def copy(self, priced: Callable[[tuple], tuple[float, ...]] | None = None) -> EdgeQueue:
        """The same queues, to play forward without touching these (admission's question);
        ``priced``: each request's remaining stages re-priced by it (what a forecast made with
        measured per-request times sees, rather than the times the requests will take)."""
        c = EdgeQueue(self.max_batch, self.free_at)
        c._later, c._order = list(self._later), self._order
        c._queued = {s: list(q) for s, q in self._queued.items()}
        if priced is not None:
            c._later = [(t, k, replace(p, seconds=priced(p.stages))) for t, k, p in c._later]
            c._queued = {
                s: [(k, replace(p, seconds=priced(p.stages))) for k, p in q]
                for s, q in c._queued.items()
            }
        return c

    def __bool__(self) -> bool:
        return bool(self._later) or any(self._queued.values())

    def next_at(self) -> float | None:
        """When the next batch starts (None: nothing to serve)."""
        if any(self._queued.values()):
            return self.free_at
        return max(self.free_at, self._later[0][0]) if self._later else None

    def step(self) -> list[tuple[Pending, Slot]]:
        """Start the next batch at ``next_at()``: each member and its slot (empty when there
        is nothing to serve). Only requests ready by then can be in it."""
        cursor = self.free_at
        self._arrive(cursor)
        if not any(self._queued.values()):
            if not self._later:
                return []
            cursor = self._later[0][0]  # idle until the next request lands
            self._arrive(cursor)
        heads = [q[0] for q in self._queued.values() if q]
        stage = min(heads, key=lambda h: h[1].deadline)[1].stages[0]
        q = self._queued[stage]
        batch = sorted(q, key=lambda m: m[1].deadline)[: self.max_batch]
        taken = {k for k, _ in batch}
        self._queued[stage] = [m for m in q if m[0] not in taken]
        end = cursor + sum(p.seconds[0] for _, p in batch)
        out = []
        for k, p in batch:
            out.append(
                (
                    p,
                    Slot(
                        origin=p.origin,
                        stage=stage,
                        start=cursor,
                        end=end,
                        deadline=p.deadline,
                        booked=p.booked,
                    ),
                )
            )
            if len(p.stages) > 1:  # its next stage is queued once this one is done
                rest = replace(p, ready=end, stages=p.stages[1:], seconds=p.seconds[1:])
                heapq.heappush(self._later, (end, k, rest))
        self.free_at = end
        return out

    def _arrive(self, t: float) -> None:
        while self._later and self._later[0][0] <= t:
            _, k, p = heapq.heappop(self._later)
            self._queued.setdefault(p.stages[0], []).append((k, p))


def play(queue: EdgeQueue, limit: int = 64) -> list[Slot]:
    """Step ``queue`` until it is empty or ``limit`` slots have run: the slots, in the order
    they would run."""
    out: list[Slot] = []
    while queue and len(out) < limit:
        out += [slot for _, slot in queue.step()]
    return out[:limit]


def finish(queue: EdgeQueue, key: Hashable) -> float | None:
    """When the request ``key`` names would finish: ``queue`` played forward (and so used up)
    to the end of that request's last stage; None if it holds no such request."""
    while queue:
        for p, slot in queue.step():
            if p.key == key and len(p.stages) == 1:
                return slot.end
    return None


# ---------------------------------------------------------------------------------------------
# Bookings: the one reservation mechanism

MAX_BOOKINGS = 256  # bookings an edge holds at once; more are refused (a few hundred bytes each)


def plan_bookings(plan: ExecutionPlan, slo_s: float, now: float = 0.0) -> tuple[Booking, ...]:
    """The plan's edge segments (maximal runs of edge stages, in the plan's stage order) as the
    edge should expect them: each arrives when the stage before it is predicted to end (the
    request's start for a first stage) and is due when the rest of the plan needs it, so a
    robot deciding before this request's bytes land already sees its work. ``now``: the time
    the plan was made at (its stage times are on that clock).

    A plan more likely late than on time books nothing: its request may well be refused or
    fall back, and the edge time held for it is time a feasible arrival is refused for (two
    robots on an overloaded edge, 200 -> 10 Mbit/s: on time 46.7 / 49.2 / 55.8% with such
    bookings, 50.0 / 55.0 / 58.3% without, Edge-Only 55.0 / 53.3 / 60.0%)."""
    p_on = plan.on_time_p
    if p_on is None:
        p_on = float(on_time_probability(plan.latency_s, plan.sigma_s, plan.slo_s))
    if not plan.feasible and p_on < 0.5:
        return ()
    out: list[Booking] = []
    names = list(plan.placement)
    roles = [plan.placement[n] for n in names]
    for run in segments(roles):  # the executor's segments: one edge request each
        if roles[run.start] != "edge":
            continue
        arrive = now if run.start == 0 else plan.stage_end[names[run.start - 1]]
        last = names[run[-1]]
        after = max(now + plan.latency_s - plan.stage_end[last], 0.0)  # residual < 0
        out.append(Booking(tuple(names[k] for k in run), arrive, now + slo_s - after))
    return tuple(out)


class Ledger:
    """The bookings one edge holds, by arrival: at most ``limit``, each dropped when its request
    arrives (``claim``) or its deadline passes. No lock: its owner holds one if it needs it."""

    def __init__(self, limit: int = MAX_BOOKINGS) -> None:
        self.limit = limit
        self.bookings: list[Booking] = []

    def __iter__(self):
        return iter(self.bookings)

    def __len__(self) -> int:
        return len(self.bookings)

    def expire(self, now: float) -> None:
        self.bookings = [b for b in self.bookings if b.deadline > now]

    def book(self, booking: Booking, now: float, per_robot: int | None = None) -> bool:
        """Hold ``booking``; False (nothing held) when the ledger is full or its robot holds
        ``per_robot`` already."""
        self.expire(now)
        mine = sum(b.origin == booking.origin for b in self.bookings)
        if len(self.bookings) >= self.limit or (per_robot is not None and mine >= per_robot):
            return False
        self.bookings.append(booking)
        return True

    def pending(
        self,
        now: float,
        priced: Callable[[tuple], tuple[float, ...]],
        name: Callable[[Hashable], str] = str,
    ) -> list[Pending]:
        """Every booking held at ``now`` as the queue model's request: it joins the queue when
        it arrives (not before ``now``), each stage at ``priced``'s per-request time."""
        self.expire(now)
        return [
            Pending(
                ready=max(b.arrive, now),
                deadline=b.deadline,
                origin=name(b.origin),
                stages=b.stages,
                seconds=priced(b.stages),
                booked=True,
            )
            for b in self.bookings
        ]

    def claim(self, origin: Hashable, stages: tuple[str, ...], now: float) -> bool:
        """The request ``origin`` booked has arrived: the earliest of that robot's bookings for
        the same first stage leaves the ledger (its work is now queued); whether one did."""
        self.expire(now)
        mine = [b for b in self.bookings if b.origin == origin and b.stages[0] == stages[0]]
        if not mine:
            return False
        self.bookings.remove(min(mine, key=lambda b: b.arrive))
        return True


def reservations(slots: Iterable[Slot], now: float = 0.0) -> list[Slot]:
    """The edge's forecast as the load a plan made at ``now`` is scored against
    (``DeviceState.reservations``): each slot not ended by then, from ``now`` at the earliest,
    with its deadline (which work the new request's stage goes before, under EDF, the
    scheduler decides from it). The one conversion: a robot's copy of the edge's schedule and
    the fleet simulator's edge both pass through here."""
    return [replace(s, start=max(s.start, now)) for s in slots if s.end > now]
