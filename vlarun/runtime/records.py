"""The typed records of the edge protocol's metadata, in seconds.

Three records travel between a robot and an edge beside the tensors, each a frozen dataclass
that packs to a msgpack map and parses one back (as ``server.Route`` does for the scale-out
front's frame):

- ``StageTiming``: one stage of a result, as the edge ran it (its batch's compute time, the
  time the request queued for it, the batch size). A result carries one per edge stage.
- ``ScheduleSlot``: one stage of one request in the edge's committed schedule (its ledger),
  times from the moment the schedule was sent. Replies, health answers and the ledger the
  edge pushes carry a list of them; robots plan against it (``costview.edge_state``).
- ``PlanBooking``: a robot announcing the edge stages of the plan it just chose, before its
  bytes arrive (op "book").

A peer's map is input: ``parse`` checks every field (finite numbers, known stage names,
bounded sizes) and raises ``RecordError`` naming the first problem; callers turn that into
their side's error (the robot's ``BadReply``, the edge's ``PacketError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vlarun.sched.queue_model import Slot

MAX_SLOTS = 256  # a schedule longer than this is cut: planning needs the near future only
MAX_ROBOT_CHARS = 16  # a slot names its robot by a short id (``server.robot_id``)
# A booking reaches at most this far ahead: a plan is for the next request, and a booking held
# longer would only be a way to make the edge refuse others.
MAX_BOOKING_S = 10.0


class RecordError(ValueError):
    """A record map that does not parse: the message says which field and why."""


def number(x: object, what: str, low: float = 0.0, high: float = math.inf) -> float:
    """A finite real in ``low..high`` (bool is not a number here), or RecordError naming
    ``what``."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        raise RecordError(f"{what} is {str(x)[:40]!r}, not a finite number")
    if not low <= x <= high:
        raise RecordError(f"{what} is {x:g}, not in {low:g}..{high:g}")
    return float(x)


def _map(raw: object, what: str) -> dict:
    if not isinstance(raw, dict):
        raise RecordError(f"{what} must be a map, not {type(raw).__name__}")
    return raw


@dataclass(frozen=True)
class StageTiming:
    """How the edge ran one stage of a request: ``compute_s``, the whole batch's execution
    (the request waited for all of it); ``queue_s``, from joining the stage's queue to the
    batch's start; ``batch``, how many requests shared it."""

    stage: str
    compute_s: float
    queue_s: float
    batch: int

    @property
    def share_s(self) -> float:
        """This request's share of the batch's compute (what its energy is charged for)."""
        return self.compute_s / self.batch

    def pack(self) -> dict:
        return {
            "stage": self.stage,
            "compute_s": self.compute_s,
            "queue_s": self.queue_s,
            "batch": self.batch,
        }

    @classmethod
    def parse(cls, raw: object, stages: tuple[str, ...]) -> StageTiming:
        """One timing of a request for ``stages`` (it must name one of them)."""
        m = _map(raw, "a timing")
        stage = m.get("stage")
        if stage not in stages:
            raise RecordError(f"a timing names {str(stage)[:40]!r}, no stage of {'+'.join(stages)}")
        batch = m.get("batch")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise RecordError(f"batch of {stage} is {str(batch)[:40]!r}, not an integer >= 1")
        compute = number(m.get("compute_s"), f"compute_s of {stage}")
        return cls(stage, compute, number(m.get("queue_s", 0.0), f"queue_s of {stage}"), batch)


def parse_timings(raw: object, stages: tuple[str, ...]) -> tuple[StageTiming, ...]:
    """A result's timings: a list of at most one per stage of the request."""
    if not isinstance(raw, list) or len(raw) > len(stages):
        raise RecordError(f"timings must be a list of at most {len(stages)} entries")
    return tuple(StageTiming.parse(t, stages) for t in raw)


def pack_timings(timings) -> list[dict]:
    return [t.pack() for t in timings]


