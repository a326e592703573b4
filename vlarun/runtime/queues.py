"""Per-stage queues of the edge and the batching rule.

Every request waiting for a stage sits in that stage's queue. The worker serves the request
with the earliest deadline (EDF) and batches with it every queued request of the same stage
and input signature (shapes and dtypes apart from the batch axis). If the batch is not full
and the earliest member's slack allows, it waits a short window for more robots: slack =
deadline - now - the stage's measured time, and the wait never takes more than half of it,
so batching never costs a deadline it could have met.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vlarun.runtime.segments import batch_dim


@dataclass
class Job:
    """One robot request in flight on the edge. ``pool`` holds its tensors by name (inputs,
    then every output of its stages so far); ``pos`` indexes the next stage to run."""

    identity: bytes
    rid: int
    stages: tuple[str, ...]
    want: tuple[str, ...]
    pool: dict[str, torch.Tensor]
    arrival: float
    deadline: float
    reply_codec: dict = field(default_factory=dict)
    # An accelerated request runs its stream's graph (stage functions bound to the stream's
    # hooks); ``fresh``: hook parts to reset before its first stage. None: the plain graph.
    graph: object | None = field(default=None, repr=False)
    hooks: object | None = field(default=None, repr=False)
    fresh: tuple[str, ...] = ()
    setting: str = "full"  # the accelerator setting's text form (what the dashboard shows)
    origin: bytes = b""  # the robot it is from (``identity`` unless a front relays it)
    route: object | None = field(default=None, repr=False)  # a front's Route (server.py)
    done: Callable | None = field(default=None, repr=False)  # an in-process request's callback
    # Set when its client has gone (``EdgeServer.cancel``): never run, re-queued or answered.
    cancelled: bool = False
    pos: int = 0
    enqueued: float = 0.0
    timings: list[dict] = field(default_factory=list)

    def address(self, with_timings: bool = False) -> list[bytes]:
        """The frames a reply to this request starts with: the peer's identity, then, when a
        front relayed it, the front's route echoed (with this request's timings)."""
        if self.route is None:
            return [self.identity]
        return [self.identity, self.route.echo(self.timings if with_timings else None)]

    @property
    def stage(self) -> str:
        return self.stages[self.pos]

    def signature(self, inputs: tuple[str, ...]) -> tuple:
        """Stage + per input (name, dtype, shape without the batch axis). A request with hooks
        never batches: its hooks hold one stream's state (a KV cache of batch 1); one with
        its own graph batches only with requests of that graph (a batch runs one graph's
        stage functions on one set of inputs)."""
        sig = [self.stage]
        if self.hooks is not None:
            sig.append(("stream", id(self)))
        elif self.graph is not None:  # e.g. the graph reading a real-time chunk's freeze
            sig.append(("graph", id(self.graph)))
        for n in inputs:
            t = self.pool[n]
            shape = list(t.shape)
            del shape[batch_dim(n)]
            sig.append((n, str(t.dtype), tuple(shape)))
        return tuple(sig)


class StageQueues:
    """Thread-safe per-stage FIFO queues with EDF selection across stages."""

    def __init__(self, stage_inputs: dict[str, tuple[str, ...]], max_batch: int = 8) -> None:
        self.inputs, self.max_batch = stage_inputs, max_batch
        self.queues: dict[str, deque[Job]] = {s: deque() for s in stage_inputs}
        self.cond = threading.Condition()
        self.est_s: dict[str, float] = {}  # EWMA of measured stage time at batch 1
        self.est_at: dict[str, float] = {}  # when each estimate was last measured (monotonic)

    def put(self, job: Job) -> None:
        with self.cond:
            job.enqueued = time.monotonic()
            self.queues[job.stage].append(job)
            self.cond.notify()

    def discard(self, job: Job) -> bool:
        """Take ``job`` out of its stage queue if it waits there (its tensors go with it);
        whether it did."""
        with self.cond:
            q = self.queues.get(job.stage) if job.pos < len(job.stages) else None
            if q is None or not any(j is job for j in q):
                return False
            self.queues[job.stage] = deque(j for j in q if j is not job)
            return True

    def depth(self) -> dict[str, int]:
        with self.cond:
            return {s: len(q) for s, q in self.queues.items()}

    def backlog_s(self, deadline: float) -> float:
        """Predicted seconds of queued work the worker serves before a request due at
        ``deadline`` (EDF: every queued request due no later), each at its stages' measured
        per-request time; stages never measured count 0 (no evidence to refuse on)."""
        with self.cond:
            return sum(
                self.est_s.get(name, 0.0)
                for q in self.queues.values()
                for job in q
                if job.deadline <= deadline
                for name in job.stages[job.pos :]
            )

    def ordered(self) -> list[Job]:
        """Every queued request, in the order the worker will serve them (EDF)."""
        with self.cond:
            jobs = [j for q in self.queues.values() for j in q]
        return sorted(jobs, key=lambda j: j.deadline)

    def fresh(self, stages: tuple[str, ...], within_s: float) -> bool:
        """Whether every stage's estimate was measured in the last ``within_s`` seconds."""
        now = time.monotonic()
        return all(now - self.est_at.get(name, -1e9) <= within_s for name in stages)

    def work_s(self, stages: tuple[str, ...]) -> float:
        """Predicted seconds of ``stages`` for one request (0 for stages never measured)."""
        return sum(self.est_s.get(name, 0.0) for name in stages)

    def observe(self, stage: str, seconds: float, batch: int) -> None:
        per = seconds / max(batch, 1)
        self.est_at[stage] = time.monotonic()
        old = self.est_s.get(stage)
        self.est_s[stage] = per if old is None else 0.8 * old + 0.2 * per

    def take(self, stop: threading.Event, window: Callable[[], float]) -> list[Job] | None:
        """Block until work exists (or ``stop``); return one batch, ready to run. ``window()``
        is the longest wait for batch mates, asked when work is there (it depends on load)."""
        with self.cond:
            while not stop.is_set():
                head = self._earliest()
                if head is None:
                    self.cond.wait(0.05)
                    continue
                batch = self._collect(head)
                until = time.monotonic() + self._wait_s(head, batch, window())
                while len(batch) < self.max_batch and not stop.is_set():
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)  # a put() wakes us: maybe a batch mate
                    batch = self._collect(head)
                return self._remove(head.stage, batch)
        return None

    def _earliest(self) -> Job | None:
        heads = [q[0] for q in self.queues.values() if q]
        return min(heads, key=lambda j: j.deadline) if heads else None

    def _collect(self, head: Job) -> list[Job]:
        sig = head.signature(self.inputs[head.stage])
        same = [j for j in self.queues[head.stage] if j.signature(self.inputs[j.stage]) == sig]
        same.sort(key=lambda j: j.deadline)
        return same[: self.max_batch]

    def _wait_s(self, head: Job, batch: list[Job], window_s: float) -> float:
        if len(batch) >= self.max_batch or window_s <= 0:
            return 0.0
        slack = head.deadline - time.monotonic() - self.est_s.get(head.stage, 0.0)
        return min(window_s, slack / 2)

    def _remove(self, stage: str, batch: list[Job]) -> list[Job]:
        ids = {id(j) for j in batch}
        q = self.queues[stage]
        self.queues[stage] = deque(j for j in q if id(j) not in ids)
        return batch
