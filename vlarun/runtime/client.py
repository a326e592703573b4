"""The robot's connection to the edge: requests with deadlines, health probes, link state.

``EdgeClient`` owns one DEALER socket and is used from one thread. Every call has a timeout;
a reply whose request id is not the one awaited (a late answer to a request the robot already
ran locally) is dropped. ``send`` fails at once when there is no live connection (IMMEDIATE),
which is how a dropped link is noticed without waiting for a deadline.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch
import zmq

from vlarun.runtime.transport import Security, dealer_socket
from vlarun.stages import wire
from vlarun.stages.packet import Limits, Packet, PacketError


class LinkDown(ConnectionError):
    """No live connection to the edge, or no reply before the deadline. After a timeout,
    ``sent_bytes`` went out and nothing came back for ``waited_s`` seconds: evidence that the
    link moves fewer than sent_bytes / waited_s bytes per second."""

    sent_bytes: int = 0
    waited_s: float = 0.0


@dataclass
class Reply:
    """A remote segment's result: tensors, the edge's per-stage timings, and what the robot
    measured (wall time from send to receive, bytes each way)."""

    packet: Packet
    timings: list[dict]
    server_s: float
    wall_s: float
    sent_bytes: int
    recv_bytes: int
    schedule: list = field(default_factory=list)  # the edge's committed schedule at the reply


_ids = itertools.count(1)


class EdgeClient:
    def __init__(
        self,
        address: str,
        sec: Security,
        ctx: zmq.Context | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.address, self.sec = address, sec
        self.ctx = ctx or zmq.Context.instance()
        self.limits = limits or Limits()
        self.sock = dealer_socket(self.ctx, address, sec)

    def close(self) -> None:
        self.sock.close(0)

    def reset(self) -> None:
        """A fresh socket: drops anything queued for, or arriving from, the old connection."""
        self.sock.close(0)
        self.sock = dealer_socket(self.ctx, self.address, self.sec)

    def _send(self, frames: list[bytes]) -> int:
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise LinkDown(f"no connection to {self.address}") from None
        return sum(len(f) for f in frames)

    def _await(self, rid: int, timeout_s: float) -> tuple[wire.Message, int]:
        end = time.monotonic() + max(timeout_s, 0.0)
        while True:
            left = end - time.monotonic()
            if left <= 0 or not self.sock.poll(max(int(left * 1e3), 1), zmq.POLLIN):
                if time.monotonic() >= end:
                    raise LinkDown(f"no reply from {self.address} within {timeout_s * 1e3:.0f} ms")
                continue
            frames = self.sock.recv_multipart(copy=True)
            try:
                msg = wire.decode(frames, self.limits)
            except PacketError:
                continue  # a corrupt reply is as good as none; keep waiting for a valid one
            if msg.rid == rid:
                return msg, sum(len(f) for f in frames)

    def health(self, timeout_s: float = 1.0) -> tuple[dict, float]:
        """The edge's health map and the round-trip time in seconds."""
        rid = next(_ids)
        t0 = time.perf_counter()
        self._send(wire.control("health", rid))
        msg, _ = self._await(rid, timeout_s)
        return msg.meta, time.perf_counter() - t0

    def probe(self, nbytes: int, timeout_s: float = 2.0) -> float:
        """Send ``nbytes`` of padding to the edge and wait for its small answer: seconds of
        the round trip (a bandwidth sample when the robot is not sending anything else)."""
        rid = next(_ids)
        pad = Packet({"pad": torch.zeros(nbytes, dtype=torch.uint8)})
        t0 = time.perf_counter()
        self._send(wire.encode(wire.Message("control", rid, meta={"op": "probe"}, packet=pad)))
        self._await(rid, timeout_s)
        return time.perf_counter() - t0

    def run(
        self,
        stages: tuple[str, ...],
        packet: Packet,
        want: tuple[str, ...],
        budget_s: float,
        timeout_s: float,
        meta: dict | None = None,
        codec: wire.Codec | None = None,
    ) -> Reply:
        """Run ``stages`` on the edge; raise LinkDown when there is no reply in ``timeout_s``
        and RuntimeError when the edge refuses the request."""
        rid = next(_ids)
        meta = {**(meta or {}), "want": list(want)}
        if codec is not None:
            meta["reply_codec"] = {"reduce": codec.reduce, "compress": codec.compress}
        msg = wire.Message("data", rid, "+".join(stages), budget_s, meta, packet)
        t0 = time.perf_counter()
        sent = self._send(wire.encode(msg, codec))
        try:
            reply, recv = self._await(rid, timeout_s)
        except LinkDown as e:
            e.sent_bytes, e.waited_s = sent, time.perf_counter() - t0
            raise
        wall = time.perf_counter() - t0
        if reply.kind == "error":
            raise RuntimeError(f"edge refused {'+'.join(stages)}: {reply.meta.get('error')}")
        return Reply(
            reply.packet,
            reply.meta.get("timings", []),
            float(reply.meta.get("server_s", 0.0)),
            wall,
            sent,
            recv,
            reply.meta.get("schedule", []) if isinstance(reply.meta.get("schedule"), list) else [],
        )


def ping(address: str, sec: Security, count: int = 5, timeout_s: float = 1.0) -> dict:
    """`vlarun ping`: round-trip times of health requests and the edge's queue state."""
    client = EdgeClient(address, sec, zmq.Context.instance())
    rtts, health = [], {}
    try:
        deadline = time.monotonic() + timeout_s
        while True:  # the TCP/Curve handshake takes a moment; IMMEDIATE refuses until then
            try:
                health, rtt = client.health(timeout_s)
                break
            except LinkDown:
                if time.monotonic() > deadline:
                    raise LinkDown(
                        f"no answer from {address} within {timeout_s:g} s "
                        "(wrong address, edge down, or keys that do not match)"
                    ) from None
                time.sleep(0.02)
        for _ in range(count):
            health, rtt = client.health(timeout_s)
            rtts.append(rtt * 1e3)
    finally:
        client.close()
    rtts.sort()
    return {
        "edge": address,
        "rtt_ms": rtts[len(rtts) // 2],
        "rtt_min_ms": rtts[0],
        "rtt_max_ms": rtts[-1],
        "count": len(rtts),
        "queue": health.get("queue", {}),
        "health": health,
        "secure": not sec.insecure,
    }
