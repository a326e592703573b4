"""Edge work ahead of now, in two records: a ``Booking`` (work a robot will send) and a
``Slot`` (when the edge will run one stage of it). Each crosses the network as a msgpack map
(``to_wire`` / ``from_wire``) and is the same type on both sides of it.

They are two ideas, not one. A booking is the queue model's input: a plan's edge segment
(several stages) announced before its bytes arrive, with when it will arrive and when it is
due, and no start or end: when it runs depends on everything else the edge holds. A slot is
the queue model's output: one stage of one request (queued or booked) placed by the worker's
rule, with the start and end that rule gives it, the deadline it must meet and whether it is
only booked so far. A robot sends bookings (op "book"); the edge plays them forward with what
is queued and sends back slots (its committed schedule), which the next plan is scored
against (``predictor.DeviceState.reservations``).

Clocks: each holder keeps them on its own (the edge its monotonic seconds, a robot's plan
seconds from its making, the fleet simulator simulated time); on the wire, times are seconds
from the moment the record was sent (robots do not share the edge's clock). A peer's map is
input: ``from_wire`` checks every field (finite numbers, known stage names, bounded sizes)
and raises ``RecordError`` naming the first problem; callers turn that into their side's
error (the robot's ``BadReply``, the edge's ``PacketError``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace

# A booking reaches at most this far ahead: a plan is for the next request, and a booking held
# longer would only be a way to make the edge refuse others.
MAX_BOOKING_S = 10.0
MAX_ROBOT_CHARS = 16  # a slot names its robot by a short id (``server.robot_id``)
WIRE_TIMES = ("start_s", "end_s", "deadline_s")  # a slot's times on the wire, in this order


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


def as_map(raw: object, what: str) -> dict:
    """``raw`` if it is a map, or RecordError naming ``what``."""
    if not isinstance(raw, dict):
        raise RecordError(f"{what} must be a map, not {type(raw).__name__}")
    return raw


@dataclass(frozen=True)
class Booking:
    """One edge segment of a chosen plan, announced before its request arrives: ``stages``
    reach the edge at ``arrive`` and are due at ``deadline``. In a robot's plan (and on the
    wire) the times are seconds from the plan's making and ``origin`` is None; in an edge's
    ledger they are the edge's clock and ``origin`` names the robot."""

    stages: tuple[str, ...]
    arrive: float
    deadline: float
    origin: Hashable | None = None

    def to_wire(self) -> dict:
        """The map a robot sends (op "book"), its times held to what the edge accepts
        (0..``MAX_BOOKING_S`` seconds from sending)."""
        hold = lambda s: min(max(s, 0.0), MAX_BOOKING_S)  # noqa: E731
        return {
            "stages": list(self.stages),
            "arrive_s": hold(self.arrive),
            "deadline_s": hold(self.deadline),
        }

    @classmethod
    def from_wire(cls, raw: object, known: tuple[str, ...]) -> Booking:
        """A booking for some of the ``known`` stages (the edge's schema), its times seconds
        from when it was sent."""
        m = as_map(raw, "a booking")
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


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One stage of one request in the edge's schedule: who (``origin``, a short robot id on
    the wire), what, when it runs and when it is due; ``booked``: announced, its bytes not
    arrived yet. Times are on the clock of whoever holds it (the edge's monotonic seconds;
    from the wire, seconds from when it was sent: negative, already started or overdue)."""

    origin: str
    stage: str
    start: float
    end: float
    deadline: float
    booked: bool = False

    def since(self, t: float) -> Slot:
        """The same slot on a clock that reads 0 at ``t`` of this one's: every time ``t``
        less. The edge sends its forecast ``since(now)``; a robot reads a schedule sent
        ``age_s`` ago ``since(age_s)``."""
        return replace(self, start=self.start - t, end=self.end - t, deadline=self.deadline - t)

    def to_wire(self) -> dict:
        return {
            "robot": str(self.origin),
            "stage": self.stage,
            "start_s": self.start,
            "end_s": self.end,
            "deadline_s": self.deadline,
            "booked": self.booked,
        }

    @classmethod
    def from_wire(cls, raw: object) -> Slot:
        m = as_map(raw, "a schedule slot")
        stage = m.get("stage")
        if not isinstance(stage, str) or not 0 < len(stage) <= 64:
            raise RecordError("a schedule slot needs a stage name")
        start, end, deadline = (number(m.get(k), k, -math.inf) for k in WIRE_TIMES)
        return cls(
            origin=str(m.get("robot", ""))[:MAX_ROBOT_CHARS],
            stage=stage,
            start=start,
            end=end,
            deadline=deadline,
            booked=m.get("booked") is True,
        )