@dataclass(frozen=True, kw_only=True)
class ScheduleSlot:
    """One stage of one request in the edge's committed schedule: the robot it is for (a short
    id), the stage, when it starts and ends and when it is due, in seconds from the moment
    the schedule was sent (negative: already started or overdue); ``booked``: announced by
    its robot, its bytes not arrived yet."""

    robot: str
    stage: str
    start_s: float
    end_s: float
    deadline_s: float
    booked: bool = False

    @classmethod
    def of(cls, slot: Slot, now: float) -> ScheduleSlot:
        """The wire form of the queue model's slot (monotonic seconds on the edge's clock),
        made relative to ``now`` (robots do not share the edge's clock)."""
        return cls(
            robot=str(slot.origin),
            stage=slot.stage,
            start_s=slot.start - now,
            end_s=slot.end - now,
            deadline_s=slot.deadline - now,
            booked=slot.booked,
        )

    def slot(self) -> Slot:
        """As the queue model's slot, on the clock of the moment it was sent (0 = then)."""
        return Slot(
            origin=self.robot,
            stage=self.stage,
            start=self.start_s,
            end=self.end_s,
            deadline=self.deadline_s,
            booked=self.booked,
        )

    def aged(self, age_s: float) -> ScheduleSlot:
        """The same slot seen ``age_s`` later (every time that much nearer)."""
        return replace(
            self,
            start_s=self.start_s - age_s,
            end_s=self.end_s - age_s,
            deadline_s=self.deadline_s - age_s,
        )

    def pack(self) -> dict:
        return {
            "robot": self.robot,
            "stage": self.stage,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "deadline_s": self.deadline_s,
            "booked": self.booked,
        }

    @classmethod
    def parse(cls, raw: object) -> ScheduleSlot:
        m = _map(raw, "a schedule slot")
        stage = m.get("stage")
        if not isinstance(stage, str) or not 0 < len(stage) <= 64:
            raise RecordError("a schedule slot needs a stage name")
        times = {k: number(m.get(k), k, -math.inf) for k in ("start_s", "end_s", "deadline_s")}
        return cls(
            robot=str(m.get("robot", ""))[:MAX_ROBOT_CHARS],
            stage=stage,
            **times,
            booked=m.get("booked") is True,
        )


def pack_schedule(slots) -> list[dict]:
    return [s.pack() for s in slots]


def parse_schedule(raw: object) -> tuple[ScheduleSlot, ...]:
    """The edge's committed schedule as planning reads it; anything malformed drops all of it
    (a schedule only informs planning: none is a safe answer, a wrong one is not)."""
    if not isinstance(raw, list):
        return ()
    try:
        return tuple(ScheduleSlot.parse(s) for s in raw[:MAX_SLOTS])
    except RecordError:
        return ()


@dataclass(frozen=True)
class PlanBooking:
    """A robot's chosen plan, announced the moment it is chosen: its edge ``stages`` arrive in
    ``arrive_s`` and are due in ``deadline_s`` (seconds from sending; at most
    ``MAX_BOOKING_S``). The edge books them into its queue model (``queues.Booking``)."""

    stages: tuple[str, ...]
    arrive_s: float
    deadline_s: float

    @classmethod
    def clamped(cls, stages: tuple[str, ...], arrive_s: float, deadline_s: float) -> PlanBooking:
        """A booking with its times held to what the edge accepts."""
        hold = lambda s: min(max(s, 0.0), MAX_BOOKING_S)  # noqa: E731
        return cls(tuple(stages), hold(arrive_s), hold(deadline_s))

    def pack(self) -> dict:
        return {
            "stages": list(self.stages),
            "arrive_s": self.arrive_s,
            "deadline_s": self.deadline_s,
        }

    @classmethod
    def parse(cls, raw: object, known: tuple[str, ...]) -> PlanBooking:
        """A booking for some of the ``known`` stages (the edge's schema)."""
        m = _map(raw, "a booking")
        stages = m.get("stages")
        if (
            not isinstance(stages, list)
            or not 0 < len(stages) <= len(known)
            or not all(isinstance(n, str) and n in known for n in stages)
        ):
            raise RecordError(f"a booking needs a list of stage names from {'/'.join(known)}")
        arrive = number(m.get("arrive_s"), "arrive_s", 0.0, MAX_BOOKING_S)
        return cls(
            tuple(stages), arrive, number(m.get("deadline_s"), "deadline_s", 0.0, MAX_BOOKING_S)
        )
