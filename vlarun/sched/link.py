"""The robot-edge link: bandwidth and round-trip time, updated online from observed transfers.

A packet of n bytes takes  tau(n) = rtt / 2 + 8 n / bandwidth  one way. Each observed transfer
gives a bandwidth sample  8 n / (seconds - rtt / 2), folded in by EWMA, so a bandwidth drop
(200 -> 50 Mbps) shows up in the estimate after a few packets and the scheduler re-plans.
Transfers too small to say anything about bandwidth (mostly latency) update only the RTT.
"""

from __future__ import annotations

from dataclasses import dataclass

# Below this size a transfer's time is mostly RTT; it would make a noisy bandwidth sample.
MIN_BANDWIDTH_SAMPLE_BYTES = 64 * 1024


@dataclass
class Link:
    """Link estimate; ``alpha`` is the EWMA weight of a new sample. Invariant: bandwidth > 0
    and rtt >= 0."""

    bandwidth_mbps: float
    rtt_ms: float
    alpha: float = 0.3

    def __post_init__(self) -> None:
        if self.bandwidth_mbps <= 0 or self.rtt_ms < 0:
            raise ValueError(
                f"link needs bandwidth > 0 and rtt >= 0, got {self.bandwidth_mbps} Mbps, "
                f"{self.rtt_ms} ms"
            )
        if not 0 < self.alpha <= 1:
            raise ValueError("alpha must lie in (0, 1]")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_mbps * 1e6 / 8

    def transfer_s(self, nbytes: float) -> float:
        """One-way time of a packet of ``nbytes``."""
        return self.rtt_ms * 1e-3 / 2 + nbytes / self.bytes_per_s

    def observe_transfer(self, nbytes: int, seconds: float) -> None:
        """Fold one measured one-way transfer into the bandwidth estimate."""
        payload_s = seconds - self.rtt_ms * 1e-3 / 2
        if nbytes < MIN_BANDWIDTH_SAMPLE_BYTES or payload_s <= 0:
            return
        sample = nbytes * 8 / payload_s / 1e6
        self.bandwidth_mbps = (1 - self.alpha) * self.bandwidth_mbps + self.alpha * sample

    def observe_rtt(self, seconds: float) -> None:
        if seconds >= 0:
            self.rtt_ms = (1 - self.alpha) * self.rtt_ms + self.alpha * seconds * 1e3
