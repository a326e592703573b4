"""The edge's core: per-stage queues, admission, bookings, accelerated streams, the worker
that batches and runs stages, and the records of what it served. No socket: the edge server
(``runtime/server.py``) feeds it decoded requests from its I/O thread and hands its answers on,
as vLLM keeps its ZMQ threads apart from ``EngineCore``. This is the file to change how the
edge admits, orders, batches and runs work.

Admission: a request the edge cannot finish before its deadline is refused on arrival, not
queued to expire: predicted finish = now + the rest of the batch running now + the queued work
due no later than it (EDF order) + its own stages, each at its measured per-request time. The
robot hears the refusal at once and runs the segment itself, with all of its slack left.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlarun.accel.rtc import INPAINTER
from vlarun.models.device import settle
from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting
from vlarun.runtime.emulate import Emulation, StageEmulator
from vlarun.runtime.queues import Job, Running, StageQueues
from vlarun.runtime.records import (
    PlanBooking,
    RecordError,
    ScheduleSlot,
    StageTiming,
    pack_schedule,
    pack_timings,
)
from vlarun.runtime.refusal_log import RefusalLog
from vlarun.runtime.segments import Schema, batch_dim
from vlarun.runtime.transport import DEFAULT_MAX_MESSAGE_BYTES
from vlarun.sched.queue_model import Booking
from vlarun.stages import wire
from vlarun.stages.families import Workload, build_graph
from vlarun.stages.packet import Limits, Packet, PacketError

# Robots remembered as recently active (batch window, dashboard) before the silent ones are
# forgotten; a bound, so a stream of short-lived connections cannot grow the table.
MAX_SEEN = 1024
# Warm-up passes of every stage; the fastest is the admission's first estimate.
WARMUP_RUNS = 3


class Refused(PacketError):
    """A valid request the edge cannot finish before its deadline."""


@dataclass(frozen=True)
class ServerConfig:
    """Edge server settings. ``batch_window_s``: the longest a batch waits for more robots
    (also bounded by half the slack of its most urgent member); ``limits``: what a request
    may claim before it is refused (defaults fit the tiny and 7B-class packets alike)."""

    address: str = "tcp://127.0.0.1:0"
    max_batch: int = 8
    batch_window_s: float = 0.002
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_queued: int = 256  # requests waiting in all stage queues; more are refused at once
    # One robot's share: its requests queued (and its bookings held) at once; beyond it its
    # next one is refused at once ("busy"), so a flood from some identities cannot fill the
    # queue or the schedule every other robot is admitted against.
    max_queued_per_robot: int = 16
    # Accelerated streams (one robot's episode under one setting) whose hook state (KV cache,
    # token-policy and decoder state) the edge keeps; the least recently used is forgotten
    # beyond this (its next request starts afresh: a full recompute, never a wrong reuse).
    max_streams: int = 64
    admission: bool = True  # refuse on arrival what cannot finish before its deadline
    # An estimate older than this is not enough to refuse on: the request is admitted and its
    # execution measures the stages again (a busy spell must not close the edge for good).
    admission_fresh_s: float = 2.0
    limits: Limits = Limits(max_tensor_bytes=1 << 30, max_total_bytes=2 << 30)
    # A worker behind a scale-out front (runtime/scaleout.py): its only peer is the front,
    # whose route frame before each request names the robot (streams and batching are per
    # robot, not per peer), the time left and the front's request id.
    relayed: bool = False
    # The edge device this server stands for, by padding each stage execution to the emulated
    # device's time for the real model's stage at the batch it ran (runtime.emulate).
    emulate: Emulation | None = None

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.batch_window_s < 0 or self.max_streams < 1:
            raise ValueError("max_batch, max_streams must be >= 1 and batch_window_s >= 0")
        if self.max_queued_per_robot < 1:
            raise ValueError(f"max_queued_per_robot must be >= 1, got {self.max_queued_per_robot}")


class EdgeCore:
    """Serves ``policy``'s stages to requests handed in by ``accept`` (robots, through the
    server's socket) and ``submit`` (in process), run by ``work`` on the worker thread."""

    def __init__(self, policy: Policy, cfg: ServerConfig | None = None) -> None:
        self.cfg = cfg or ServerConfig()
        emulate = self.cfg.emulate
        self.emulator = StageEmulator.build(emulate) if emulate is not None else None
        self.policy = policy
        model = policy.model
        self.dtype = "bfloat16" if model.dtype == torch.bfloat16 else "float32"
        self.graph = build_graph(model.cfg, model, Workload(1, 1, self.dtype))
        self._rtc_graph = None  # the plain graph whose head reads a real-time chunk's freeze
        self.schema = Schema(model.cfg, self.dtype, self.cfg.max_batch)
        inputs = {s.name: tuple(x.name for x in s.inputs) for s in self.graph.stages}
        self.queues = StageQueues(inputs, self.cfg.max_batch)
        self.refusal_log = RefusalLog()
        self.stop_event = threading.Event()
        self.stats = {"requests": 0, "replies": 0, "errors": 0, "control": 0, "expired": 0,
                      "streams": 0, "refused": 0, "cancelled": 0, "booked": 0,
                      "booking_refused": 0,
                      "compute_s": 0.0}  # fmt: skip
        self._busy_until = 0.0  # monotonic end of the batch the worker runs now (predicted)
        self._running: Running | None = None  # the batch the worker runs now
        self.started = time.monotonic()
        self._seen: dict[bytes, float] = {}  # robot identity -> last data request (monotonic)
        self._active_at = -math.inf  # the last data request or booking (ledger pushes)
        self._lock = threading.Lock()  # _seen and the request count: socket and submit()
        # (robot identity, stream id, setting key) -> (hooks, graph bound to them), LRU order
        self._streams: OrderedDict[tuple, tuple] = OrderedDict()
        # The last replies and refusals, for the dashboard (appends are thread-safe; bounded).
        self.recent: deque[dict] = deque(maxlen=2048)
        self.events: deque[dict] = deque(maxlen=512)
        self.secure = False  # no socket here; the server says whether its own is

    def warmup(self, text_tokens: int = 12) -> None:
        """One pass of every stage on dummy inputs: the first robot must not pay for one-time
        allocations (it would miss its deadline and fall back for nothing)."""
        from vlarun.stages.families import example_inputs

        cfg = self.policy.model.cfg
        size = cfg.image_size
        images = torch.zeros(1, cfg.num_images, 3, size, size)
        inputs = example_inputs(cfg, images, [[1] * min(text_tokens, cfg.max_text_tokens)])
        with torch.no_grad():  # the fastest of three: a busy CPU only ever adds time
            runs = [self.graph.run(inputs, serialize=False) for _ in range(WARMUP_RUNS)]
        for i, t in enumerate(runs[0].timings):
            own = min(r.timings[i].seconds for r in runs)
            # an emulated stage takes at least its target (not padded here)
            floor = 0.0 if self.emulator is None else self.emulator.target_s(t.name)
            # A prior: the first real execution of the stage replaces it (queues.StageTimes).
            self.queues.observe(t.name, max(own, floor), 1, prior=True)

    # -- requests in ---------------------------------------------------------------------------

    def accept(self, to: list[bytes], origin: bytes, header: wire.Header, frames: list,
               now: float, route=None) -> None:  # fmt: skip
        """Queue one robot's data request (``to``: the frames its replies start with;
        ``origin``: the robot it is from), or raise ``Refused`` / ``PacketError`` before any
        of its tensors is read: the queues are full, the robot holds its share, the header
        does not fit the stage schema, or admission predicts it late."""
        queued = sum(self.queues.depth().values())
        if queued >= self.cfg.max_queued:  # refuse before reading tensors: memory stays bounded
            raise PacketError(f"edge overloaded: {queued} requests queued")
        self._touch(origin, now)  # a robot whose request is refused is still connected
        self._active_at = now
        mine = self.queues.depth_of(origin)
        if mine >= self.cfg.max_queued_per_robot:  # its share, before reading its tensors
            with self._lock:
                self.stats["refused"] += 1
            raise Refused(f"busy: this robot has {mine} requests queued, its share is "
                          f"{self.cfg.max_queued_per_robot}")  # fmt: skip
        job = self._job(to, origin, header, frames, now, route)
        with self._lock:
            self.stats["requests"] += 1
        self.queues.put(job)

    def _job(
        self, to: list[bytes], origin: bytes, header: wire.Header, frames: list, now: float,
        route=None,
    ) -> Job:  # fmt: skip
        """Check the request against the stage schema, then (only then) read its tensors.
        ``to``: where replies go; ``origin``: the robot the request is from (the connection,
        unless a scale-out front relays it and names the robot in its route)."""
        req = self.schema.check(header)
        budget = req.budget_s if route is None else min(route.budget_s, 3600.0)
        deadline = now + budget
        self.queues.claim(origin, req.stages, now)  # booked at decision time: now it is here
        if self.cfg.admission:  # before any tensor is read: a refusal costs no allocation
            self._admit(req.stages, deadline, now)
        msg = wire.materialize(header, frames, self.cfg.limits)
        tensors = dict(msg.packet.tensors)
        self.schema.check_values(tensors)  # NaN / inf, lengths and ids: before any model work
        job = Job(identity=to[0], rid=header.rid, stages=req.stages, want=req.want,
                  pool=tensors, arrival=now, deadline=deadline, reply_codec=req.reply_codec,
                  origin=origin, route=route)  # fmt: skip
        if not req.setting.identity:
            stream = header.meta.get("stream")
            job.hooks, job.graph = self._stream(origin, stream, req.setting, req.rtc)
            job.fresh = req.fresh
            job.setting = str(req.setting)
        elif req.rtc:
            job.graph = self.rtc_graph
        return job

    @property
    def rtc_graph(self):
        """The plain graph with the head reading RTC_INPUTS (built on the first RTC request)."""
        if self._rtc_graph is None:
            model = self.policy.model
            w = Workload(1, 1, self.dtype)
            self._rtc_graph = build_graph(model.cfg, model, w, None, INPAINTER)
        return self._rtc_graph

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
            self._admit(names, now + budget_s, now)
        job = Job(identity=b"", rid=0, stages=names, want=want, pool=dict(tensors), arrival=now,
                  deadline=now + budget_s, origin=origin)  # fmt: skip
        job.done = done
        self._touch(origin, now)
        with self._lock:
            self.stats["requests"] += 1
        self.queues.put(job)
        return job

    def cancel(self, job: Job) -> None:
        """Drop an in-process request whose client has gone: out of its queue at once (its
        tensors freed), and if a stage of it is running now, its result is thrown away."""
        job.cancelled = True
        if self.queues.discard(job):
            self.stats["cancelled"] += 1

    def _touch(self, origin: bytes, now: float) -> None:
        """Note that ``origin`` sent data now; the table forgets robots silent for a second
        once it holds more than ``MAX_SEEN`` (every serve-policy connection is a new origin,
        so it would otherwise grow for as long as the server runs)."""
        with self._lock:  # the I/O thread and in-process submissions both write it
            if len(self._seen) >= MAX_SEEN:
                self._seen = {k: t for k, t in self._seen.items() if now - t < 1.0}
            self._seen[origin] = now

    def schedule(self, limit: int = 64) -> list[ScheduleSlot]:
        """The committed schedule, as admission sees it (``StageQueues.forecast``): the batch
        running now, then every queued and booked request's remaining stages in the order the
        worker's EDF rule would run them, at their measured per-request times. Times in s
        from now; each entry names the robot, the stage, the deadline it must meet and whether
        it is only booked so far. Robots plan against it (``costview.edge_state``)."""
        now = time.monotonic()
        slots = self.queues.forecast(now, self._busy_until, self._running, robot_id, limit=limit)
        return [ScheduleSlot.of(s, now) for s in slots]

    def _admit(self, stages: tuple[str, ...], deadline: float, now: float) -> None:
        """Refuse a request for ``stages`` due at ``deadline`` (answered at once) if it cannot
        finish in time."""
        finish = self.queues.finish(now, stages, deadline, self._busy_until, self._running)
        if finish > deadline and self.queues.fresh(stages, self.cfg.admission_fresh_s):
            self.stats["refused"] += 1
            self.events.append({"t": now, "kind": "refused", "stages": "+".join(stages)})
            raise Refused(
                f"refused: predicted to finish {1e3 * (finish - now):.1f} ms from now, "
                f"the deadline is in {1e3 * (deadline - now):.1f} ms"
            )

    def book(self, origin: bytes, header: wire.Header, now: float) -> list[bytes]:
        """A robot announces the edge stages it just planned (op "book", a ``PlanBooking``):
        they enter the queue model at once, so every robot quoted before the request itself
        lands sees them."""
        self._active_at = now
        try:
            b = PlanBooking.parse(header.meta, self.schema.names)
        except RecordError as e:
            raise PacketError(f"bad booking: {e}") from None
        booking = Booking(b.stages, now + b.arrive_s, now + b.deadline_s, origin)
        booked = self.queues.book(booking, now, self.cfg.max_queued_per_robot)
        with self._lock:
            self.stats["booked" if booked else "booking_refused"] += 1
        return wire.control("book", header.rid, ok=booked)

    def _stream(
        self, identity: bytes, stream: object, setting: AccelSetting, rtc: bool = False
    ) -> tuple:
        """The hooks and graph of one robot's accelerated stream, made on its first request
        (``rtc``: the graph whose head reads a real-time chunk's freeze; the hooks are the
        stream's either way). Only the I/O thread calls this; a job keeps its own reference,
        so forgetting a stream here never pulls state from under a running stage."""
        if not isinstance(stream, int) or not 0 <= stream < 2**63:
            raise PacketError("an accelerated request needs meta.stream, an integer in 0..2^63")
        key = (identity, stream, setting.key)
        if key in self._streams:
            self._streams.move_to_end(key)
            hooks, graphs = self._streams[key]
        else:
            hooks = setting.hooks(self.policy.model.cfg.family, self.policy.calibration)
            graphs = {}
            self._streams[key] = (hooks, graphs)
            while len(self._streams) > self.cfg.max_streams:
                self._streams.popitem(last=False)
            self.stats["streams"] += 1
        if rtc not in graphs:
            model = self.policy.model
            w = Workload(1, 1, self.dtype)
            graphs[rtc] = build_graph(model.cfg, model, w, hooks, INPAINTER if rtc else None)
        return hooks, graphs[rtc]

    def health(self) -> dict:
        """What `vlarun ping` shows: model, queue depth per stage, counters, stage estimates
        (and how old each is)."""
        now = time.monotonic()
        return {
            "ok": True,
            "model": self.policy.model.cfg.name,
            "family": self.policy.model.cfg.family,
            "dtype": self.dtype,
            "stages": list(self.schema.names),
            "queue": self.queues.depth(),
            "stage_ms": {k: v * 1e3 for k, v in self.queues.est_s.items()},
            "stage_age_s": {k: now - t for k, t in self.queues.est_at.items()},
            "max_batch": self.cfg.max_batch,
            "streams_kept": len(self._streams),
            "backlog_ms": 1e3 * self.queues.backlog_s(float("inf")),
            "schedule": pack_schedule(self.schedule()),
            "secure": self.secure,
            "uptime_s": time.monotonic() - self.started,
            # stage executions that overran their emulated device's time (None: not emulated)
            "emulation": None if self.emulator is None else self.emulator.report(),
            **self.stats,
        }

    # -- worker thread -----------------------------------------------------------------------------

    def work(self, outbox) -> None:
        """The worker thread's loop until ``stop_event``: take a batch, run one stage of it,
        answer what finished through ``outbox`` (a socket only this thread sends on)."""
        while not self.stop_event.is_set():
            batch = self.queues.take(self.stop_event, self._window_s)
            if batch:
                self._run_batch(batch, outbox)

    def _window_s(self) -> float:
        """Wait for batch mates only while more than one robot is active (a lone robot would
        only lose the window); active = sent data in the last second."""
        now = time.monotonic()
        recent = sum(now - t < 1.0 for t in list(self._seen.values()))
        return self.cfg.batch_window_s if recent > 1 else 0.0

    def _run_batch(self, batch: list[Job], outbox) -> None:
        now = time.monotonic()
        live = []
        for job in batch:
            if job.cancelled:  # its client has gone: nobody to answer
                continue
            if now > job.deadline:  # the robot has already run this locally; save the edge
                self.stats["expired"] += 1
                self.events.append({"t": now, "kind": "expired", "stages": "+".join(job.stages)})
                self._answer(outbox, job, "deadline passed on the edge")
            else:
                live.append(job)
        if not live:
            return
        stage = (live[0].graph or self.graph).stage(live[0].stage)
        self._busy_until = now + self.queues.work_s((stage.name,)) * len(live)
        after = tuple((robot_id(j.origin), j.deadline, tuple(j.stages[j.pos + 1 :]))
                      for j in live)  # fmt: skip
        self._running = Running(stage.name, tuple(robot_id(j.origin) for j in live),
                                min(j.deadline for j in live), after)  # fmt: skip
        for job in live:
            if job.pos == 0:  # in the worker thread, so no stage of the stream is running
                for part in job.fresh:
                    job.hooks.reset(part)
        try:
            seconds = self._execute(stage, live)
        except Exception as e:  # one bad request must not fail its batch mates
            if len(live) > 1:
                for job in live:
                    self._run_batch([job], outbox)
                return
            self.stats["errors"] += 1
            self._answer(outbox, live[0], f"stage failed: {e}")
            return
        self._busy_until = 0.0
        self.queues.observe(stage.name, seconds, len(live))
        for job in live:
            job.timings.append(StageTiming(stage.name, seconds, now - job.enqueued, len(live)))
            job.pos += 1
            if job.cancelled:
                continue
            if job.pos < len(job.stages):
                self.queues.put(job)
            else:
                self._answer(outbox, job)

    def _execute(self, stage, jobs: list[Job]) -> float:
        """Run one stage on the jobs' inputs concatenated along each tensor's batch axis."""
        names = [s.name for s in stage.inputs]
        if len(jobs) == 1:
            packet = Packet({n: jobs[0].pool[n] for n in names})
        else:
            packet = Packet({n: torch.cat([j.pool[n] for j in jobs], batch_dim(n)) for n in names})
        start = time.perf_counter()
        with torch.no_grad():
            out = stage(packet)
        settle(out.tensors)
        if self.emulator is not None:  # a batch shares one setting (its jobs' graph)
            setting = jobs[0].setting
            knobs = None if setting in (None, "", "full") else AccelSetting.parse(setting).knobs()
            self.emulator.pad(stage.name, start, batch=len(jobs), knobs=knobs)
        seconds = time.perf_counter() - start
        sizes = [j.pool[names[0]].shape[batch_dim(names[0])] for j in jobs]
        for name, t in out.tensors.items():
            for job, part in zip(jobs, torch.split(t, sizes, batch_dim(name)), strict=True):
                job.pool[name] = part
        return seconds

    def _answer(self, outbox, job: Job, error: str | None = None) -> None:
        """Hand a finished (or failed) request back: over the socket, or to the callback of
        an in-process request (``submit``)."""
        if error is None:
            self._record(job)
        if job.done is not None:
            out = None if error else {n: job.pool[n] for n in job.want}
            job.done(out, error, job.timings)
        elif error is not None:
            outbox.send_multipart([*job.address(), *wire.error(job.rid, error)])
        else:
            outbox.send_multipart([*job.address(with_timings=True), *self._reply(job)])

    def _record(self, job: Job) -> None:
        self.stats["replies"] += 1
        now = time.monotonic()
        compute_s = sum(t.share_s for t in job.timings)  # this request's share
        self.stats["compute_s"] += compute_s
        self.recent.append({
            "t": now,
            "robot": robot_id(job.origin),
            "stages": "+".join(job.stages),
            "setting": job.setting,
            "server_s": now - job.arrival,
            "budget_s": job.deadline - job.arrival,
            "compute_s": compute_s,
            "batch": {t.stage: t.batch for t in job.timings},
        })  # fmt: skip

    def _reply(self, job: Job) -> list[bytes]:
        packet = Packet({n: job.pool[n] for n in job.want})
        meta = {"timings": pack_timings(job.timings),
                "server_s": time.monotonic() - job.arrival,
                "schedule": pack_schedule(self.schedule())}  # fmt: skip
        emu = self.emulator  # an emulated edge answers with the real model's packet size
        pad = 0 if emu is None else emu.pad_bytes(job.stages, "out", packet.nbytes)
        msg = wire.Message(
            "result", rid=job.rid, stage="+".join(job.stages), meta=meta, packet=packet, pad=pad
        )
        return wire.encode(msg, wire.Codec(**job.reply_codec))


def robot_id(identity: bytes) -> str:
    """A short stable name for a robot's connection (its ZeroMQ identity, hashed)."""
    return hashlib.blake2s(identity, digest_size=3).hexdigest()
