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

Dispatch: for each request the front predicts, per live worker, when it would finish: the one
queue model (``sched.queue_model``, the worker's own rule played forward) over every request in
flight there and this one, each stage at its per-request time (from the stage times the
worker's replies report, EWMA; its warm-up measurement to begin with). It
sends the request to the earliest (an accelerated stream stays on the worker holding its KV
cache when that one is in time too) and refuses it at once, as one edge does, when even the
earliest would finish after the deadline: the robot hears it and runs the segment itself.

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
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from vlarun.policy.setting import AccelSetting
from vlarun.runtime.ray_workers import RayWorkers
from vlarun.runtime.records import (
    RecordError,
    ScheduleSlot,
    StageTiming,
    pack_schedule,
    parse_timings,
)
from vlarun.runtime.segments import Schema
from vlarun.runtime.server import (
    Refused,
    Route,
    ServerConfig,
    control_reply,
    rid_of,
    robot_id,
    wildcard,
)
from vlarun.runtime.transport import EdgeAuth, Security, dealer_socket, router_socket
from vlarun.sched.queue_model import THIS, EdgeQueue, Pending, StageTimes, finish, play
from vlarun.stages import wire
from vlarun.stages.packet import PacketError

# ---------------------------------------------------------------------------------------------
# The front


def dispatch_order(finish: dict[int, float], sticky: int | None, deadline: float) -> list[int]:
    """The front's rule, as one function its projection (``bench.scaleout.simulate``) calls
    too: workers in the order of their predicted finish (each worker's forecast plus its lag),
    except that the worker holding the request's stream (its KV cache) goes first whenever it
    can still finish by the deadline."""
    order = sorted(finish, key=finish.__getitem__)
    if sticky is not None and sticky in finish and finish[sticky] <= deadline:
        order.sort(key=lambda i: i != sticky)
    return order


@dataclass
class _Flight:
    """A robot request the front has sent to a worker and not yet answered."""

    identity: bytes
    rid: int  # the robot's request id
    body: list  # the robot's frames (zmq.Frame, header first), kept for a re-dispatch
    stages: tuple[str, ...]
    setting: str
    arrival: float
    deadline: float
    stream: tuple | None
    worker: int = -1
    predicted: float = 0.0  # when the front predicted the worker would answer (monotonic)


@dataclass
class _Worker:
    """The front's view of one worker (touched by the I/O thread only)."""

    index: int
    sock: zmq.Socket | None = None
    monitor: zmq.Socket | None = None
    up: bool = False
    pid: int = 0
    endpoint: str = ""
    incarnation: int = 0
    times: StageTimes = field(default_factory=StageTimes)  # as the worker measures them
    flights: dict[int, _Flight] = field(default_factory=dict)  # front rid -> flight
    replies: int = 0
    max_batch: int = 8  # the worker's (``ServerConfig.max_batch``): the model batches as it does
    # How much later than predicted its answers come (EWMA, >= 0): what the stage times miss
    # when the worker's machine gets busier (on a shared machine: a neighbour's restart).
    lag_s: float = 0.0

    def work_s(self, stages) -> float:
        return self.times.work_s(stages)

    def seconds(self, stages) -> tuple[float, ...]:
        """Each stage's estimated per-request time here (0 for a stage never measured)."""
        return self.times.seconds(stages)

    def load_s(self) -> float:
        """Predicted seconds of the work in flight here (conservative: every flight counts
        whole, whatever part of it has run)."""
        return sum(self.work_s(f.stages) for f in list(self.flights.values()))

    def queue(self, now: float) -> EdgeQueue:
        """The worker's queues as the front sees them, for the one queue model: every flight
        queued now for all of its stages (what has run of a request is not known here, so
        each counts whole: conservative), each stage at the estimated per-request time."""
        q = EdgeQueue(self.max_batch, now)
        for f in list(self.flights.values()):
            q.add(Pending(ready=now, deadline=f.deadline, origin=robot_id(f.identity),
                          stages=f.stages, seconds=self.seconds(f.stages)))  # fmt: skip
        return q

    def schedule(self, limit: int = 64) -> list[ScheduleSlot]:
        """This worker's committed schedule as the front sees it (the contract of
        ``EdgeServer.schedule``): its flights played forward by the worker's rule."""
        now = time.monotonic()
        return [ScheduleSlot.of(s, now) for s in play(self.queue(now), limit)]

    def finish(
        self, now: float, stages: tuple[str, ...], deadline: float,
        seconds: tuple[float, ...] | None = None,
    ) -> float:  # fmt: skip
        """When a request for ``stages`` due at ``deadline``, sent now, would finish here
        (``seconds``: its stages' times, when not this worker's estimates)."""
        q = self.queue(now)
        own = self.seconds(stages) if seconds is None else seconds
        q.add(Pending(ready=now, deadline=deadline, origin=THIS, stages=stages, seconds=own,
                      key=THIS))  # fmt: skip
        end = finish(q, THIS)
        return now if end is None else end

    def fresh(self, stages, within_s: float) -> bool:
        return self.times.fresh_at(stages, within_s, time.monotonic())

    def observe(self, timings: tuple[StageTiming, ...]) -> None:
        now = time.monotonic()
        for t in timings:
            self.times.measured(t.stage, t.compute_s, t.batch, now)


class EdgeFront:
    """The robot-facing endpoint of a scale-out edge: the same socket, checks, health and reply
    contract as one ``EdgeServer``, with ``workers`` behind it. ``cfg.max_batch`` must match
    the workers' (it bounds the batch a request may claim)."""

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
        self.auth = EdgeAuth(self.ctx, sec)
        self.sock = router_socket(
            self.ctx, wildcard(self.cfg.address), sec, self.cfg.max_message_bytes
        )
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.secure = not sec.insecure
        try:  # a cluster meant for loopback that listens elsewhere is refused (ray_workers.py)
            workers.check(own_ports=(int(self.address.rsplit(":", 1)[1]),))
        except BaseException:
            self.sock.close(0)
            self.auth.stop()
            raise
        self._pipe = f"inproc://vlarun-front-{id(self)}"
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.bind(self._pipe)
        self._w = [_Worker(i, max_batch=self.cfg.max_batch) for i in range(len(hellos))]
        for w, h in zip(self._w, hellos, strict=True):
            self._connect(w, h)
        self.stop_event = threading.Event()
        self.stats = {"requests": 0, "replies": 0, "errors": 0, "control": 0, "expired": 0,
                      "refused": 0, "redispatched": 0, "lost_refused": 0, "late": 0,
                      "worker_down": 0, "worker_up": 0, "compute_s": 0.0}  # fmt: skip
        self._rids = itertools.count(1)
        self._affinity: OrderedDict[tuple, int] = OrderedDict()  # (robot, stream) -> worker
        self._seen: dict[bytes, float] = {}
        self.recent: deque[dict] = deque(maxlen=2048)
        self.events: deque[dict] = deque(maxlen=512)
        self.started = time.monotonic()
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> EdgeFront:
        for target, name in ((self._io_loop, "front-io"), (self._supervise, "front-ray")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=5)
        for w in self._w:
            self._disconnect(w)
        self.sock.close(0)
        self._pull.close(0)
        self.auth.stop()
        self.workers.shutdown()

    def __enter__(self) -> EdgeFront:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._w]

    # -- worker sockets (I/O thread) ---------------------------------------------------------------

    def _connect(self, w: _Worker, hello: dict) -> None:
        self._disconnect(w)
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

    def _disconnect(self, w: _Worker) -> None:
        if w.sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                w.sock.disable_monitor()
            w.monitor.close(0)
            w.sock.close(0)
        w.sock = w.monitor = None
        w.up = False

    # -- I/O thread --------------------------------------------------------------------------------

    def _io_loop(self) -> None:
        poller, sockets, swept = None, None, 0.0
        while not self.stop_event.is_set():
            now_socks = [(w.sock, w.monitor) for w in self._w]
            if now_socks != sockets:  # rebuilt only when a worker's sockets came or went
                sockets, poller = now_socks, zmq.Poller()
                for sock in (self.sock, self._pull, *(x for pair in now_socks for x in pair)):
                    if sock is not None:
                        poller.register(sock, zmq.POLLIN)
            events = dict(poller.poll(20))
            if self._pull in events:
                self._supervisor_news()
            for w in self._w:
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
                    self.stats["errors"] += 1
                self._send(identity, wire.error(rid_of([body[0].bytes]), str(e)))
            except Exception as e:  # never let one message take the front down
                self.stats["errors"] += 1
                why = f"internal: {type(e).__name__}"
                self._send(identity, wire.error(rid_of([body[0].bytes]), why))

    def _send(self, identity: bytes, frames: list) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)

    def _handle(self, identity: bytes, body: list) -> None:
        now = time.monotonic()
        header = wire.decode_header(body[0].bytes, self.cfg.limits)
        if header.kind == "control":
            self.stats["control"] += 1
            self._send(identity, self._control(header))
            return
        if header.kind != "data":
            raise PacketError(f"the edge accepts data and control messages, not {header.kind!r}")
        inflight = sum(len(w.flights) for w in self._w)
        if inflight >= self.cfg.max_queued:  # refuse before keeping its frames
            raise PacketError(f"edge overloaded: {inflight} requests in flight")
        # What dispatch needs; the worker checks the rest (schema, shapes, codec) before it
        # allocates anything, and its error comes back to the robot like any reply. The front
        # itself never allocates a tensor: the frames are already here, bounded by the socket.
        stages = self.schema.parse_stages(header.stage)
        try:
            setting = AccelSetting.from_meta(header.meta.get("setting"))
        except (TypeError, ValueError) as e:
            raise PacketError(f"bad setting: {e}") from None
        budget = min(header.deadline_s, 3600.0) if header.deadline_s > 0 else 0.0
        if len(self._seen) > 1024:
            self._seen = {k: t for k, t in self._seen.items() if now - t < 1.0}
        self._seen[identity] = now
        stream = None if setting.identity else (identity, header.meta.get("stream"))
        flight = _Flight(identity, header.rid, body, stages, str(setting), now, now + budget,
                         stream)  # fmt: skip
        self.stats["requests"] += 1
        self._dispatch(flight, now, first=True)

    def _dispatch(self, f: _Flight, now: float, first: bool, exclude: int = -1) -> bool:
        """Send ``f`` to the worker predicted to finish it first; refuse it (raise on a first
        dispatch, answer at once on a re-dispatch) when none can finish before its deadline."""
        live = [w for w in self._w if w.up and w.index != exclude]
        finish = {w.index: self._finish(w, live, f, now) + w.lag_s for w in live}
        sticky = self._affinity.get(f.stream) if f.stream is not None else None
        by_index = {w.index: w for w in live}
        for w in (by_index[i] for i in dispatch_order(finish, sticky, f.deadline)):
            if finish[w.index] > f.deadline and w.fresh(f.stages, self.cfg.admission_fresh_s):
                break  # the rest are later still
            f.predicted = finish[w.index]
            if self._forward(w, f, now):
                return True
        why = "no edge worker is up" if not live else (
            f"refused: predicted to finish "
            f"{1e3 * (min(finish.values()) - now):.1f} ms from now, the deadline is in "
            f"{1e3 * (f.deadline - now):.1f} ms"
        )  # fmt: skip
        self.stats["refused" if first else "lost_refused"] += 1
        self.events.append({"t": now, "kind": "refused", "stages": "+".join(f.stages)})
        if first:
            raise Refused(why)
        self._send(f.identity, wire.error(f.rid, why))
        return False

    def _finish(self, w: _Worker, live: list[_Worker], f: _Flight, now: float) -> float:
        """When ``w`` would finish ``f`` if sent now: the one queue model over its flights with
        ``f`` in. ``f``'s own stages at ``w``'s estimates; one not refreshed for
        ``admission_fresh_s`` counts as the best live worker's: a worker once measured slow
        (a warm-up on a busy machine) still gets a request now and then, and is measured
        again, instead of being passed over for good."""
        seconds = w.seconds(f.stages)
        if not w.fresh(f.stages, self.cfg.admission_fresh_s):
            seconds = min([seconds, *(x.seconds(f.stages) for x in live)], key=sum)
        return w.finish(now, f.stages, f.deadline, seconds)

    def _forward(self, w: _Worker, f: _Flight, now: float) -> bool:
        rid = next(self._rids)
        route = Route(rid, f.identity.hex().encode(), max(f.deadline - now, 1e-6)).pack()
        try:  # the robot's own frames, untouched, after the route
            w.sock.send_multipart([route, *f.body], zmq.NOBLOCK, copy=False)
        except zmq.Again:  # not connected (yet, or any more): the next worker
            return False
        f.worker = w.index
        w.flights[rid] = f
        if f.stream is not None:
            self._affinity[f.stream] = w.index
            self._affinity.move_to_end(f.stream)
            while len(self._affinity) > 4096:
                self._affinity.popitem(last=False)
        return True

    def _drain_worker(self, w: _Worker) -> None:
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
            w.observe(timings)
            w.lag_s = 0.7 * w.lag_s + 0.3 * max(now - f.predicted, 0.0)
            w.replies += 1
            if timings:
                self._record(w, f, timings, now)
            if now > f.deadline:
                self.stats["late"] += 1
            self._send(f.identity, frames[1:])  # the robot's reply, untouched

    def _record(self, w: _Worker, f: _Flight, timings: tuple[StageTiming, ...], now: float) -> None:
        compute_s = sum(t.share_s for t in timings)
        self.stats["replies"] += 1
        self.stats["compute_s"] += compute_s
        self.recent.append({
            "t": now, "robot": robot_id(f.identity), "stages": "+".join(f.stages),
            "setting": f.setting, "server_s": now - f.arrival, "budget_s": f.deadline - f.arrival,
            "compute_s": compute_s, "worker": w.index,
            "batch": {t.stage: t.batch for t in timings},
        })  # fmt: skip

    def _expire(self, now: float) -> None:
        """Answer and forget flights whose deadline passed without a reply: the robot has
        run them itself (or is told to now), and no reply will follow."""
        for w in self._w:
            late = [rid for rid, f in w.flights.items() if now > f.deadline + 0.05]
            for rid in late:
                f = w.flights.pop(rid)
                self.stats["expired"] += 1
                self._send(f.identity, wire.error(f.rid, "deadline passed on the edge"))

    def _monitor_event(self, w: _Worker) -> None:
        try:
            event = recv_monitor_message(w.monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        if event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED) and w.up:
            self._lost(w, "disconnected")

    def _lost(self, w: _Worker, why: str) -> None:
        """Worker ``w`` is gone: re-dispatch what it held, or refuse it at once."""
        now = time.monotonic()
        self._disconnect(w)
        self.stats["worker_down"] += 1
        self.events.append({"t": now, "kind": "worker-down", "stages": f"worker {w.index}"})
        flights, w.flights = list(w.flights.values()), {}
        for f in flights:
            self.stats["redispatched"] += self._dispatch(f, now, first=False, exclude=w.index)
        logging.getLogger(__name__).info("worker %d lost (%s)", w.index, why)

    def _supervisor_news(self) -> None:
        while True:
            try:
                raw = self._pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            news = msgpack.unpackb(raw, raw=False)
            w = self._w[news["i"]]
            if news["op"] == "down" and w.up:
                self._lost(w, "ray: actor died")
            elif news["op"] == "up":
                self._connect(w, news)
                self.stats["worker_up"] += 1
                self.events.append(
                    {"t": time.monotonic(), "kind": "worker-up", "stages": f"worker {w.index}"}
                )

    # -- supervisor thread (Ray calls) -------------------------------------------------------------

    def _supervise(self) -> None:
        """Watch every worker's lifetime through Ray; after a death, wait for Ray's restart
        and hand the new incarnation's hello to the I/O thread. Deaths arrive as callbacks
        of the lifetime calls' futures: nothing polls Ray while all workers live."""
        push = self.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._pipe)
        deaths: queue.SimpleQueue[int] = queue.SimpleQueue()

        def watch(i: int) -> None:
            self.workers.lifetime(i).future().add_done_callback(lambda _: deaths.put(i))

        for i in range(len(self.workers.actors)):
            watch(i)
        restarting: set[int] = set()
        try:
            while not self.stop_event.is_set():
                try:
                    i = deaths.get(timeout=0.2 if restarting else 0.5)
                    push.send(msgpack.packb({"op": "down", "i": i}))
                    restarting.add(i)
                except queue.Empty:
                    pass
                for i in list(restarting):
                    try:
                        hello = self.workers.hello(i, 0.5)
                    except Exception:  # still restarting (or gone): try again
                        continue
                    restarting.discard(i)
                    watch(i)
                    keep = ("endpoint", "public", "pid", "stage_ms")
                    news = {"op": "up", "i": i, **{k: hello[k] for k in keep}}
                    push.send(msgpack.packb(news, use_bin_type=True))
        finally:
            push.close(0)

    # -- health ------------------------------------------------------------------------------------

    def _control(self, header: wire.Header) -> list[bytes]:
        return control_reply(header, self.health)

    def health(self) -> dict:
        """One edge's health contract for the fleet: ``queue``, ``stage_ms`` and ``schedule``
        (the reservations a robot plans against) are those of the worker a request sent now
        would go to (the least loaded live one), so a robot's scheduler sees the capacity it
        would get; ``capacity`` counts live workers, ``workers`` lists each one."""
        live = [w for w in self._w if w.up]
        best = min(live, key=lambda w: w.load_s()) if live else None
        queue = {s: 0 for s in self.schema.names}
        if best is not None:
            for f in list(best.flights.values()):
                for s in f.stages:
                    queue[s] += 1
        workers = [
            {"worker": w.index, "up": w.up, "pid": w.pid, "endpoint": w.endpoint,
             "incarnation": w.incarnation, "in_flight": len(w.flights), "replies": w.replies,
             "load_ms": 1e3 * w.load_s(), "lag_ms": 1e3 * w.lag_s,
             "stage_ms": {k: v * 1e3 for k, v in w.times.est_s.items()}}
            for w in self._w
        ]  # fmt: skip
        return {
            "ok": bool(live),
            "model": self.model_cfg.name,
            "family": self.model_cfg.family,
            "dtype": self.dtype,
            "stages": list(self.schema.names),
            "queue": queue,
            "stage_ms": {k: v * 1e3 for k, v in best.times.est_s.items()} if best else {},
            "max_batch": self.cfg.max_batch,
            "backlog_ms": 1e3 * best.load_s() if best else 0.0,
            "schedule": pack_schedule(best.schedule()) if best else [],
            "secure": self.secure,
            "uptime_s": time.monotonic() - self.started,
            "capacity": len(live),
            "workers": workers,
            "ray_auth": self.workers.auth_mode,
            **self.stats,
        }
