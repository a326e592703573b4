"""The typed records of the edge protocol: each packs to a map in seconds and parses back to
itself (the schedule's ``Slot`` and the ``Booking`` are the queue model's own types, through
``to_wire`` / ``from_wire``), and a map that lies (a wrong type, a non-finite or out-of-range
number, an unknown stage) is refused naming the field."""

from __future__ import annotations

import math

import msgpack
import pytest

from vlarun.runtime.protocol import (
    RecordError,
    StageTiming,
    pack_schedule,
    parse_schedule,
    parse_timings,
)
from vlarun.sched.bookings import MAX_BOOKING_S, Booking, Slot

STAGES = ("vision", "prefill", "decode")


def _wire(x: dict) -> dict:
    """Through msgpack, as a peer would read it."""
    return msgpack.unpackb(msgpack.packb(x), raw=False)


def test_every_record_round_trips_through_msgpack():
    t = StageTiming("prefill", 0.25, 0.01, 4)
    assert StageTiming.parse(_wire(t.pack()), STAGES) == t and t.share_s == 0.0625
    s = Slot(origin="ab12", stage="decode", start=-0.01, end=0.2, deadline=0.5, booked=True)
    assert Slot.from_wire(_wire(s.to_wire())) == s
    assert parse_schedule(_wire(pack_schedule([s, s]))) == (s, s)
    b = Booking(("prefill", "decode"), 0.15, 0.9)
    assert Booking.from_wire(_wire(b.to_wire()), STAGES) == b


def test_a_slot_is_sent_relative_to_the_edges_clock_and_ages_on_the_robots():
    slot = Slot(origin="ab12", stage="vision", start=100.2, end=100.5, deadline=101.0, booked=True)
    sent = slot.since(100.0)
    assert (sent.start, sent.end, sent.deadline) == pytest.approx((0.2, 0.5, 1.0))
    wire = sent.to_wire()
    times = [wire[k] for k in ("start_s", "end_s", "deadline_s")]
    assert times == [sent.start, sent.end, sent.deadline]
    older = Slot.from_wire(wire).since(0.3)
    assert (older.start, older.end, older.deadline) == pytest.approx((-0.1, 0.2, 0.7))


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"stage": "rm", "compute_s": 0.1, "batch": 1}, "rm"),
        ({"stage": "decode", "compute_s": "fast", "batch": 1}, "compute_s"),
        ({"stage": "decode", "compute_s": math.nan, "batch": 1}, "compute_s"),
        ({"stage": "decode", "compute_s": -0.1, "batch": 1}, "compute_s"),
        ({"stage": "decode", "compute_s": 0.1, "queue_s": math.inf, "batch": 1}, "queue_s"),
        ({"stage": "decode", "compute_s": 0.1, "batch": 0}, "batch"),
        ({"stage": "decode", "compute_s": 0.1, "batch": True}, "batch"),
        ([0.1], "map"),
    ],
)
def test_a_lying_timing_is_refused_naming_the_field(raw, field):
    with pytest.raises(RecordError, match=field):
        StageTiming.parse(raw, STAGES)


def test_timings_are_at_most_one_per_stage():
    one = {"stage": "decode", "compute_s": 0.1, "batch": 1}
    assert parse_timings([one], ("decode",))[0].stage == "decode"
    with pytest.raises(RecordError, match="at most 1"):
        parse_timings([one, one], ("decode",))
    with pytest.raises(RecordError):
        parse_timings(None, STAGES)


def test_a_schedule_with_one_bad_slot_is_dropped_whole():
    good = Slot(origin="ab12", stage="decode", start=0.0, end=0.2, deadline=0.5).to_wire()
    assert len(parse_schedule([good, good])) == 2
    assert parse_schedule([good, {**good, "end_s": "x"}]) == ()
    assert parse_schedule([good, {**good, "stage": 3}]) == ()
    assert parse_schedule({"stage": "decode"}) == ()
    assert len(parse_schedule([good] * 1000)) == 256  # cut, not refused


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"stages": "vision", "arrive_s": 0.0, "deadline_s": 0.1}, "stage names"),
        ({"stages": ["nope"], "arrive_s": 0.0, "deadline_s": 0.1}, "stage names"),
        ({"stages": [], "arrive_s": 0.0, "deadline_s": 0.1}, "stage names"),
        ({"stages": ["vision"], "arrive_s": -1.0, "deadline_s": 0.1}, "arrive_s"),
        ({"stages": ["vision"], "arrive_s": 0.0, "deadline_s": MAX_BOOKING_S + 1}, "deadline_s"),
        ({"stages": ["vision"], "arrive_ms": 0, "deadline_ms": 100}, "arrive_s"),
    ],
)
def test_a_bad_booking_is_refused_naming_the_field(raw, field):
    with pytest.raises(RecordError, match=field):
        Booking.from_wire(raw, STAGES)


def test_a_booking_is_sent_held_to_what_the_edge_accepts():
    wire = Booking(("decode",), -0.5, 60.0).to_wire()
    assert (wire["arrive_s"], wire["deadline_s"]) == (0.0, MAX_BOOKING_S)
    assert Booking.from_wire(wire, STAGES) == Booking(("decode",), 0.0, MAX_BOOKING_S)


def test_the_wire_maps_keep_the_protocols_keys_in_order():
    """What robots and edges of other versions read: the same keys, in the same order."""
    slot = Slot(origin="ab12", stage="decode", start=0.0, end=0.2, deadline=0.5)
    assert list(slot.to_wire()) == ["robot", "stage", "start_s", "end_s", "deadline_s", "booked"]
    wire = Booking(("vision", "prefill"), 0.1, 0.5, origin=b"not sent").to_wire()
    assert wire == {"stages": ["vision", "prefill"], "arrive_s": 0.1, "deadline_s": 0.5}
    assert list(wire) == ["stages", "arrive_s", "deadline_s"]
