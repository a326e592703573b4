"""The robot-edge link: bandwidth and round-trip time, updated online from observed transfers.

A packet of n bytes takes  tau(n) = rtt / 2 + 8 n / bandwidth  one way. Each observed transfer
gives a delivery-rate sample  8 n / (seconds - rtt / 2). The estimate is the largest sample of
the last ``window_s`` seconds (a max filter, as BBR estimates bottleneck bandwidth: a transfer
can be slowed by anything on the way, never sped up past the link), so a restored link shows in
the estimate with its first fast sample, not after an EWMA has climbed back. Two rules make it
follow changes the other way:
  * change detection: two samples in a row below half the estimate mean the link changed;
    the older samples are forgotten at once;
  * a timeout is an upper bound (``cap``): bytes not through within the wait moved slower than
    bytes / wait. The bound holds for ``cap_s`` seconds or until a sample beats it, then the
    estimate returns to the samples' word, so one lost packet does not bar the edge for good.
With no recent sample the newest sample's word holds. Transfers too small to say anything about
bandwidth (mostly latency) update only the RTT; one no slower than the path's own delay counts
at its whole time (a lower bound on the rate, still a sample).

A sample takes off the path's own delay: the least RTT of the last ``rtt_window_s`` seconds
(``base_rtt_ms``, BBR's min_rtt), not the EWMA ``rtt_ms``. RTT samples come from health
answers, which the edge computes (its schedule) and answers between other work; the EWMA
carries that time, and taken off a 13 ms probe it reads the link fast: 2.4 ms too much RTT
reads a 60 Mbit/s link as 74 (the robot's estimate at edge utilisation 0.8 averaged 73.6).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# Below this size a transfer's time is mostly RTT; it would make a noisy bandwidth sample.
MIN_BANDWIDTH_SAMPLE_BYTES = 64 * 1024


@dataclass
class Link:
    """Link estimate; ``bandwidth_mbps`` is the current estimate (the starting one when built),
    ``alpha`` the EWMA weight of a new RTT sample. Invariant: bandwidth > 0 and rtt >= 0."""

    bandwidth_mbps: float
    rtt_ms: float
    alpha: float = 0.3
    window_s: float = 2.0
    cap_s: float = 2.0
    rtt_window_s: float = 10.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    _samples: deque = field(default_factory=deque, init=False, repr=False, compare=False)
    _held: float = field(default=0.0, init=False, repr=False, compare=False)
    _cap: tuple[float, float] | None = field(default=None, init=False, repr=False, compare=False)
    _rtts: deque = field(default_factory=deque, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.bandwidth_mbps <= 0 or self.rtt_ms < 0:
            raise ValueError(
                f"link needs bandwidth > 0 and rtt >= 0, got {self.bandwidth_mbps} Mbps, "
                f"{self.rtt_ms} ms"
            )
        if not 0 < self.alpha <= 1:
            raise ValueError("alpha must lie in (0, 1]")
        if self.window_s <= 0 or self.cap_s <= 0 or self.rtt_window_s <= 0:
            raise ValueError("window_s, cap_s and rtt_window_s must be > 0")
        self._held = self.bandwidth_mbps

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_mbps * 1e6 / 8

    def transfer_s(self, nbytes: float) -> float:
        """One-way time of a packet of ``nbytes``."""
        return self.rtt_ms * 1e-3 / 2 + nbytes / self.bytes_per_s

    @property
    def base_rtt_ms(self) -> float:
        """The path's own round trip: the least RTT sample of the last ``rtt_window_s``
        seconds (``rtt_ms`` before any)."""
        now = self.clock()
        while self._rtts and now - self._rtts[0][0] > self.rtt_window_s:
            self._rtts.popleft()
        return min((r for _, r in self._rtts), default=self.rtt_ms)

    def observe_transfer(self, nbytes: int, seconds: float) -> None:
        """Fold one measured one-way transfer into the bandwidth estimate."""
        self._sample(nbytes, seconds, seconds - self.base_rtt_ms * 1e-3 / 2)

    def observe_probe(self, nbytes: int, round_trip_s: float) -> None:
        """Fold a probe's round trip (``nbytes`` out, a small answer back) into the estimate."""
        self._sample(nbytes, round_trip_s, round_trip_s - self.base_rtt_ms * 1e-3)

    def _sample(self, nbytes: int, seconds: float, payload_s: float) -> None:
        """One bandwidth sample: ``nbytes`` moved in ``payload_s`` of the ``seconds`` taken."""
        if nbytes < MIN_BANDWIDTH_SAMPLE_BYTES or seconds <= 0:
            return
        if payload_s <= 0:
            # As fast as the path's least round trip: too fast to time against it, but the
            # bytes did arrive within ``seconds``, so the link carries at least that rate.
            # Dropping such a sample (as before) let a fast link's probes all vanish on a
            # loopback edge (0.3 ms probes, 0.3 ms health answers): a timeout's bound then
            # held a restored link down, and no handoff came (tests/runtime/test_emulate).
            payload_s = seconds
        sample = nbytes * 8 / payload_s / 1e6
        now = self.clock()
        self._samples.append((now, sample))
        if self._cap is not None and sample > self._cap[0]:
            self._cap = None  # the link just delivered faster than the bound says
        if len(self._samples) >= 2:
            best = max(m for _, m in self._samples)
            last_two = [m for _, m in list(self._samples)[-2:]]
            if all(m < 0.5 * best for m in last_two):  # the link changed: forget the rest
                self._samples = deque(list(self._samples)[-2:])
        self.refresh()

    def cap(self, mbps: float) -> None:
        """An upper bound from a timeout, held for ``cap_s`` seconds (or until beaten). A
        bound that comes while a lower one still holds renews the lower one: both are true."""
        if mbps > 0:
            now = self.clock()
            if self._cap is not None and now < self._cap[1]:
                mbps = min(mbps, self._cap[0])
            self._cap = (mbps, now + self.cap_s)
            self.refresh()

    def bound(self, nbytes: int, waited_s: float) -> None:
        """``nbytes`` sent and no answer within ``waited_s``: cap the estimate at the rate
        that would have delivered them (the answer's half round trip taken off)."""
        payload_s = waited_s - self.base_rtt_ms * 1e-3 / 2
        if nbytes >= MIN_BANDWIDTH_SAMPLE_BYTES and payload_s > 0:
            self.cap(nbytes * 8 / payload_s / 1e6)

    def refresh(self) -> None:
        """Recompute the estimate: expire old samples and a stale cap."""
        now = self.clock()
        while self._samples and now - self._samples[0][0] > self.window_s:
            _, newest = self._samples.popleft()
            if not self._samples:
                # The window emptied: what holds is the link's last word, not a max taken
                # while an older fast sample was still in it (that read a 2 Mbit/s link as 60
                # once its bound expired, and sent a request into it).
                self._held = newest
        if self._samples:
            self._held = max(m for _, m in self._samples)
        estimate = self._held
        if self._cap is not None:
            if now < self._cap[1]:
                estimate = min(estimate, self._cap[0])
            else:
                self._cap = None
        self.bandwidth_mbps = estimate

    def observe_rtt(self, seconds: float) -> None:
        if seconds >= 0:
            self.rtt_ms = (1 - self.alpha) * self.rtt_ms + self.alpha * seconds * 1e3
            self._rtts.append((self.clock(), seconds * 1e3))
