"""The typed records of the edge protocol's metadata, in seconds.

What travels between a robot and an edge beside the tensors is frozen dataclasses that pack to
a msgpack map and parse one back (as ``edge.server.Route`` does for the scale-out front's frame):

- ``StageTiming`` (here): one stage of a result, as the edge ran it (its batch's compute time,
  the time the request queued for it, the batch size). A result carries one per edge stage.
- ``sched.bookings.Slot``: one stage of one request in the edge's committed schedule, times
  from the moment the schedule was sent. Replies, health answers and the ledger the edge
  pushes carry a list of them (``pack_schedule`` / ``parse_schedule``); robots plan against
  it (``costview.edge_state``).
- ``sched.bookings.Booking``: a robot announcing an edge segment of the plan it just chose,
  before its bytes arrive (op "book").

The two schedule records are the queue model's own types, each with ``to_wire`` /
``from_wire``: the edge and the robot hold the same type on both sides of the wire. A peer's
map is input: parsing checks every field (finite numbers, known stage names, bounded sizes)
and raises ``RecordError`` naming the first problem; callers turn that into their side's error
(the robot's ``BadReply``, the edge's ``PacketError``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.sched.bookings import RecordError, Slot, as_map, number

MAX_SLOTS = 256  # a schedule longer than this is cut: planning needs the near future only


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
        m = as_map(raw, "a timing")
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


def pack_schedule(slots) -> list[dict]:
    """The committed schedule as it is sent: ``Slot``s whose times are seconds from now."""
    return [s.to_wire() for s in slots]


def parse_schedule(raw: object) -> tuple[Slot, ...]:
    """The edge's committed schedule as planning reads it; anything malformed drops all of it
    (a schedule only informs planning: none is a safe answer, a wrong one is not)."""
    if not isinstance(raw, list):
        return ()
    try:
        return tuple(Slot.from_wire(s) for s in raw[:MAX_SLOTS])
    except RecordError:
        return ()
