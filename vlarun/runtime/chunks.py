"""Asynchronous action-chunk queue: the next inference runs while the robot executes actions.

The robot pops one action per control tick. When the queue holds ``refill_at`` actions or
fewer, it asks for a new chunk from the current observation; the inference runs on a
background thread. A chunk computed from the observation of step i arrives at step j > i:
its first j - i actions belong to steps already executed, so they are skipped and the rest
replace the queue (the fresher chunk wins). If the queue runs dry before a chunk arrives, the
robot waits: that wait is a stall, counted and timed, never hidden.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np


class ChunkQueue:
    def __init__(self, infer: Callable[[dict], tuple[np.ndarray, object]], refill_at: int = 1):
        self.infer, self.refill_at = infer, refill_at
        self.actions: deque[np.ndarray] = deque()
        self.cond = threading.Condition()
        self.step = 0  # actions popped so far
        self.pending = False
        self.records: list = []  # what ``infer`` returned beside the actions, in order
        self.errors: list[BaseException] = []
        self.stalls: list[float] = []
        self._threads: list[threading.Thread] = []

    def request(self, obs: dict) -> bool:
        """Start an inference on ``obs`` unless one is in flight; True if started."""
        with self.cond:
            if self.pending:
                return False
            self.pending = True
            at = self.step
        t = threading.Thread(target=self._run, args=(obs, at), daemon=True)
        self._threads.append(t)
        t.start()
        return True

    def needs_refill(self) -> bool:
        with self.cond:
            return not self.pending and len(self.actions) <= self.refill_at

    def _run(self, obs: dict, at: int) -> None:
        try:
            chunk, record = self.infer(obs)
        except BaseException as e:  # surfaced by pop(), never swallowed
            with self.cond:
                self.errors.append(e)
                self.pending = False
                self.cond.notify_all()
            return
        with self.cond:
            skip = self.step - at
            fresh = list(chunk)[skip:]
            if fresh:
                self.actions = deque(fresh)
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
            self.step += 1
            return self.actions.popleft()

    def join(self, timeout_s: float = 10.0) -> None:
        for t in self._threads:
            t.join(timeout_s)
