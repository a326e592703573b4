"""Asynchronous action-chunk queue: the next inference runs while the robot executes actions.

The robot pops one action per control tick. The next inference starts, from the current
observation, when the actions still queued just cover its expected latency:

    refill when  len(queue) <= ceil(latency / tick) + 1     (clamped to 1 .. chunk - 1)

The new chunk is appended behind the actions still queued at request time: those bridge the
wait, and the new chunk starts about when it was meant to, stale only by its own latency
(starting earlier would make every action staler; later, the robot would stall). With the
deadline chunk / control rate, an inference that meets it never lets the queue run dry.
If it does run dry, the robot waits: that wait is a stall, counted and timed, never hidden.

A chunk that arrives after the queue ran dry mid-episode is late by the ticks the robot
waited: its first action was due when the queue emptied, so with k = floor(wait / tick) its
first k actions are stale and are skipped (counted in ``skipped``); the robot resumes at the
action meant for the current tick, never replaying the chunk from its start. At least the
chunk's last action is kept (the freshest plan there is). Only with ``lead``: a synchronous
queue waits for every chunk by design, and the very first chunk of an episode finds the
robot at rest (nothing was due yet).

``inline=True`` runs each inference in the caller's thread (simulated time: evaluation, where
no clock runs while the policy thinks, so there is nothing to overlap and nothing to time).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np


class ChunkQueue:
    def __init__(
        self,
        infer: Callable[[dict], tuple[np.ndarray, object]],
        horizon: int,
        tick_s: float,
        lead: bool = True,
        inline: bool = False,
    ) -> None:
        """``lead=False``: no overlap, the next inference starts when the queue is empty;
        ``inline``: inferences run in the caller's thread (needs ``lead=False``)."""
        if lead and horizon < 2:
            raise ValueError("asynchronous chunks need a horizon of at least 2 actions")
        if inline and lead:
            raise ValueError("inline inference cannot overlap execution (lead=True)")
        self.infer, self.horizon, self.tick_s, self.lead = infer, horizon, tick_s, lead
        self.inline = inline
        self.actions: deque[np.ndarray] = deque()
        self.cond = threading.Condition()
        self.pending = False
        self.latency_s: float | None = None  # EWMA of inference latency
        self.records: list = []  # what ``infer`` returned beside the actions, in order
        self.errors: list[BaseException] = []
        self.stalls: list[float] = []
        self.skipped: list[int] = []  # stale actions dropped from each late chunk (lead only)
        self._popped = 0  # actions executed so far: the first chunk is never late
        self._threads: list[threading.Thread] = []

    @property
    def refill_at(self) -> int:
        if not self.lead:
            return 0
        if self.latency_s is None:
            return self.horizon - 1  # unknown latency: the most lead time
        ticks = math.ceil(self.latency_s / self.tick_s) + 1
        return min(max(ticks, 1), self.horizon - 1)

    def request(self, obs: dict) -> bool:
        """Start an inference on ``obs`` unless one is in flight; True if started."""
        with self.cond:
            if self.pending:
                return False
            self.pending = True
        if self.inline:
            self._run(obs)
            if self.errors:
                raise self.errors.pop()
            return True
        t = threading.Thread(target=self._run, args=(obs,), daemon=True)
        self._threads.append(t)
        t.start()
        return True

    def needs_refill(self) -> bool:
        with self.cond:
            return not self.pending and len(self.actions) <= self.refill_at

    def _run(self, obs: dict) -> None:
        t0 = time.perf_counter()
        try:
            chunk, record = self.infer(obs)
        except BaseException as e:  # surfaced by pop(), never swallowed
            with self.cond:
                self.errors.append(e)
                self.pending = False
                self.cond.notify_all()
            return
        seconds = time.perf_counter() - t0
        with self.cond:
            self.actions.extend(list(chunk))
            old = self.latency_s
            self.latency_s = seconds if old is None else 0.7 * old + 0.3 * seconds
            self.records.append(record)
            self.pending = False
            self.cond.notify_all()

    def pop(self, timeout_s: float = 30.0) -> np.ndarray:
        """The next action, waiting (a stall) if the queue is empty."""
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
                self.stalls.append(waited)
                if self.lead and self._popped:
                    self._align(waited)
            self._popped += 1
            return self.actions.popleft()

    def _align(self, waited_s: float) -> None:
        """Drop the stale head of a chunk that arrived ``waited_s`` after the queue ran dry:
        its first action was due then, so the one due now is floor(waited / tick) further."""
        late = min(int(waited_s / self.tick_s), len(self.actions) - 1)
        for _ in range(late):
            self.actions.popleft()
        if late:
            self.skipped.append(late)

    def join(self, timeout_s: float = 10.0) -> None:
        for t in self._threads:
            t.join(timeout_s)
