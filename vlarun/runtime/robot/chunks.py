"""Asynchronous action-chunk queue: the next inference runs while the robot executes actions.

The robot pops one action per control tick. The next inference starts, from the current
observation, when the actions still queued just cover its expected latency:

    refill when  len(queue) <= ceil(latency / tick) + 1     (clamped to 1 .. chunk - 1)

where the latency is the p95 the last inference's plan predicted for itself (``predict``:
predicted latency + 1.645 sigma, network included) or, without a prediction, the measured
EWMA. With the deadline chunk / control rate, an inference that meets it never lets the queue
run dry. If it does run dry, the robot waits: that wait is a stall, counted and timed, never
hidden. (The first chunk of an episode finds the robot at rest: its wait is start-up, not a
stall.)

How a new chunk joins the queue (``merge``):
  append  behind the actions still queued at request time: those bridge the wait, and the
          new chunk starts about when it was meant to, stale only by its own latency;
  switch  aligned in time: the chunk's first action is meant for the tick of the request, so
          on arrival, a ticks later, the queue becomes the chunk from index a on (naive
          asynchronous execution). Under real-time chunking the request carried the queued
          actions (``Prior``) and the policy froze its first d to them, so when a <= d the
          robot switches onto the very actions it would have run: a seam without a jump;
  blend   aligned as switch, but each queued tick's action becomes the temporal ensemble of
          every chunk that planned it (ACT: weights exp(-m i), i = 0 for the oldest plan).

A chunk that arrives after the queue ran dry mid-episode is late by the ticks the robot
waited: its first k = floor(wait / tick) actions are stale and are skipped (counted in
``skipped``); the robot resumes at the action meant for the current tick, never replaying the
chunk from its start. At least the chunk's last action is kept (the freshest plan there is).
Only with ``lead``: a synchronous queue waits for every chunk by design.

``inline=True`` runs each inference in the caller's thread: simulated time, where the ticks
are the clock. An inference's result is then withheld for ``delay_steps`` ticks (an emulated
latency, the same on every machine); a tick with no action to pop is a stall tick (``pop``
returns None, and the caller holds the robot still).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MERGES = ("append", "switch", "blend")
ACT_M = 0.01  # ACT's temporal-ensemble decay (Zhao et al. 2023): w_i = exp(-m i)


@dataclass(frozen=True)
class Prior:
    """What the queue holds when it asks for a chunk (``infer``'s second argument).

    tick: the control tick the new chunk's first action is meant for (now);
    actions: (n, A) the actions still queued, robot units (n may be 0);
    model: the same rows in the policy's model space, where every chunk's record gave them
        (``model_of``) and no blend mixed them; else None;
    period_s: the control period; latency_s: the latency the queue leads by (the last plan's
        predicted p95, else the measured EWMA, else None; the emulated latency inline)."""

    tick: int
    actions: np.ndarray
    model: np.ndarray | None
    period_s: float
    latency_s: float | None


@dataclass(frozen=True)
class Execution:
    """How a chunked policy is executed: ``asynchronous`` (infer while executing) and how a
    new chunk joins the queue (``merge``, one of ``MERGES``); ``rtc`` makes each request carry
    the queued actions for the policy to freeze (real-time chunking). Presets: ``EXECUTIONS``."""

    asynchronous: bool = False
    merge: str = "append"
    rtc: bool = False

    def __post_init__(self) -> None:
        if self.merge not in MERGES:
            raise ValueError(f"merge must be one of {MERGES}, got {self.merge!r}")
        if self.rtc and not (self.asynchronous and self.merge == "switch"):
            raise ValueError("real-time chunking switches asynchronously (merge='switch')")


EXECUTIONS = {
    "sync": Execution(False, "append"),  # wait: the robot holds still while inferring
    "naive": Execution(True, "switch"),  # switch to the new chunk on arrival
    "blend": Execution(True, "blend"),  # ACT's temporal ensemble of overlapping chunks
    "rtc": Execution(True, "switch", rtc=True),  # frozen prefix + guided overlap
}


class ChunkQueue:
    def __init__(
        self,
        infer: Callable[[dict, Prior], tuple[np.ndarray, object]],
        horizon: int,
        tick_s: float,
        lead: bool = True,
        inline: bool = False,
        merge: str = "append",
        delay_steps: int = 0,
        predict: Callable[[object], float | None] | None = None,
        model_of: Callable[[object], np.ndarray | None] | None = None,
    ) -> None:
        """``infer(obs, prior) -> (chunk, record)``. ``lead=False``: no overlap, the next
        inference starts when the queue is empty; ``inline``: inferences run in the caller's
        thread, their results withheld ``delay_steps`` ticks (simulated time);
        ``predict(record)``: the p95 latency (s) of the plan that
        record ran; ``model_of(record)``: its chunk in the policy's model space."""
        if lead and horizon < 2:
            raise ValueError("asynchronous chunks need a horizon of at least 2 actions")
        if merge not in MERGES:
            raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
        if delay_steps < 0 or (delay_steps and not inline):
            raise ValueError("delay_steps (>= 0) emulates a latency in simulated time (inline)")
        self.infer, self.horizon, self.tick_s, self.lead = infer, horizon, tick_s, lead
        self.inline, self.merge, self.delay_steps = inline, merge, delay_steps
        self.predict, self.model_of = predict, model_of
        self.actions: deque[np.ndarray] = deque()
        self._model: deque[np.ndarray] | None = deque() if model_of is not None else None
        self._weights: deque[tuple[float, int]] = deque()  # blend: (weight sum, plans) per tick
        self.cond = threading.Condition()
        self.pending = False
        self.latency_s: float | None = None  # EWMA of inference latency (emulated inline)
        self.predicted_s: float | None = None  # the last plan's predicted p95 latency
        self.records: list = []  # what ``infer`` returned beside the actions, in order
        self.errors: list[BaseException] = []
        self.stalls: list[float] = []  # seconds the robot had no action, per stall
        self.startup_s = 0.0  # the first chunk's wait (the robot at rest)
        self.skipped: list[int] = []  # stale actions dropped from each late chunk (lead only)
        self.seams: list[int] = []  # tick at which each chunk after the first takes over
        self.tick = 0  # control ticks so far (inline: stall ticks included)
        self._popped = 0  # actions executed so far: the first chunk is never late
        self._idle = False  # inline: the last tick was a stall tick
        self._held: list[tuple[int, np.ndarray, object, Prior]] = []  # inline, withheld
        self._threads: list[threading.Thread] = []

    @property
    def lead_s(self) -> float | None:
        """The latency the next request is expected to take: the last plan's predicted p95,
        else the measured EWMA (the emulated latency inline)."""
        return self.predicted_s if self.predicted_s is not None else self.latency_s

    @property
    def refill_at(self) -> int:
        if not self.lead:
            return 0
        lead = self.lead_s
        if lead is None:
            return self.horizon - 1  # unknown latency: the most lead time
        # A latency of exactly k ticks lands on a tick: float noise must not add one.
        ticks = math.ceil(lead / self.tick_s - 1e-9) + 1
        return min(max(ticks, 1), self.horizon - 1)

    def request(self, obs: dict) -> bool:
        """Start an inference on ``obs`` unless one is in flight; True if started."""
        with self.cond:
            if self.pending:
                return False
            self.pending = True
            prior = self._prior()
        if self.inline:
            self._run(obs, prior)
            if self.errors:
                raise self.errors.pop()
            return True
        t = threading.Thread(target=self._run, args=(obs, prior), daemon=True)
        self._threads.append(t)
        t.start()
        return True

    def _prior(self) -> Prior:
        rows = np.asarray(list(self.actions))
        model = None
        if self._model is not None and len(self._model) == len(self.actions):
            model = np.asarray(list(self._model))
        return Prior(self.tick, rows, model, self.tick_s, self.lead_s)

    def needs_refill(self) -> bool:
        with self.cond:
            return not self.pending and len(self.actions) <= self.refill_at

    def _run(self, obs: dict, prior: Prior) -> None:
        t0 = time.perf_counter()
        try:
            chunk, record = self.infer(obs, prior)
        except BaseException as e:  # surfaced by pop(), never swallowed
            with self.cond:
                self.errors.append(e)
                self.pending = False
                self.cond.notify_all()
            return
        # Inline, the emulated latency is the one that counts (no clock runs while it thinks).
        seconds = self.delay_steps * self.tick_s if self.inline else time.perf_counter() - t0
        with self.cond:
            old = self.latency_s
            self.latency_s = seconds if old is None else 0.7 * old + 0.3 * seconds
            if self.inline and self.delay_steps:
                self._held.append((prior.tick + self.delay_steps, chunk, record, prior))
                return
            self._deliver(chunk, record, prior)

    def _deliver(self, chunk: np.ndarray, record: object, prior: Prior) -> None:
        """Merge an arrived chunk into the queue (holding the lock)."""
        rows = list(chunk)
        model = self.model_of(record) if self.model_of is not None else None
        first = not self.records
        self.records.append(record)
        self.pending = False
        if self.predict is not None:
            self.predicted_s = self.predict(record)
        if first or not self.lead or self.merge == "append":
            if not first:
                self.seams.append(self.tick + len(self.actions))
            self.actions.extend(rows)
            self._weights.extend([(1.0, 1)] * len(rows))
            self._extend_model(model, 0, len(rows))
        else:  # aligned: index a is meant for the current tick
            elapsed = self.tick - prior.tick
            a = min(elapsed, len(rows) - 1)
            if a > len(prior.actions):  # the queue ran dry before it came: stale actions
                self.skipped.append(a - len(prior.actions))
            self.seams.append(self.tick)
            if self.merge == "switch":
                self._drop_head(len(self.actions))
                self.actions.extend(rows[a:])
                self._weights.extend([(1.0, 1)] * (len(rows) - a))
                self._extend_model(model, a, len(rows))
            else:
                self._blend(rows[a:])
        self.cond.notify_all()

    def _blend(self, rows: list[np.ndarray]) -> None:
        """ACT's temporal ensemble: a queued tick planned by k chunks so far takes the new
        plan at weight exp(-m k) (the oldest plan weighs most)."""
        self._model = None  # a blended action belongs to no one chunk
        for i, row in enumerate(rows):
            if i < len(self.actions):
                total, k = self._weights[i]
                w = math.exp(-ACT_M * k)
                self.actions[i] = (self.actions[i] * total + w * row) / (total + w)
                self._weights[i] = (total + w, k + 1)
            else:
                self.actions.append(row)
                self._weights.append((1.0, 1))

    def _extend_model(self, model: np.ndarray | None, start: int, end: int) -> None:
        if self._model is None:
            return
        if model is None:
            self._model = None  # a chunk without model rows: none are known from here on
            return
        self._model.extend(list(np.asarray(model)[start:end]))

    def _drop_head(self, k: int) -> None:
        for _ in range(k):
            self.actions.popleft()
            self._weights.popleft()
            if self._model is not None and self._model:
                self._model.popleft()

    def _take(self) -> np.ndarray:
        """The next action (holding the lock): one tick passes."""
        action = self.actions[0]
        self._drop_head(1)
        self._popped += 1
        self._advance()
        return action

    def _advance(self) -> None:
        """One tick passes: deliver what was withheld until now (inline)."""
        self.tick += 1
        due = [h for h in self._held if h[0] <= self.tick]
        for h in due:
            self._held.remove(h)
            self._deliver(*h[1:])

    def pop(self, timeout_s: float = 30.0) -> np.ndarray | None:
        """The next action, waiting (a stall) if the queue is empty. Inline: None for a tick
        with no action (a stall tick: the caller holds the robot still)."""
        if self.inline:
            return self._pop_tick()
        with self.cond:
            t0 = time.perf_counter()
            while not self.actions:
                if self.errors:
                    raise self.errors[0]
                if not self.pending:
                    raise RuntimeError("action queue empty and no inference in flight")
                if not self.cond.wait(timeout_s):
                    raise TimeoutError(f"no action within {timeout_s} s")
            waited = time.perf_counter() - t0
            if waited > 1e-4:
                if not self._popped:
                    self.startup_s += waited
                else:
                    self.stalls.append(waited)
                    if self.lead:
                        self._align(waited)
            return self._take()

    def _pop_tick(self) -> np.ndarray | None:
        with self.cond:
            if self.errors:
                raise self.errors.pop()
            if self.actions:
                self._idle = False
                return self._take()
            if not self.pending:
                raise RuntimeError("action queue empty and no inference in flight")
            if not self._popped:
                self.startup_s += self.tick_s
            elif self._idle:
                self.stalls[-1] += self.tick_s
            else:
                self.stalls.append(self.tick_s)
            self._idle = bool(self._popped)
            self._advance()
            return None

    def _align(self, waited_s: float) -> None:
        """Drop the stale head of a chunk that arrived ``waited_s`` after the queue ran dry:
        its first action was due then, so the one due now is floor(waited / tick) further."""
        late = min(int(waited_s / self.tick_s), len(self.actions) - 1)
        self._drop_head(late)
        self.tick += late
        if late:
            self.skipped.append(late)

    def join(self, timeout_s: float = 10.0) -> None:
        for t in self._threads:
            t.join(timeout_s)
