"""The edge server: the edge's core (``runtime/edge/core.py``: admission, bookings, the
seen-robots table, health) over its local worker (``runtime/edge/local_worker.py``: stage queues,
streams, the worker thread), served over one ROUTER socket. This file is the I/O only: frames
in, the core's typed requests and answers, frames out.

Two threads. The I/O thread owns the ROUTER socket: it answers control messages (health,
bookings) at once, never behind model work, validates every data message (header against
limits and the stage schema first, the core's admission next, tensors only after) and answers
a bad one with an error, then hands good requests to the worker's stage queues. The worker
thread (``LocalWorker.work``) takes batches, runs one stage, moves each request on to its next
stage or hands the finished request back here, where it is encoded and passed to the I/O
thread over an inproc socket (ZeroMQ sockets are not thread-safe, so only one thread touches
the ROUTER). Every reply carries the measured time of each stage, its queueing time and batch
size, so the robot's predictor can calibrate on them.

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
import torch
import zmq

from vlarun.policy.base import Policy
from vlarun.runtime.edge.core import (  # noqa: F401 (importable from here, as they always were)
    MAX_SEEN,
    DataRequest,
    EdgeCore,
    EdgeRecords,
    Refused,
    ServerConfig,
    robot_id,
)
from vlarun.runtime.edge.local_worker import LocalWorker
from vlarun.runtime.edge.queues import Job
from vlarun.runtime.edge.refusal_log import RefusalLog
from vlarun.runtime.edge.zap import EdgeAuth
from vlarun.runtime.protocol import (
    RecordError,
    StageTiming,
    pack_schedule,
    pack_timings,
)
from vlarun.runtime.segments import Schema
from vlarun.runtime.transport import Security, peer_key, router_socket
from vlarun.sched.bookings import Booking, Slot
from vlarun.stages import wire
from vlarun.stages.packet import Limits, Packet, PacketError

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
    """What a scale-out front puts before a relayed request (runtime/scaleout/front.py): its own
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


