"""The edge server: the edge's core (``runtime/edge_core.py``: queues, admission, bookings,
streams, the worker) served over one ROUTER socket. This file is the socket side only.

Two threads. The I/O thread owns the ROUTER socket: it answers control messages (health)
at once, never behind model work, validates every data message (header against limits and
the stage schema first, tensors only after) and answers a bad one with an error, then hands
good requests to the core's stage queues. The worker thread (``EdgeCore.work``) takes batches,
runs one stage, moves each request on to its next stage or hands the finished reply back to the
I/O thread over an inproc socket (ZeroMQ sockets are not thread-safe, so only one thread
touches the ROUTER). Every reply carries the measured time of each stage, its queueing time and
batch size, so the robot's predictor can calibrate on them.

A message that cannot be parsed at all is answered with an error (rid 0) and counted; the
server keeps serving everyone else.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import zmq

from vlarun.policy.base import Policy
from vlarun.runtime.edge_core import (  # noqa: F401 (importable from here, as they always were)
    MAX_SEEN,
    EdgeCore,
    Refused,
    ServerConfig,
    robot_id,
)
from vlarun.runtime.records import StageTiming, pack_schedule, pack_timings
from vlarun.runtime.transport import EdgeAuth, Security, router_socket
from vlarun.stages import wire
from vlarun.stages.packet import Limits, PacketError

# The ledger (the committed schedule) is pushed to every robot that asked to listen in its
# health request in the last LISTENER_TTL_S seconds, while one robot or more sent data or a
# booking in the last LEDGER_ACTIVE_S: within LEDGER_EVERY_S of every change (a request queued
# or taken, a booking held or claimed), and LEDGER_QUIET_S after the last push when nothing
# moved (the robot ages a schedule itself). A robot deciding now plans against what the edge
# holds ~20 ms ago, not at its last health answer (0.5 s). One schedule is computed per push
# for all listeners, one small message (~100 bytes per slot) each.
LEDGER_EVERY_S = 0.02
LEDGER_QUIET_S = 0.25
LEDGER_ACTIVE_S = 10.0
LISTENER_TTL_S = 10.0
MAX_LISTENERS = 256


def robot_name(to: list) -> str:
    """A robot's ZeroMQ identity, short and printable, for the refusal log."""
    return to[0].hex()[:12] if to and isinstance(to[0], bytes) else "?"


@dataclass(frozen=True)
class Route:
    """What a scale-out front puts before a relayed request (runtime/scaleout.py): its own
    request id (echoed back first, so the front finds the request without parsing the
    reply), the robot it is from (streams and batching are per robot), and the time left."""

    rid: int
    robot: bytes
    budget_s: float

    MAX_BYTES = 512

    @classmethod
    def parse(cls, raw) -> Route:
        if len(raw) > cls.MAX_BYTES:
            raise PacketError("route frame too long")
        try:
            r = msgpack.unpackb(bytes(raw), raw=False, strict_map_key=True, max_bin_len=0)
            rid, robot, budget = r["rid"], r["robot"], float(r["budget_s"])
        except Exception:
            raise PacketError("bad route frame") from None
        if not isinstance(rid, int) or not isinstance(robot, str) or not 0 < len(robot) <= 256:
            raise PacketError("bad route frame")
        return cls(rid, robot.encode(), budget)

    def pack(self) -> bytes:
        return msgpack.packb(
            {"rid": self.rid, "robot": self.robot.decode(), "budget_s": self.budget_s}
        )

    def echo(self, timings: list[StageTiming] | None = None) -> bytes:
        """The frame a reply to the front starts with: its rid (and, for results, the
        per-stage timings, so the front keeps its estimates without parsing the reply)."""
        return msgpack.packb({"rid": self.rid, "timings": pack_timings(timings or ())})


