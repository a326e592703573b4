"""The edge's local worker: this process's per-stage queues, accelerated streams and the worker
thread that batches and runs stages, as the edge core's backend (``edge.core.Backend``). No
socket and no wire bytes: a server hands it jobs whose tensors it has read and checked, and
it hands each finished job to the server's ``answer`` (or an in-process request's callback).
This is the file to change how the edge orders, batches and runs work; whether a request is
taken at all is the core's (``runtime/edge/core.py``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

from vlarun.accel.rtc import INPAINTER
from vlarun.models.device import settle
from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting
from vlarun.runtime.edge.core import EdgeRecords, Quote, ServerConfig, robot_id
from vlarun.runtime.edge.queues import Job, Running, StageQueues
from vlarun.runtime.emulate import StageEmulator
from vlarun.runtime.protocol import StageTiming
from vlarun.runtime.segments import Request, batch_dim
from vlarun.sched.bookings import Booking, Slot
from vlarun.stages.families import Workload, build_graph
from vlarun.stages.packet import Packet, PacketError

# Warm-up passes of every stage; the fastest is the admission's first estimate.
WARMUP_RUNS = 3


class LocalWorker:
    """Serves ``policy``'s stages to the jobs ``put`` in, run by ``work`` on the worker thread;
    predicts and books for the core over its one ``StageQueues``."""

    HOLDS = "queued"
    COUNTERS = ("streams", "cancelled")

    def __init__(self, policy: Policy, cfg: ServerConfig, records: EdgeRecords) -> None:
        self.cfg, self.records = cfg, records
        self.emulator = StageEmulator.build(cfg.emulate) if cfg.emulate is not None else None
        self.policy = policy
        model = policy.model
        self.dtype = "bfloat16" if model.dtype == torch.bfloat16 else "float32"
        self.graph = build_graph(model.cfg, model, Workload(1, 1, self.dtype))
        self._rtc_graph = None  # the plain graph whose head reads a real-time chunk's freeze
        inputs = {s.name: tuple(x.name for x in s.inputs) for s in self.graph.stages}
        self.queues = StageQueues(inputs, cfg.max_batch)
        self.busy_until = 0.0  # monotonic end of the batch the worker runs now (predicted)
        self.running: Running | None = None  # the batch the worker runs now
        # (robot identity, stream id, setting key) -> (hooks, graphs bound to them), LRU order
        self._streams: OrderedDict[tuple, tuple] = OrderedDict()

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

    # -- the core's backend -----------------------------------------------------------------------

    def held(self) -> int:
        return sum(self.queues.depth().values())

    def held_by(self, key: bytes) -> int:
        return self.queues.depth_of(key)

    def quotes(
        self, stages: tuple[str, ...], deadline: float, now: float, stream: Hashable | None = None
    ) -> list[Quote]:
        """The one worker's forecast with the request in (``StageQueues.finish``: admission's
        test is the robots' schedule, not a second model)."""
        finish = self.queues.finish(now, stages, deadline, self.busy_until, self.running)
        return [Quote(0, finish, self.queues.fresh(stages, self.cfg.admission_fresh_s))]

    def book(self, booking: Booking, now: float, per_robot: int) -> bool:
        return self.queues.book(booking, now, per_robot)

    def claim(self, key: bytes, stages: tuple[str, ...], now: float) -> bool:
        return self.queues.claim(key, stages, now)

    def schedule(self, limit: int = 64) -> list[Slot]:
        """The committed schedule (``StageQueues.forecast``): the batch running now, then every
        queued and booked request's remaining stages in the order the worker's EDF rule would
        run them, at their measured per-request times; each entry names the robot, the stage,
        the deadline it must meet and whether it is only booked so far."""
        now = time.monotonic()
        slots = self.queues.forecast(now, self.busy_until, self.running, robot_id, limit=limit)
        return [s.since(now) for s in slots]

    def health(self, now: float) -> dict:
        return {
            "ok": True,
            "queue": self.queues.depth(),
            "stage_ms": {k: v * 1e3 for k, v in self.queues.est_s.items()},
            "stage_age_s": {k: now - t for k, t in self.queues.est_at.items()},
            "streams_kept": len(self._streams),
            "backlog_ms": 1e3 * self.queues.backlog_s(float("inf")),
            # stage executions that overran their emulated device's time (None: not emulated)
            "emulation": None if self.emulator is None else self.emulator.report(),
        }

    # -- jobs in ----------------------------------------------------------------------------------

    def bind(self, job: Job, req: Request, stream: object) -> None:
        """Give an admitted job the graph it runs: its stream's (hooks kept per robot, stream
        and setting) for an accelerated request, the graph reading a real-time chunk's freeze
        for an RTC one, the plain graph otherwise. Raises ``PacketError`` for a bad stream id."""
        if not req.setting.identity:
            job.hooks, job.graph = self._stream(job.origin, stream, req.setting, req.rtc)
            job.fresh = req.fresh
            job.setting = str(req.setting)
        elif req.rtc:
            job.graph = self.rtc_graph

    def put(self, job: Job) -> None:
        self.queues.put(job)

    def cancel(self, job: Job) -> None:
        """Drop an in-process request whose client has gone: out of its queue at once (its
        tensors freed), and if a stage of it is running now, its result is thrown away."""
        job.cancelled = True
        if self.queues.discard(job):
            self.records.count("cancelled")

    @property
    def rtc_graph(self):
        """The plain graph with the head reading RTC_INPUTS (built on the first RTC request)."""
        if self._rtc_graph is None:
            model = self.policy.model
            w = Workload(1, 1, self.dtype)
            self._rtc_graph = build_graph(model.cfg, model, w, None, INPAINTER)
        return self._rtc_graph

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
            self.records.count("streams")
        if rtc not in graphs:
            model = self.policy.model
            w = Workload(1, 1, self.dtype)
            graphs[rtc] = build_graph(model.cfg, model, w, hooks, INPAINTER if rtc else None)
        return hooks, graphs[rtc]

    # -- worker thread ----------------------------------------------------------------------------

    def work(
        self,
        stop: threading.Event,
        answer: Callable[[Job, str | None], None],
        active: Callable[[], int],
    ) -> None:
        """The worker thread's loop until ``stop`` is set: take a batch, run one stage of it,
        hand what finished to ``answer(job, error)`` (an in-process request's own callback
        instead). ``active()``: robots sending now."""

        def window() -> float:
            # Batch mates are waited for only while more than one robot is active (a lone
            # robot would only lose the window).
            return self.cfg.batch_window_s if active() > 1 else 0.0

        while not stop.is_set():
            batch = self.queues.take(stop, window)
            if batch:
                self._run_batch(batch, answer)

    def _run_batch(self, batch: list[Job], answer: Callable[[Job, str | None], None]) -> None:
        now = time.monotonic()
        live = []
        for job in batch:
            if job.cancelled:  # its client has gone: nobody to answer
                continue
            if now > job.deadline:  # the robot has already run this locally; save the edge
                self.records.count("expired")
                self.records.event(now, "expired", "+".join(job.stages))
                self._answer(answer, job, "deadline passed on the edge")
            else:
                live.append(job)
        if not live:
            return
        stage = (live[0].graph or self.graph).stage(live[0].stage)
        self.busy_until = now + self.queues.work_s((stage.name,)) * len(live)
        after = tuple((robot_id(j.key), j.deadline, tuple(j.stages[j.pos + 1 :])) for j in live)
        self.running = Running(
            stage.name, tuple(robot_id(j.key) for j in live), min(j.deadline for j in live), after
        )
        for job in live:
            if job.pos == 0:  # in the worker thread, so no stage of the stream is running
                for part in job.fresh:
                    job.hooks.reset(part)
        try:
            seconds = self._execute(stage, live)
        except Exception as e:  # one bad request must not fail its batch mates
            if len(live) > 1:
                for job in live:
                    self._run_batch([job], answer)
                return
            self.records.count("errors")
            self._answer(answer, live[0], f"stage failed: {e}")
            return
        self.busy_until = 0.0
        self.queues.observe(stage.name, seconds, len(live))
        for job in live:
            job.timings.append(StageTiming(stage.name, seconds, now - job.enqueued, len(live)))
            job.pos += 1
            if job.cancelled:
                continue
            if job.pos < len(job.stages):
                self.queues.put(job)
            else:
                self._answer(answer, job)

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

    def _answer(self, answer, job: Job, error: str | None = None) -> None:
        """Hand a finished (or failed) request back: to an in-process request's callback
        (``EdgeServer.submit``), or to the server's ``answer``."""
        if error is None:
            self.records.reply(
                time.monotonic(),
                job.key,
                job.stages,
                job.setting,
                job.arrival,
                job.deadline,
                job.timings,
            )
        if job.done is not None:
            out = None if error else {n: job.pool[n] for n in job.want}
            job.done(out, error, job.timings)
        else:
            answer(job, error)
