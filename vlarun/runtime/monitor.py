"""Background link monitor: health probes on a socket of its own.

While the edge is up it probes every ``up_every_s`` (round-trip time for the link estimate,
queue depth and stage times for the predictor's view of the edge). When the agent reports the
link down, it probes every ``down_every_s`` and sets ``up`` again as soon as the edge answers,
so the agent reconnects in the background without ever blocking a control step on it.
"""

from __future__ import annotations

import contextlib
import threading
import time

import zmq

from vlarun.runtime.client import EdgeClient, LinkDown
from vlarun.runtime.transport import Security


class LinkMonitor:
    def __init__(
        self,
        address: str,
        sec: Security,
        ctx: zmq.Context,
        up_every_s: float = 0.5,
        down_every_s: float = 0.1,
        timeout_s: float = 0.3,
        probe_every_s: float = 0.25,
        probe_bytes: int = 96 * 1024,
        probe_share: float = 0.25,
    ) -> None:
        self.address, self.sec, self.ctx = address, sec, ctx
        self.up_every_s, self.down_every_s, self.timeout_s = up_every_s, down_every_s, timeout_s
        self.up = threading.Event()
        self.lock = threading.Lock()
        self.health: dict = {}
        self.health_at = 0.0  # monotonic time the last health reply came
        self.rtts: list[float] = []  # new RTT samples (s), taken by the agent
        # A robot that runs everything locally sends nothing, so its bandwidth estimate would
        # stay at the last bad value forever; idle links are probed to notice a recovery: every
        # ``probe_every_s`` (a restored link shows within about that, since the estimate takes
        # the best recent sample), but never more than ``probe_share`` of the link's time
        # (a probe that took 0.4 s on a 2 Mbit/s link waits 1.6 s for the next).
        self.probe_every_s, self.probe_bytes = probe_every_s, probe_bytes
        self.probe_share = probe_share
        self._probe_took = 0.0
        self.transfers: list[tuple[int, float]] = []  # (bytes, round-trip s) of probes
        self.last_remote = 0.0  # monotonic time of the agent's last remote request
        self._last_probe = 0.0
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="link-monitor", daemon=True)

    def start(self, wait_s: float = 0.0) -> LinkMonitor:
        self._thread.start()
        self.up.wait(wait_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def mark_down(self) -> None:
        self.up.clear()

    def take_rtts(self) -> list[float]:
        with self.lock:
            out, self.rtts = self.rtts, []
        return out

    def take_transfers(self) -> list[tuple[int, float]]:
        with self.lock:
            out, self.transfers = self.transfers, []
        return out

    def probe_due(self, now: float) -> bool:
        """Whether an idle link is due a probe (none while the agent's requests measure it)."""
        if self.probe_every_s <= 0 or now - self.last_remote <= self.probe_every_s:
            return False
        spacing = max(self.probe_every_s, self._probe_took / self.probe_share)
        return now - self._last_probe >= spacing

    def _maybe_probe(self, client: EdgeClient) -> None:
        now = time.monotonic()
        if not self.probe_due(now):
            return
        self._last_probe = now
        try:
            seconds = client.probe(self.probe_bytes, timeout_s=max(self.up_every_s, 1.0))
        except LinkDown:
            self._probe_took = time.monotonic() - now
            raise
        self._probe_took = seconds
        with self.lock:
            self.transfers.append((self.probe_bytes, seconds))

    def _loop(self) -> None:
        client = EdgeClient(self.address, self.sec, self.ctx)
        try:
            while not self._stop.is_set():
                was_up = self.up.is_set()
                try:
                    health, rtt = client.health(self.timeout_s)
                except LinkDown:
                    self.up.clear()
                    if was_up:  # a fresh socket: nothing queued for the dead link survives
                        client.reset()
                else:
                    with self.lock:
                        self.health = health
                        self.health_at = time.monotonic()
                        self.rtts.append(rtt)
                    if not was_up:
                        self.reconnects += 1
                    self.up.set()
                    with contextlib.suppress(LinkDown):
                        self._maybe_probe(client)
                self._stop.wait(self.up_every_s if self.up.is_set() else self.down_every_s)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                client.close()