class EdgeServer:
    """Serve ``policy``'s stages on ``cfg.address`` (``tcp://host:0`` picks a free port;
    ``.address`` tells which): the core and its local worker, and the socket they are reached
    by. ``submit`` / ``cancel`` are the in-process door to the same queues."""

    def __init__(
        self, policy: Policy, sec: Security, cfg: ServerConfig | None = None, ctx=None
    ) -> None:
        self.cfg = cfg = cfg or ServerConfig()
        self.records = EdgeRecords(LocalWorker.COUNTERS)
        self.worker = LocalWorker(policy, cfg, self.records)
        self.schema = Schema(policy.model.cfg, self.worker.dtype, cfg.max_batch)
        self.core = EdgeCore(
            cfg,
            self.worker,
            self.records,
            model=policy.model.cfg,
            dtype=self.worker.dtype,
            stages=self.schema.names,
            secure=not sec.insecure,
        )
        # The parts, as callers have always read them off the server.
        self.policy, self.dtype, self.graph = policy, self.worker.dtype, self.worker.graph
        self.queues, self.emulator = self.worker.queues, self.worker.emulator
        self.stats, self.recent, self.events = (
            self.records.stats,
            self.records.recent,
            self.records.events,
        )
        self.secure = self.core.secure
        self.refusal_log = RefusalLog()
        self.stop_event = threading.Event()
        self.ctx = ctx or zmq.Context()
        self.auth = EdgeAuth(self.ctx, sec, cfg.refusal_hold_s)
        self.sock = router_socket(self.ctx, wildcard(cfg.address), sec, cfg.max_message_bytes)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._pipe = f"inproc://vlarun-edge-{id(self)}"
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.bind(self._pipe)
        self._threads: list[threading.Thread] = []
        self._listeners: dict[bytes, float] = {}  # identity -> last health request (monotonic)
        self._pushed_at = -math.inf
        self._pushed_version = -1

    def warmup(self, text_tokens: int = 12) -> None:
        self.worker.warmup(text_tokens)

    def schedule(self, limit: int = 64) -> list[Slot]:
        return self.core.schedule(limit)

    def health(self) -> dict:
        return self.core.health()

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

    # -- in-process requests ----------------------------------------------------------------------

    def submit(
        self,
        tensors: dict[str, torch.Tensor],
        want: tuple[str, ...],
        budget_s: float,
        origin: bytes,
        done: Callable[[dict | None, str | None, list[StageTiming]], None],
        admit: bool = False,
    ) -> Job:
        """An in-process request for the whole graph (`vlarun serve-policy`'s clients): the
        same queues, batching and worker as robots' requests over the socket.
        ``done(outputs, error, timings)`` is called on the worker thread, unless the request
        is cancelled first (``cancel``). ``admit``: raise ``Refused`` at once when the request
        is predicted to miss ``budget_s`` (a whole-policy client has no local fallback, but a
        "busy" now beats an expiry later). Returns the job, the handle ``cancel`` takes."""
        names = self.schema.names
        missing = {s.name for s in self.graph.graph_inputs} - set(tensors)
        if missing:
            raise ValueError(f"submit needs the graph inputs {sorted(missing)}")
        now = time.monotonic()
        if admit:
            self.core.place(names, now + budget_s, now, enforce=True)
        job = Job(
            identity=b"",
            rid=0,
            stages=names,
            want=want,
            pool=dict(tensors),
            arrival=now,
            deadline=now + budget_s,
            origin=origin,
        )
        job.done = done
        self.core.touch(origin, now)
        self.records.count("requests")
        self.worker.put(job)
        return job

    def cancel(self, job: Job) -> None:
        """Drop an in-process request whose client has gone (``LocalWorker.cancel``)."""
        self.worker.cancel(job)

    # -- worker thread -----------------------------------------------------------------------------

    def _work_loop(self) -> None:
        """The worker thread: the local worker's loop, its answers encoded here and passed to
        the I/O thread over an inproc PUSH socket (only that thread sends on the ROUTER)."""
        push = self.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._pipe)

        def answer(job: Job, error: str | None) -> None:
            if error is not None:
                push.send_multipart([*job.address(), *wire.error(job.rid, error)])
            else:
                push.send_multipart([*job.address(with_timings=True), *self._reply(job)])

        try:
            self.worker.work(self.stop_event, answer, self.core.active)
        finally:
            push.close(0)

    def _reply(self, job: Job) -> list[bytes]:
        """A finished request's result frames: the outputs it wants, its stage timings and
        the committed schedule (the robot's next plan is made against it)."""
        packet = Packet({n: job.pool[n] for n in job.want})
        meta = {
            "timings": pack_timings(job.timings),
            "server_s": time.monotonic() - job.arrival,
            "schedule": pack_schedule(self.core.schedule()),
        }
        emu = self.emulator  # an emulated edge answers with the real model's packet size
        pad = 0 if emu is None else emu.pad_bytes(job.stages, "out", packet.nbytes)
        msg = wire.Message(
            "result", rid=job.rid, stage="+".join(job.stages), meta=meta, packet=packet, pad=pad
        )
        return wire.encode(msg, wire.Codec(**job.reply_codec))

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
        if now - self._pushed_at < LEDGER_EVERY_S or now - self.core.active_at > LEDGER_ACTIVE_S:
            return
        version = self.queues.version
        if version == self._pushed_version and now - self._pushed_at < LEDGER_QUIET_S:
            return  # nothing moved: the last push, aged by the robot, still holds
        self._listeners = {k: t for k, t in self._listeners.items() if now - t < LISTENER_TTL_S}
        if not self._listeners:
            return
        self._pushed_at, self._pushed_version = now, version
        frames = wire.control("ledger", 0, schedule=pack_schedule(self.core.schedule()))
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
                self.records.count("errors")
                continue  # only the front talks to a relayed worker, and always routes
            to = [frames[0].bytes] if route is None else [frames[0].bytes, route.echo()]
            # The robot's authenticated key (not a relayed worker's peer: that is the front,
            # whose route names the robot).
            key = peer_key(frames[1]) if route is None else None
            try:
                self._handle(to, route, body, key)
            except Refused as e:  # not an error: the robot runs it itself, in time
                self.refusal_log.refused("busy", robot_name(to), str(e))
                self._send([*to, *wire.error(rid_of(body), str(e))])
            except PacketError as e:
                self.records.count("errors")
                self.refusal_log.refused("bad request", robot_name(to), str(e))
                self._send([*to, *wire.error(rid_of(body), str(e))])
            except Exception as e:  # never let one message take the server down
                self.records.count("errors")
                self._send([*to, *wire.error(rid_of(body), f"internal: {type(e).__name__}")])

    def _send(self, frames: list) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)

    def _handle(
        self, to: list[bytes], route: Route | None, body: list, key: bytes | None = None
    ) -> None:
        """``to``: the frames a reply starts with (the peer's identity, then the front's route
        when relayed); ``key``: the robot's authenticated key (None: its connection is the
        robot)."""
        now = time.monotonic()
        header = wire.decode_header(body[0], self.cfg.limits)
        origin = to[0] if route is None else route.robot
        holder = origin if key is None else key  # whose share, bookings and seen-table row
        if header.kind == "control":
            self.records.count("control")
            # A robot's link monitor asks for health with ``listen``: it hears the ledger for
            # LISTENER_TTL_S from now (a relayed worker's peer is the front, which does not).
            room = len(self._listeners) < MAX_LISTENERS or to[0] in self._listeners
            if header.meta.get("listen") is True and route is None and room:
                self._listeners[to[0]] = now
            self._send([*to, *control_reply(header, self.core, holder, now)])
            return
        if header.kind != "data":
            raise PacketError(f"the edge accepts data and control messages, not {header.kind!r}")
        req = self.schema.check(header)  # the header alone: nothing is allocated yet
        budget = req.budget_s if route is None else route.budget_s
        admitted = self.core.admit(DataRequest(origin, req.stages, budget, key=key), now)
        msg = wire.materialize(header, body[1:], self.cfg.limits)  # admitted: now the tensors
        tensors = dict(msg.packet.tensors)
        self.schema.check_values(tensors)  # NaN / inf, lengths and ids: before any model work
        job = Job(
            identity=to[0],
            rid=header.rid,
            stages=req.stages,
            want=req.want,
            pool=tensors,
            arrival=now,
            deadline=admitted.deadline,
            reply_codec=req.reply_codec,
            origin=origin,
            key=holder,
            route=route,
        )
        self.worker.bind(job, req, header.meta.get("stream"))
        self.records.count("requests")
        self.worker.put(job)


def control_reply(header: wire.Header, core: EdgeCore, key: bytes, now: float) -> list[bytes]:
    """The answer to a control message from robot ``key`` (its authenticated key, else its
    connection), the same from one edge and from a scale-out front: both hold their bookings
    in their core."""
    op = header.meta.get("op")
    if op in ("health", "ping"):
        return wire.control("health", header.rid, **core.health())
    if op == "probe":  # bandwidth probe: the padding was read and is dropped unparsed
        return wire.control("probe", header.rid, ok=True)
    if op == "book":  # a robot's plan, announced when chosen (``Booking``)
        try:
            booking = Booking.from_wire(header.meta, core.stages)
        except RecordError as e:
            raise PacketError(f"bad booking: {e}") from None
        return wire.control("book", header.rid, ok=core.book(key, booking, now))
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
