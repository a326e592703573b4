"""One log line per refused request, rate-limited: an operator sees what the servers turn away
and why, and a flood cannot turn the log into a second flood.

``RefusalLog.refused(kind, who, why)`` logs ``refused KIND from WHO: WHY`` at INFO, at most
``per_s`` lines a second for each kind; the lines held back are counted and the next line of
that kind says how many ("(+N more since)")."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("vlarun.refusals")


class RefusalLog:
    def __init__(self, per_s: float = 1.0, clock=time.monotonic) -> None:
        self.per_s, self.clock = per_s, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self.lines = 0  # lines written (tests, the dashboard)

    def refused(self, kind: str, who: str, why: str) -> None:
        now = self.clock()
        with self._lock:
            if now - self._last.get(kind, -1e9) < 1.0 / self.per_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._last[kind] = now
            held = self._held.pop(kind, 0)
            self.lines += 1
        more = f" (+{held} more since)" if held else ""
        log.info("refused %s from %s: %s%s", kind, who, why[:200], more)
