"""Per-stage queues of the edge and the batching rule.

Every request waiting for a stage sits in that stage's queue, in arrival order. The worker
serves the stage whose oldest request is due first (EDF across the queues' heads) and batches,
earliest deadline first, the queued requests of that stage with the head's input signature
(shapes and dtypes apart from the batch axis). If the batch is not full
and the earliest member's slack allows, it waits a short window for more robots: slack =
deadline - now - the stage's measured time, and the wait never takes more than half of it,
so batching never costs a deadline it could have met.

``StageQueues.forecast`` plays that rule forward (``sched.queue_model``, the one queue model,
also the scale-out front's and the fleet simulator's; each stage at its measured per-request
time) over the batch running now, every queued request and every booking (a robot's plan
announced at decision time, before its bytes arrive), so the schedule robots plan against and
the admission test are one computation, and a second robot deciding before the first one's
packet lands already sees it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vlarun.runtime.protocol import StageTiming
from vlarun.runtime.segments import batch_dim
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


@dataclass(kw_only=True)
class Job:
    """One robot request in flight on the edge. ``pool`` holds its tensors by name (inputs,
    then every output of its stages so far); ``pos`` indexes the next stage to run."""

    identity: bytes
    rid: int
    stages: tuple[str, ...]
    want: tuple[str, ...]
    pool: dict[str, torch.Tensor]
    arrival: float
    deadline: float
    reply_codec: dict = field(default_factory=dict)
    # An accelerated request runs its stream's graph (stage functions bound to the stream's
    # hooks); ``fresh``: hook parts to reset before its first stage. None: the plain graph.
    graph: object | None = field(default=None, repr=False)
    hooks: object | None = field(default=None, repr=False)
    fresh: tuple[str, ...] = ()
    setting: str = "full"  # the accelerator setting's text form (what the dashboard shows)
    origin: bytes = b""  # the robot it is from (``identity`` unless a front relays it)
    # The robot whose share it counts against and whose arrivals it adds to: its authenticated
    # key (``edge.core.DataRequest.holder``); empty: ``origin``.
    key: bytes = b""
    route: object | None = field(default=None, repr=False)  # a front's Route (server.py)
    done: Callable | None = field(default=None, repr=False)  # an in-process request's callback
    # Set when its client has gone (``EdgeServer.cancel``): never run, re-queued or answered.
    cancelled: bool = False
    pos: int = 0
    enqueued: float = 0.0
    timings: list[StageTiming] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.key:
            self.key = self.origin

    def address(self, with_timings: bool = False) -> list[bytes]:
        """The frames a reply to this request starts with: the peer's identity, then, when a
        front relayed it, the front's route echoed (with this request's timings)."""
        if self.route is None:
            return [self.identity]
        return [self.identity, self.route.echo(self.timings if with_timings else None)]

    @property
    def stage(self) -> str:
        return self.stages[self.pos]

    def signature(self, inputs: tuple[str, ...]) -> tuple:
        """Stage + per input (name, dtype, shape without the batch axis). A request with hooks
        never batches: its hooks hold one stream's state (a KV cache of batch 1); one with
        its own graph batches only with requests of that graph (a batch runs one graph's
        stage functions on one set of inputs)."""
        sig = [self.stage]
        if self.hooks is not None:
            sig.append(("stream", id(self)))
        elif self.graph is not None:  # e.g. the graph reading a real-time chunk's freeze
            sig.append(("graph", id(self.graph)))
        for n in inputs:
            t = self.pool[n]
            shape = list(t.shape)
            del shape[batch_dim(n)]
            sig.append((n, str(t.dtype), tuple(shape)))
        return tuple(sig)


# Periodic arrivals: a client whose last ARRIVALS_KEPT requests came at a steady period (every
# gap within PERIODIC_JITTER of their median, at least PERIODIC_MIN of them) is expected again
# one period after its last. Clients that book their plans announce themselves and are not
# forecast; a client overdue by more than the jitter is not either (it stopped or changed).
ARRIVALS_KEPT = 8
PERIODIC_MIN = 4
PERIODIC_JITTER = 0.1
MAX_TRACKED = 1024  # clients whose arrivals are remembered (the oldest forgotten first)


@dataclass(frozen=True)
class Running:
    """The batch the edge's worker is running now, as the queue model needs it: its stage, its
    members' robot names, the earliest deadline among them, and each member's (robot name,
    deadline, stages still to run after this one)."""

    stage: str
    robots: tuple[str, ...]
    due: float
    after: tuple[tuple[str, float, tuple[str, ...]], ...]


class StageQueues(StageTimes):
    """Thread-safe per-stage FIFO queues with EDF selection across stages; the stage times
    measured here (``StageTimes``) are what its forecasts use."""

    def __init__(self, stage_inputs: dict[str, tuple[str, ...]], max_batch: int = 8) -> None:
        super().__init__()
        self.inputs, self.max_batch = stage_inputs, max_batch
        self.queues: dict[str, deque[Job]] = {s: deque() for s in stage_inputs}
        self.cond = threading.Condition()
        self.ledger = Ledger(MAX_BOOKINGS)  # the plans robots announced (sched.queue_model)
        # robot (key) -> its last arrivals (time, time it gave, stages); when it last booked
        self.arrivals: dict[bytes, deque] = {}
        self.booked_at: dict[bytes, float] = {}
        # Bumped by every change the schedule shows (a request queued, taken or dropped, a
        # booking held or claimed): the edge pushes its ledger when it moved, not every tick.
        self.version = 0

    def put(self, job: Job) -> None:
        with self.cond:
            job.enqueued = time.monotonic()
            self.queues[job.stage].append(job)
            self.version += 1
            if job.pos == 0:  # a new request, not one moving on to its next stage
                self._arrived(job)
            self.cond.notify()

    def _arrived(self, job: Job) -> None:
        hist = self.arrivals.pop(job.key, None) or deque(maxlen=ARRIVALS_KEPT)
        hist.append((job.arrival, job.deadline - job.arrival, tuple(job.stages)))
        self.arrivals[job.key] = hist  # re-inserted: the dict keeps the latest clients last
        while len(self.arrivals) > MAX_TRACKED:
            gone = next(iter(self.arrivals))
            del self.arrivals[gone]
            self.booked_at.pop(gone, None)

    def periodic(self, now: float) -> list[Booking]:
        """The next request of every client that arrives on a steady period and does not book
        (open-loop senders: other robots' firmware, a fleet's load generator), as a booking:
        it arrives one period after its last request, with the stages and the time it gave
        then. Without it a robot that decides now cannot see a request that will land before
        its own and take the edge first, or the batch its own stage will join."""
        out = []
        with self.cond:
            for origin, hist in self.arrivals.items():
                if len(hist) < PERIODIC_MIN or self.booked_at.get(origin, -1.0) >= hist[0][0]:
                    continue
                times = [h[0] for h in hist]
                gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
                period = gaps[len(gaps) // 2]
                if period <= 0 or max(abs(g - period) for g in gaps) > PERIODIC_JITTER * period:
                    continue
                nxt = times[-1] + period
                if now > nxt + PERIODIC_JITTER * period:
                    continue
                given = sorted(h[1] for h in hist)[len(hist) // 2]
                out.append(Booking(hist[-1][2], nxt, nxt + given, origin))
        return out

    def discard(self, job: Job) -> bool:
        """Take ``job`` out of its stage queue if it waits there (its tensors go with it);
        whether it did."""
        with self.cond:
            q = self.queues.get(job.stage) if job.pos < len(job.stages) else None
            if q is None or not any(j is job for j in q):
                return False
            self.queues[job.stage] = deque(j for j in q if j is not job)
            self.version += 1
            return True

    def depth_of(self, key: bytes) -> int:
        """Requests of one robot (its key: ``Job.key``) waiting in any stage queue."""
        with self.cond:
            return sum(j.key == key for q in self.queues.values() for j in q)

    def depth(self) -> dict[str, int]:
        with self.cond:
            return {s: len(q) for s, q in self.queues.items()}

    def backlog_s(self, deadline: float) -> float:
        """Predicted seconds of queued and booked work the worker serves before a request due
        at ``deadline`` (EDF: every one due no later), each at its stages' measured
        per-request time; stages never measured count 0 (no evidence to refuse on)."""
        with self.cond:
            queued = [(j.deadline, j.stages[j.pos :]) for q in self.queues.values() for j in q]
            booked = [(b.deadline, b.stages) for b in self.ledger]
        return sum(
            self.est_s.get(n, 0.0)
            for due, names in queued + booked
            if due <= deadline
            for n in names
        )

    # -- bookings ---------------------------------------------------------------------------------

    def book(self, booking: Booking, now: float, per_robot: int = MAX_BOOKINGS) -> bool:
        """Hold ``booking`` until its request arrives; False (nothing held) when the ledger is
        full, its robot holds ``per_robot`` already, or it names a stage this edge does not
        run."""
        if not booking.stages or any(n not in self.queues for n in booking.stages):
            return False
        with self.cond:
            if not self.ledger.book(booking, now, per_robot):
                return False
            self.version += 1
            if booking.origin in self.arrivals:  # it announces its plans: not forecast
                self.booked_at[booking.origin] = now
            return True

    def claim(self, key: bytes, stages: tuple[str, ...], now: float) -> bool:
        """The request robot ``key`` booked has arrived: its booking leaves the ledger (its work
        is now queued), the earliest of that robot's bookings for the same first stage."""
        with self.cond:
            if not self.ledger.claim(key, stages, now):
                return False
            self.version += 1
            return True

    # -- the queue model --------------------------------------------------------------------------

    def forecast(
        self,
        now: float,
        busy_until: float = 0.0,
        running: Running | None = None,
        name: Callable[[bytes], str] = bytes.hex,
        extra: Booking | None = None,
        limit: int = 64,
    ) -> list[Slot]:
        """The worker's rule played forward (``sched.queue_model``): after the batch running
        now (``running``, until ``busy_until``), batch after batch from the requests
        queued now, booked and arrived by then, or re-queued for their next stage, each stage
        at its measured per-request time. ``extra``: a request not yet queued, placed like a
        booking (admission asks where it would finish). Returns up to ``limit`` slots in the
        order they would run."""
        ask = None
        if extra is not None:
            ask = self._pending(max(extra.arrive, now), extra.deadline, THIS, extra.stages)
        out, queue = self._model(now, busy_until, running, name, ask)
        return (out + play(queue, limit))[:limit]

    def finish(
        self,
        now: float,
        stages: tuple[str, ...],
        deadline: float,
        busy_until: float = 0.0,
        running: Running | None = None,
    ) -> float:
        """When a request for ``stages`` due at ``deadline``, queued now, would finish: the
        forecast with it in (admission's test is the robots' schedule, not a second model)."""
        ask = self._pending(now, deadline, THIS, stages, key=THIS)
        _, queue = self._model(now, busy_until, running, bytes.hex, ask)
        end = finish(queue, THIS)
        return now if end is None else end

    def _model(
        self,
        now: float,
        busy_until: float,
        running: Running | None,
        name: Callable[[bytes], str],
        ask: Pending | None = None,
    ) -> tuple[list[Slot], EdgeQueue]:
        """The queue model's state now: the running batch's slot (if any) and the queues,
        holding every queued request, every booking, ``ask`` and the running batch's
        followers."""
        with self.cond:
            items = [
                self._pending(now, j.deadline, name(j.key), j.stages[j.pos :])
                for q in self.queues.values()
                for j in q
            ]
            items += self.ledger.pending(now, self.seconds, name)
        items += [
            self._pending(max(b.arrive, now), b.deadline, name(b.origin), b.stages, booked=True)
            for b in self.periodic(now)
        ]
        if ask is not None:
            items.append(ask)
        out: list[Slot] = []
        queue = EdgeQueue(self.max_batch, now)
        if running is not None and busy_until > now:
            out.append(
                Slot(
                    origin=",".join(running.robots),
                    stage=running.stage,
                    start=now,
                    end=busy_until,
                    deadline=running.due,
                )
            )
            queue.free_at = busy_until
            items += [self._pending(busy_until, d, who, rest) for who, d, rest in running.after]
        for p in items:
            queue.add(p)
        return out, queue

    def _pending(
        self,
        ready: float,
        deadline: float,
        origin: str,
        stages,
        booked: bool = False,
        key: str | None = None,
    ) -> Pending:
        """A request's remaining ``stages`` at their measured per-request times (0 for a stage
        never measured: no evidence to wait on)."""
        stages = tuple(stages)
        seconds = tuple(self.est_s.get(n, 0.0) for n in stages)
        return Pending(
            ready=ready,
            deadline=deadline,
            origin=origin,
            stages=stages,
            seconds=seconds,
            booked=booked,
            key=key,
        )

    def ordered(self) -> list[Job]:
        """Every queued request, in the order the worker will serve them (EDF)."""
        with self.cond:
            jobs = [j for q in self.queues.values() for j in q]
        return sorted(jobs, key=lambda j: j.deadline)

    def fresh(self, stages: tuple[str, ...], within_s: float) -> bool:
        """Whether every stage's estimate was measured in the last ``within_s`` seconds."""
        return self.fresh_at(stages, within_s, time.monotonic())

    def observe(self, stage: str, seconds: float, batch: int, prior: bool = False) -> None:
        self.measured(stage, seconds, batch, time.monotonic(), prior)

    def take(self, stop: threading.Event, window: Callable[[], float]) -> list[Job] | None:
        """Block until work exists (or ``stop``); return one batch, ready to run. ``window()``
        is the longest wait for batch mates, asked when work is there (it depends on load)."""
        with self.cond:
            while not stop.is_set():
                head = self._earliest()
                if head is None:
                    self.cond.wait(0.05)
                    continue
                batch = self._collect(head)
                until = time.monotonic() + self._wait_s(head, batch, window())
                while len(batch) < self.max_batch and not stop.is_set():
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)  # a put() wakes us: maybe a batch mate
                    batch = self._collect(head)
                return self._remove(head.stage, batch)
        return None

    def _earliest(self) -> Job | None:
        heads = [q[0] for q in self.queues.values() if q]
        return min(heads, key=lambda j: j.deadline) if heads else None

    def _collect(self, head: Job) -> list[Job]:
        sig = head.signature(self.inputs[head.stage])
        same = [j for j in self.queues[head.stage] if j.signature(self.inputs[j.stage]) == sig]
        same.sort(key=lambda j: j.deadline)
        return same[: self.max_batch]

    def _wait_s(self, head: Job, batch: list[Job], window_s: float) -> float:
        if len(batch) >= self.max_batch or window_s <= 0:
            return 0.0
        slack = head.deadline - time.monotonic() - self.est_s.get(head.stage, 0.0)
        return min(window_s, slack / 2)

    def _remove(self, stage: str, batch: list[Job]) -> list[Job]:
        ids = {id(j) for j in batch}
        q = self.queues[stage]
        self.queues[stage] = deque(j for j in q if id(j) not in ids)
        self.version += 1
        return batch
