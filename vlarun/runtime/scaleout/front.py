"""Edge scale-out on Ray: one robot-facing front, many edge workers, deadline-aware dispatch.

    robots --ZeroMQ ROUTER, CurveZMQ, the wire codec--> EdgeFront
    EdgeFront --one DEALER per worker, CurveZMQ--> worker = EdgeServer(relayed) in a Ray actor

What stays as it was: the robot-facing socket, its keys, the header and schema checks before any
allocation, per-request deadlines, per-stage queues and batching (each worker is an unchanged
``EdgeServer``: its batches form per worker). What Ray does: it places one worker per ``edge``
resource (one per GPU or machine), restarts a worker that dies, and carries each worker
incarnation's endpoint and public key to the front over its own token-authenticated control
plane (Ray >= 2.59 turns token authentication on for local clusters; keep it on).

What Ray does not carry: the payloads. A Ray actor call measured 1.3 ms for 100 bytes and 6.4 ms
one way for a 197 kB frame on this 2-core machine (objects over 100 kB go through the object
store), against the issue's 1 ms budget for the whole hop. So the front relays the robot's raw
wire frames over ZeroMQ to the worker, untouched, after a small route frame of its own
(``server.Route``: the front's request id, the robot the request is from, so streams and
batching stay per robot, and the time left). The worker echoes the route first in its reply
(with the stage timings), so the front forwards the robot's reply untouched too. Nothing a robot
sent is ever unpickled: the frames are bytes, and the worker checks them against the stage
schema before it allocates anything. Front-to-worker sockets on other machines are
Curve too: each worker incarnation makes a key pair and admits only the front's public key; the
front makes its own per start; secret keys never leave their process. A worker on the front's
own machine binds a Unix socket in the front's private folder (mode 0700) instead: only this
user can open it (as only this user can read Ray's token), and the payload is not encrypted
twice on its way through one machine.

Admission, bookings, the seen-robots table and health are the edge core's
(``runtime/edge/core.py``), the same object one ``EdgeServer`` holds; its backend here is
the pool of workers (``runtime/scaleout/worker_pool.py``), which predicts, per live worker, when
a request would finish (the one queue model over its flights and bookings).
The front sends the request
to the earliest (an accelerated stream stays on the worker holding its KV cache when that one
is in time too); the core refuses it at once, as on one edge, when even the earliest would
finish after the deadline: the robot hears it and runs the segment itself. Bookings are held
by the core too (placed on the worker their request is predicted to go to), so a robot's plan
booked through the front is in every other robot's quote, as on one edge.

Failure: a worker's loss is seen on its socket (ZeroMQ reports the TCP disconnect at once) and by
Ray (the actor's lifetime call fails). Its in-flight requests are re-dispatched when another
worker can still finish them in time, and refused at once otherwise, so none is lost and none is
answered after its deadline by the front's choice. Ray restarts the actor; the front picks up its
new endpoint and key and sends to it again.

Ray is an optional extra (``pip install vlarun[scale]``); this module imports it only when
workers are started.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import queue
import threading
import time

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from vlarun.policy.setting import AccelSetting
from vlarun.runtime.edge.core import (
    DataRequest,
    EdgeCore,
    EdgeRecords,
    Refused,
    ServerConfig,
    late,
)
from vlarun.runtime.edge.server import Route, control_reply, rid_of, wildcard
from vlarun.runtime.edge.zap import EdgeAuth
from vlarun.runtime.protocol import RecordError, parse_timings
from vlarun.runtime.scaleout.ray_workers import RayWorkers
from vlarun.runtime.scaleout.worker_pool import (  # noqa: F401 (dispatch_order: importable from here)
    Flight,
    Worker,
    WorkerPool,
    dispatch_order,
)
from vlarun.runtime.segments import Schema
from vlarun.runtime.transport import Security, dealer_socket, peer_key, router_socket
from vlarun.stages import wire
from vlarun.stages.packet import PacketError


def disconnect(w: Worker) -> None:
    """Close worker ``w``'s socket and its monitor (the front's I/O thread); it is down."""
    if w.sock is not None:
        with contextlib.suppress(zmq.ZMQError):
            w.sock.disable_monitor()
        w.monitor.close(0)
        w.sock.close(0)
    w.sock = w.monitor = None
    w.up = False


class EdgeFront:
    """The robot-facing endpoint of a scale-out edge: the same socket, checks, core (admission,
    bookings, health) and reply contract as one ``EdgeServer``, with ``workers`` behind it.
    ``cfg.max_batch`` must match the workers' (it bounds the batch a request may claim)."""

    def __init__(
        self, workers: RayWorkers, sec: Security, cfg: ServerConfig | None = None, ctx=None
    ) -> None:
        self.cfg = cfg or ServerConfig()
        self.workers = workers
        self.ctx = ctx or zmq.Context()
        hellos = [workers.hello(i, 600.0) for i in range(len(workers.actors))]
        first = hellos[0]
        self.model_cfg, self.dtype = first["cfg"], first["dtype"]
        self.schema = Schema(self.model_cfg, self.dtype, self.cfg.max_batch)
        self.auth = EdgeAuth(self.ctx, sec, self.cfg.refusal_hold_s)
        self.sock = router_socket(
            self.ctx, wildcard(self.cfg.address), sec, self.cfg.max_message_bytes
        )
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        try:  # a cluster meant for loopback that listens elsewhere is refused (ray_workers.py)
            workers.check(own_ports=(int(self.address.rsplit(":", 1)[1]),))
        except BaseException:
            self.sock.close(0)
            self.auth.stop()
            raise
        self._pipe = f"inproc://vlarun-front-{id(self)}"
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.bind(self._pipe)
        self.pool = WorkerPool(len(hellos), self.schema.names, self.cfg, workers.auth_mode)
        for w, h in zip(self.pool.workers, hellos, strict=True):
            self._connect(w, h)
        self.records = EdgeRecords(WorkerPool.COUNTERS)
        self.core = EdgeCore(
            self.cfg,
            self.pool,
            self.records,
            model=self.model_cfg,
            dtype=self.dtype,
            stages=self.schema.names,
            secure=not sec.insecure,
        )
        self.secure = self.core.secure
        self.stats, self.recent, self.events = (
            self.records.stats,
            self.records.recent,
            self.records.events,
        )
        self.stop_event = threading.Event()
        self._rids = itertools.count(1)
        self._threads: list[threading.Thread] = []

    def health(self) -> dict:
        """One edge's health contract (``EdgeCore.health``): ``queue``, ``stage_ms`` and
        ``schedule`` are those of the worker a request sent now would go to, so a robot's
        scheduler sees the capacity it would get; ``capacity`` counts live workers,
        ``workers`` lists each one."""
        return self.core.health()

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> EdgeFront:
        supervisor = functools.partial(
            supervise, self.workers, self.ctx, self._pipe, self.stop_event
        )
        for target, name in ((self._io_loop, "front-io"), (supervisor, "front-ray")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=5)
        for w in self.pool.workers:
            disconnect(w)
        self.sock.close(0)
        self._pull.close(0)
        self.auth.stop()
        self.workers.shutdown()

    def __enter__(self) -> EdgeFront:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.pool.workers]

    # -- worker sockets (I/O thread) ---------------------------------------------------------------

    def _connect(self, w: Worker, hello: dict) -> None:
        disconnect(w)
        if hello["public"] is None:  # a Unix socket in the front's private folder
            sec = Security(insecure=True)
        else:
            sec = Security(own=self.workers.front, server_public=hello["public"])
        w.sock = dealer_socket(self.ctx, hello["endpoint"], sec)
        w.monitor = w.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        w.endpoint, w.pid = hello["endpoint"], hello["pid"]
        w.incarnation += 1
        now = time.monotonic()
        for stage, ms in hello.get("stage_ms", {}).items():  # its warm-up measurement
            w.times.est_s[stage], w.times.est_at[stage] = ms * 1e-3, now
        w.up = True

    # -- I/O thread --------------------------------------------------------------------------------

    def _io_loop(self) -> None:
        poller, sockets, swept = None, None, 0.0
        while not self.stop_event.is_set():
            now_socks = [(w.sock, w.monitor) for w in self.pool.workers]
            if now_socks != sockets:  # rebuilt only when a worker's sockets came or went
                sockets, poller = now_socks, zmq.Poller()
                for sock in (self.sock, self._pull, *(x for pair in now_socks for x in pair)):
                    if sock is not None:
                        poller.register(sock, zmq.POLLIN)
            events = dict(poller.poll(20))
            if self._pull in events:
                self._supervisor_news()
            for w in self.pool.workers:
                if w.monitor is not None and w.monitor in events:
                    self._monitor_event(w)
                if w.sock is not None and w.sock in events:
                    self._drain_worker(w)
            if self.sock in events:
                self._drain_requests()
            now = time.monotonic()
            if now - swept > 0.01:  # flights past their deadline: a sweep every 10 ms is enough
                self._expire(now)
                swept = now

    def _drain_requests(self) -> None:
        for _ in range(256):  # bounded, so workers' replies are not starved by a flood
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            identity = frames[0].bytes
            # The frames themselves, not views of them: sending a zmq.Frame on shares its
            # message (no copy, and none of pyzmq's garbage-collector-thread round trip that a
            # zero-copy send of a Python buffer costs).
            body = frames[1:]
            try:
                self._handle(identity, body)
            except PacketError as e:  # Refused included: answered at once, the robot runs it
                if not isinstance(e, Refused):
                    self.records.count("errors")
                self._send(identity, wire.error(rid_of([body[0].bytes]), str(e)))
            except Exception as e:  # never let one message take the front down
                self.records.count("errors")
                why = f"internal: {type(e).__name__}"
                self._send(identity, wire.error(rid_of([body[0].bytes]), why))

    def _send(self, identity: bytes, frames: list) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)

    def _handle(self, identity: bytes, body: list) -> None:
        now = time.monotonic()
        header = wire.decode_header(body[0].bytes, self.cfg.limits)
        key = peer_key(body[0])  # the robot's authenticated key: its share, as on one edge
        holder = identity if key is None else key
        if header.kind == "control":
            self.records.count("control")
            self._send(identity, control_reply(header, self.core, holder, now))
            return
        if header.kind != "data":
            raise PacketError(f"the edge accepts data and control messages, not {header.kind!r}")
        # What dispatch needs; the worker checks the rest (schema, shapes, codec) before it
        # allocates anything, and its error comes back to the robot like any reply. The front
        # itself never allocates a tensor: the frames are already here, bounded by the socket.
        stages = self.schema.parse_stages(header.stage)
        try:
            setting = AccelSetting.from_meta(header.meta.get("setting"))
        except (TypeError, ValueError) as e:
            raise PacketError(f"bad setting: {e}") from None
        stream = None if setting.identity else (identity, header.meta.get("stream"))
        req = DataRequest(identity, stages, header.deadline_s, stream, key)
        admitted = self.core.admit(req, now)
        flight = Flight(
            identity,
            header.rid,
            body,
            stages,
            str(setting),
            now,
            admitted.deadline,
            stream,
            key=holder,
        )
        if not self._dispatch(flight, admitted.quotes, now):  # no admitted worker took it
            why = late(min(q.finish for q in admitted.quotes), admitted.deadline, now)
            raise self.core.refuse(why, stages, now)
        self.records.count("requests")

    def _dispatch(self, f: Flight, quotes, now: float) -> bool:
        """Send ``f`` to the first of the admitted workers (``quotes``, in order) that takes it."""
        for q in quotes:
            f.predicted = q.finish
            if self._forward(self.pool.workers[q.worker], f, now):
                return True
        return False

    def _forward(self, w: Worker, f: Flight, now: float) -> bool:
        rid = next(self._rids)
        route = Route(rid, f.identity.hex().encode(), max(f.deadline - now, 1e-6)).pack()
        try:  # the robot's own frames, untouched, after the route
            w.sock.send_multipart([route, *f.body], zmq.NOBLOCK, copy=False)
        except zmq.Again:  # not connected (yet, or any more): the next worker
            return False
        self.pool.sent(w, rid, f)
        return True

    def _drain_worker(self, w: Worker) -> None:
        for _ in range(256):
            try:
                frames = w.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:  # the route the worker echoed: our rid (and a result's timings)
                echo = msgpack.unpackb(frames[0].bytes, raw=False)
                f = w.flights.pop(echo["rid"], None)
            except Exception:
                continue  # a worker's garbage: the flight stays and expires or is re-sent
            if f is None:
                continue  # already answered (expired, or re-dispatched after a loss)
            now = time.monotonic()
            try:  # a worker's bad timings cost its estimates an update, never the reply
                timings = parse_timings(echo.get("timings") or [], f.stages)
            except RecordError:
                timings = ()
            self.pool.answered(w, f, timings, now)
            if timings:
                self.records.reply(
                    now, f.key, f.stages, f.setting, f.arrival, f.deadline, timings, worker=w.index
                )
            if now > f.deadline:
                self.records.count("late")
            self._send(f.identity, frames[1:])  # the robot's reply, untouched

    def _expire(self, now: float) -> None:
        """Answer flights whose deadline passed without a reply: the robot has run them itself
        (or is told to now), and no reply will follow."""
        for f in self.pool.expired(now):
            self.records.count("expired")
            self._send(f.identity, wire.error(f.rid, "deadline passed on the edge"))

    def _monitor_event(self, w: Worker) -> None:
        try:
            event = recv_monitor_message(w.monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        if event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED) and w.up:
            self._lost(w, "disconnected")

    def _lost(self, w: Worker, why: str) -> None:
        """Worker ``w`` is gone: re-dispatch what it held when a live worker can still make
        its deadline (the core's rule, counted as ``lost_refused`` when none can), or refuse
        it at once."""
        now = time.monotonic()
        disconnect(w)
        self.records.count("worker_down")
        self.records.event(now, "worker-down", f"worker {w.index}")
        for f in self.pool.lost(w, now):
            try:
                quotes = self.core.place(
                    f.stages, f.deadline, now, f.stream, counter="lost_refused"
                )
            except Refused as e:
                self._send(f.identity, wire.error(f.rid, str(e)))
                continue
            if self._dispatch(f, quotes, now):
                self.records.count("redispatched")
            else:
                why = late(min(q.finish for q in quotes), f.deadline, now)
                e = self.core.refuse(why, f.stages, now, "lost_refused")
                self._send(f.identity, wire.error(f.rid, str(e)))
        logging.getLogger(__name__).info("worker %d lost (%s)", w.index, why)

    def _supervisor_news(self) -> None:
        while True:
            try:
                raw = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            news = msgpack.unpackb(raw, raw=False)
            w = self.pool.workers[news["i"]]
            if news["op"] == "down" and w.up:
                self._lost(w, "ray: actor died")
            elif news["op"] == "up":
                self._connect(w, news)
                self.records.count("worker_up")
                self.records.event(time.monotonic(), "worker-up", f"worker {w.index}")


