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
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass, field, replace

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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Slot:
    """One stage of one request in the forecast: who, what, when it runs and when it is due
    (monotonic seconds); ``booked``: announced, not arrived yet."""

    origin: str
    stage: str
    start: float
    end: float
    deadline: float
    booked: bool = False


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

    def copy(self) -> EdgeQueue:
        """The same queues, to play forward without touching these (admission's question)."""
        c = EdgeQueue(self.max_batch, self.free_at)
        c._later, c._order = list(self._later), self._order
        c._queued = {s: list(q) for s, q in self._queued.items()}
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
            out.append((p, Slot(p.origin, stage, cursor, end, p.deadline, p.booked)))
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
