"""Background link monitor: health probes on a socket of its own.

While the edge is up it probes every ``up_every_s`` (round-trip time for the link estimate,
queue depth and stage times for the predictor's view of the edge). When the agent reports the
link down, it probes every ``down_every_s`` and sets ``up`` again as soon as the edge answers,
so the agent reconnects in the background without ever blocking a control step on it.

An idle link (the robot running everything here) is probed with a padding packet: a probe
that comes back is a bandwidth sample, one that does not within ``probe_timeout_s`` is an
upper bound (its bytes moved slower than bytes / wait). ``feed`` hands both to the agent's
``Link``: the bounds keep a dropped link's estimate down while it stays down (each failed
probe renews the bound before the last one expires), the first fast probe after a restore
lifts it.

A slow link (the last probe took over a quarter of ``probe_timeout_s``) is probed lightly:
``LIGHT_PROBE_BYTES`` every ``slow_probe_every_s``, or as the share allows (a full probe
would hold a 2 Mbit/s link for 0.4 s, and the share rule would space the next one 0.8 s
later: the restore was seen 0.8-2.7 s late). A light probe is no bandwidth sample (too
small: mostly round trip), only a question: did it come back at least ``LIGHT_GAIN`` times
faster than the slow rate says? Then a full probe follows at once, and its sample lifts the
estimate (a probe train of two).
"""

from __future__ import annotations

import contextlib
import threading
import time

import zmq

from vlarun.runtime.robot.client import EdgeClient, LinkDown
from vlarun.runtime.transport import Security
from vlarun.sched.link import Link