# -- supervisor thread (Ray calls) -------------------------------------------------------------


def supervise(workers: RayWorkers, ctx, pipe: str, stop_event: threading.Event) -> None:
    """The front's supervisor thread (Ray calls): watch every worker's lifetime through Ray;
    after a death, wait for Ray's restart and hand the new incarnation's hello to the I/O
    thread (over ``pipe``), until ``stop_event``. Deaths arrive as callbacks of the lifetime
    calls' futures: nothing polls Ray while all workers live."""
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(pipe)
    deaths: queue.SimpleQueue[int] = queue.SimpleQueue()

    def watch(i: int) -> None:
        workers.lifetime(i).future().add_done_callback(lambda _: deaths.put(i))

    for i in range(len(workers.actors)):
        watch(i)
    restarting: set[int] = set()
    try:
        while not stop_event.is_set():
            try:
                i = deaths.get(timeout=0.2 if restarting else 0.5)
                push.send(msgpack.packb({"op": "down", "i": i}))
                restarting.add(i)
            except queue.Empty:
                pass
            for i in list(restarting):
                try:
                    hello = workers.hello(i, 0.5)
                except Exception:  # still restarting (or gone): try again
                    continue
                restarting.discard(i)
                watch(i)
                keep = ("endpoint", "public", "pid", "stage_ms")
                news = {"op": "up", "i": i, **{k: hello[k] for k in keep}}
                push.send(msgpack.packb(news, use_bin_type=True))
    finally:
        push.close(0)