class EdgeServer(EdgeCore):
    """Serve ``policy``'s stages on ``cfg.address`` (``tcp://host:0`` picks a free port;
    ``.address`` tells which): the core plus the socket it is reached by."""

    def __init__(
        self, policy: Policy, sec: Security, cfg: ServerConfig | None = None, ctx=None
    ) -> None:
        super().__init__(policy, cfg)
        self.ctx = ctx or zmq.Context()
        self.auth = EdgeAuth(self.ctx, sec)
        self.sock = router_socket(
            self.ctx, wildcard(self.cfg.address), sec, self.cfg.max_message_bytes
        )
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.secure = not sec.insecure
        self._pipe = f"inproc://vlarun-edge-{id(self)}"
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.bind(self._pipe)
        self._threads: list[threading.Thread] = []
        self._listeners: dict[bytes, float] = {}  # identity -> last health request (monotonic)
        self._pushed_at = -math.inf
        self._pushed_version = -1

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> EdgeServer:
        for target, name in ((self._io_loop, "edge-io"), (self._work_loop, "edge-worker")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        with self.queues.cond:
            self.queues.cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        self.sock.close(0)
        self._pull.close(0)
        self.auth.stop()

    def __enter__(self) -> EdgeServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _work_loop(self) -> None:
        """The worker thread: the core's loop, answering over an inproc PUSH socket."""
        push = self.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._pipe)
        try:
            self.work(push)
        finally:
            push.close(0)

    # -- I/O thread --------------------------------------------------------------------------------

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        while not self.stop_event.is_set():
            events = dict(poller.poll(int(1e3 * LEDGER_EVERY_S) if self._listeners else 50))
            if self._pull in events:
                self._drain_replies()
            if self.sock in events:
                self._drain_requests()
            self._push_ledger(time.monotonic())

    def _push_ledger(self, now: float) -> None:
        """While robots are active, the schedule to every listener (a robot's link monitor)
        when it changed (at most every ``LEDGER_EVERY_S``) or ``LEDGER_QUIET_S`` after the
        last push: bookings and arrivals show in the other robots' plans within ~20 ms, not
        at their next health answer."""
        if now - self._pushed_at < LEDGER_EVERY_S or now - self._active_at > LEDGER_ACTIVE_S:
            return
        version = self.queues.version
        if version == self._pushed_version and now - self._pushed_at < LEDGER_QUIET_S:
            return  # nothing moved: the last push, aged by the robot, still holds
        self._listeners = {k: t for k, t in self._listeners.items() if now - t < LISTENER_TTL_S}
        if not self._listeners:
            return
        self._pushed_at, self._pushed_version = now, version
        frames = wire.control("ledger", 0, schedule=pack_schedule(self.schedule()))
        for identity in self._listeners:
            self._send([identity, *frames])

    def _drain_replies(self) -> None:
        while True:
            try:
                frames = self._pull.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            self._send(frames)

    def _drain_requests(self) -> None:
        for _ in range(256):  # bounded, so replies are not starved by a flood
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue  # no identity + header: nothing to answer to
            body = [f.buffer for f in frames[1:]]
            try:
                route = Route.parse(body.pop(0)) if self.cfg.relayed else None
            except PacketError:
                self.stats["errors"] += 1
                continue  # only the front talks to a relayed worker, and always routes
            to = [frames[0].bytes] if route is None else [frames[0].bytes, route.echo()]
            try:
                self._handle(to, route, body)
            except Refused as e:  # not an error: the robot runs it itself, in time
                self.refusal_log.refused("busy", robot_name(to), str(e))
                self._send([*to, *wire.error(rid_of(body), str(e))])
            except PacketError as e:
                self.stats["errors"] += 1
                self.refusal_log.refused("bad request", robot_name(to), str(e))
                self._send([*to, *wire.error(rid_of(body), str(e))])
            except Exception as e:  # never let one message take the server down
                self.stats["errors"] += 1
                self._send([*to, *wire.error(rid_of(body), f"internal: {type(e).__name__}")])

    def _send(self, frames: list) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)

    def _handle(self, to: list[bytes], route: Route | None, body: list) -> None:
        """``to``: the frames a reply starts with (the peer's identity, then the front's route
        when relayed)."""
        now = time.monotonic()
        header = wire.decode_header(body[0], self.cfg.limits)
        if header.kind == "control":
            self.stats["control"] += 1
            if header.meta.get("op") == "book":
                origin = to[0] if route is None else route.robot
                self._send([*to, *self.book(origin, header, now)])
                return
            # A robot's link monitor asks for health with ``listen``: it hears the ledger for
            # LISTENER_TTL_S from now (a relayed worker's peer is the front, which does not).
            room = len(self._listeners) < MAX_LISTENERS or to[0] in self._listeners
            if header.meta.get("listen") is True and route is None and room:
                self._listeners[to[0]] = now
            self._send([*to, *self._control(header)])
            return
        if header.kind != "data":
            raise PacketError(f"the edge accepts data and control messages, not {header.kind!r}")
        origin = to[0] if route is None else route.robot
        self.accept(to, origin, header, body[1:], now, route)

    def _control(self, header: wire.Header) -> list[bytes]:
        return control_reply(header, self.health)


def control_reply(header: wire.Header, health: Callable[[], dict]) -> list[bytes]:
    """The answer to a control message, the same from one edge and from a scale-out front."""
    op = header.meta.get("op")
    if op in ("health", "ping"):
        return wire.control("health", header.rid, **health())
    if op == "probe":  # bandwidth probe: the padding was read and is dropped unparsed
        return wire.control("probe", header.rid, ok=True)
    return wire.error(header.rid, f"unknown control op {op!r:.40}")


def wildcard(address: str) -> str:
    """ZeroMQ spells "any free port" as '*'; accept the usual ':0' too."""
    return address[:-2] + ":*" if address.endswith(":0") else address


def rid_of(body: list) -> int:
    """Best-effort request id of a message that failed validation (0 if unreadable)."""
    import msgpack

    try:
        if len(body[0]) > Limits().max_header_bytes:
            return 0
        rid = msgpack.unpackb(bytes(body[0]), raw=False).get("rid", 0)
        return rid if isinstance(rid, int) and 0 <= rid < 2**63 else 0
    except Exception:
        return 0