LIGHT_PROBE_BYTES = 16 * 1024
LIGHT_GAIN = 4.0


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
        slow_probe_every_s: float = 0.1,
        probe_bytes: int = 96 * 1024,
        probe_share: float = 0.5,
        probe_timeout_s: float = 0.4,
        clock_scale: float = 1.0,
    ) -> None:
        # clock_scale multiplies every interval and timeout here: an emulated run whose times
        # are divided by its time scale passes 1 / time_scale, so that its probes wait and
        # space as they would on the emulated clock (a probe timing out at a third of its
        # emulated wait would bound the link three times too loosely).
        if clock_scale <= 0:
            raise ValueError(f"clock_scale must be > 0, got {clock_scale}")
        up_every_s, down_every_s, timeout_s, probe_every_s, probe_timeout_s = (
            x * clock_scale
            for x in (up_every_s, down_every_s, timeout_s, probe_every_s, probe_timeout_s)
        )
        self.slow_probe_every_s = slow_probe_every_s * clock_scale
        self.address, self.sec, self.ctx = address, sec, ctx
        self.up_every_s, self.down_every_s, self.timeout_s = up_every_s, down_every_s, timeout_s
        self.up = threading.Event()
        self.lock = threading.Lock()
        self.health: dict = {}
        self.health_at = 0.0  # monotonic time the last health reply came
        # The ledger the edge pushes between health answers (while robots are active: within
        # 20 ms of a change, every 0.25 s otherwise): the committed schedule, and when it came.
        self.ledger: tuple = ()  # bookings.Slot
        self.ledger_at = 0.0
        self.rtts: list[float] = []  # new RTT samples (s), taken by the agent
        # A robot that runs everything locally sends nothing, so its bandwidth estimate would
        # stay at the last bad value forever; idle links are probed to notice a recovery: every
        # ``probe_every_s`` (a restored link shows within about that, since the estimate takes
        # the best recent sample), but never more than ``probe_share`` of the link's time
        # (a probe that took 0.4 s on a 2 Mbit/s link waits 0.8 s for the next). Half: probes
        # run only while the robot sends nothing itself, and a restored link shows with the
        # first probe after it (at a quarter, a 2 Mbit/s drop delayed the return by ~2 s).
        self.probe_every_s, self.probe_bytes = probe_every_s, probe_bytes
        self.probe_share = probe_share
        # A failed probe waits this long, and the next one waits probe_timeout_s / probe_share
        # (0.8 s): less than ``Link.cap_s`` (2 s), so the bound it leaves is renewed in time.
        self.probe_timeout_s = probe_timeout_s
        self._probe_took = 0.0
        self.slow_rate: float | None = None  # bytes/s of the last slow full probe (None: fast)
        self.light_probes = 0
        # What the probes showed, in order: ("transfer", bytes, round-trip s), ("bound",
        # bytes, s waited) of a probe that timed out, ("cap", Mbit/s, 0) of a light one.
        self.evidence: list[tuple[str, float, float]] = []
        self.last_remote = 0.0  # monotonic time of the agent's last remote request
        self._last_probe = 0.0
        self.reconnects = 0
        # The edge's outages as this robot saw them, in order: [down at, up at] (monotonic;
        # up None while it lasts). Down: a health check went unanswered, or the agent marked
        # the link down; up: the next health answer (``episode.outage_timelines`` reads them).
        self.outages: list[list[float | None]] = []
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
        self._went_down()
        self.up.clear()

    def _went_down(self) -> None:
        with self.lock:
            if not self.outages or self.outages[-1][1] is not None:
                self.outages.append([time.monotonic(), None])

    def _came_up(self, now: float) -> None:
        with self.lock:
            if self.outages and self.outages[-1][1] is None:
                self.outages[-1][1] = now

    # The longest from an edge answering again to this monitor seeing it: a probe on the dead
    # link is waited out (``timeout_s``), then the next is sent ``down_every_s`` later.
    @property
    def restore_bound_s(self) -> float:
        return self.timeout_s + self.down_every_s

    def take_rtts(self) -> list[float]:
        with self.lock:
            out, self.rtts = self.rtts, []
        return out

    def take_evidence(self) -> list[tuple[str, float, float]]:
        with self.lock:
            out, self.evidence = self.evidence, []
        return out

    def feed(self, link: Link) -> None:
        """Fold what the monitor measured since the last call into ``link``: round-trip times,
        then the probes' evidence in the order it came: transfers (round trips) and the upper
        bounds of probes that timed out (a light one's: the slow rate it tested). In order,
        because a sample clears an older bound: a bound fed after the sample that beat it held
        a restored link down until the next."""
        for rtt in self.take_rtts():
            link.observe_rtt(rtt)
        for kind, a, b in self.take_evidence():
            if kind == "transfer":
                link.observe_probe(int(a), b)
            elif kind == "bound":
                link.bound(int(a), b)
            else:
                link.cap(a)

    def probe_due(self, now: float) -> bool:
        """Whether an idle link is due a probe (none while the agent's requests measure it)."""
        every = self.probe_every_s if self.slow_rate is None else self.slow_probe_every_s
        if self.probe_every_s <= 0 or now - self.last_remote <= every:
            return False
        spacing = max(every, self._probe_took / self.probe_share)
        return now - self._last_probe >= spacing

    def _maybe_probe(self, client: EdgeClient) -> None:
        now = time.monotonic()
        if not self.probe_due(now):
            return
        self._last_probe = now
        if self.slow_rate is not None:
            expected = LIGHT_PROBE_BYTES / self.slow_rate  # its time were the link still slow
            try:
                seconds = client.probe(LIGHT_PROBE_BYTES, timeout_s=expected)
            except LinkDown as e:
                if e.sent_bytes:  # not through in the slow rate's time: no faster than that
                    with self.lock:
                        self.evidence.append(("cap", self.slow_rate * 8 / 1e6, 0.0))
                client.reset()  # still slow (or gone): its bytes must not delay the next
                self._probe_took = time.monotonic() - now
                raise
            self.light_probes += 1
            self._probe_took = seconds
            if seconds * LIGHT_GAIN > expected:
                return  # about as slow as before
        self._full_probe(client)

    def _full_probe(self, client: EdgeClient) -> None:
        """A probe of ``probe_bytes``: a bandwidth sample, or an upper bound on a timeout."""
        now = time.monotonic()
        try:
            seconds = client.probe(self.probe_bytes, timeout_s=self.probe_timeout_s)
        except LinkDown as e:
            self._probe_took = time.monotonic() - now
            if e.sent_bytes:  # sent, not answered in time (not: no connection to send on)
                with self.lock:
                    self.evidence.append(("bound", e.sent_bytes, e.waited_s))
                self.slow_rate = e.sent_bytes / max(e.waited_s, 1e-6)
            # The probe's bytes still queued would delay the health checks (and the next
            # probe) behind them: a fresh socket starts the next measurement clean.
            client.reset()
            raise
        self._probe_took = seconds
        slow = seconds > self.probe_timeout_s / 4
        self.slow_rate = self.probe_bytes / seconds if slow else None
        with self.lock:
            self.evidence.append(("transfer", self.probe_bytes, seconds))

    def _listen(self, client: EdgeClient, seconds: float) -> None:
        """Wait ``seconds`` (or until stopped) for the next health check, keeping the newest
        ledger the edge pushes meanwhile; a slow link's probes go on meanwhile."""
        end = time.monotonic() + seconds
        while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
            if self.slow_rate is not None and self.up.is_set():
                with contextlib.suppress(LinkDown):
                    self._maybe_probe(client)
                left = end - time.monotonic()
                if left <= 0:
                    return
            try:
                schedule = client.listen(min(left, 0.05))
            except zmq.ZMQError:
                return
            if schedule is not None:
                with self.lock:
                    self.ledger, self.ledger_at = schedule, time.monotonic()

    def _loop(self) -> None:
        client = EdgeClient(self.address, self.sec, self.ctx)
        try:
            while not self._stop.is_set():
                was_up = self.up.is_set()
                try:
                    health, rtt = client.health(self.timeout_s, listen=True)
                except LinkDown:
                    if was_up:
                        self._went_down()
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
                    self._came_up(self.health_at)
                    self.up.set()
                    with contextlib.suppress(LinkDown):
                        self._maybe_probe(client)
                self._listen(client, self.up_every_s if self.up.is_set() else self.down_every_s)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                client.close()
