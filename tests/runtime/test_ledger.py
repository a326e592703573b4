"""The edge pushes its ledger (the committed schedule) to the robots that listen while robots
are active: within ~20 ms of a change, and every 0.25 s when nothing moved. Another robot's
booking shows in a robot's plan without a health round trip; an idle edge stays quiet."""

from __future__ import annotations

import time

import zmq

from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.robot.client import EdgeClient, LinkDown, ping
from vlarun.runtime.robot.monitor import LinkMonitor
from vlarun.runtime.transport import Security
from vlarun.sched.bookings import Booking

INSECURE = Security(insecure=True)
STAGES = ("vision", "prefill", "decode")


def _client(address: str, listen: bool = False) -> EdgeClient:
    c = EdgeClient(address, INSECURE)
    end = time.monotonic() + 5
    while True:  # the connection takes a moment; IMMEDIATE refuses sends until then
        try:
            c.health(0.5, listen=listen)
            return c
        except LinkDown:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def _booked(schedule) -> bool:
    return bool(schedule) and any(s.booked for s in schedule)


def test_a_listening_robot_hears_another_robots_booking_unasked(policy):
    with EdgeServer(policy, INSECURE, ServerConfig()) as srv:
        srv.warmup()  # measured stage times: a booked slot has a length
        ping(srv.address, INSECURE, count=1, timeout_s=3.0)
        a, b = _client(srv.address), _client(srv.address, listen=True)
        try:
            assert b.listen(0.2) is None  # nobody active yet: nothing pushed
            t0 = time.monotonic()
            a.book(Booking(STAGES, arrive=1.0, deadline=5.0))
            heard = None
            while heard is None and time.monotonic() < t0 + 3.0:
                if _booked(b.listen(0.5)):
                    heard = time.monotonic() - t0
            assert heard is not None and heard < 1.0  # no health request since the booking
            pushes, end = 0, time.monotonic() + 0.6
            while time.monotonic() < end:  # nothing moves: a push every 0.25 s, not 20 ms
                pushes += b.listen(0.1) is not None
            assert 2 <= pushes <= 6
            t0 = time.monotonic()
            a.book(Booking(("vision",), arrive=1.0, deadline=5.0))  # a change: pushed at once
            newest = None
            while time.monotonic() < t0 + 1.0:
                got = b.listen(0.05)
                if got is not None and sum(s.booked for s in got) == 4:
                    newest = time.monotonic() - t0
                    break
            assert newest is not None and newest < 0.5  # ~20 ms; room for a loaded CI machine
            assert a.listen(0.2) is None  # a robot that did not ask to listen hears nothing
        finally:
            a.close()
            b.close()


def test_the_link_monitor_keeps_the_newest_ledger(policy):
    with EdgeServer(policy, INSECURE, ServerConfig()) as srv:
        srv.warmup()
        ping(srv.address, INSECURE, count=1, timeout_s=3.0)
        mon = LinkMonitor(srv.address, INSECURE, zmq.Context.instance()).start(wait_s=3.0)
        a = _client(srv.address)
        try:
            time.sleep(0.1)  # the monitor's first health request: it listens from then
            a.book(Booking(STAGES, arrive=1.0, deadline=5.0))
            t0 = time.monotonic()
            while not (_booked(mon.ledger) and mon.ledger_at > t0) and time.monotonic() < t0 + 3:
                time.sleep(0.01)
            assert _booked(mon.ledger) and 0.0 < mon.ledger_at - t0 < 1.0
            # the health answers come every 0.5 s; the pushed ledger is the fresher one
            assert mon.ledger_at > mon.health_at or mon.health_at - t0 < 0.05
        finally:
            a.close()
            mon.stop()
