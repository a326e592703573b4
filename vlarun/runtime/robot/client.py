"""The robot's connection to the edge: requests with deadlines, health probes, link state.

``EdgeClient`` owns one DEALER socket and is used from one thread. Every call has a timeout;
a reply whose request id is not the one awaited (a late answer to a request the robot already
ran locally) is dropped. ``send`` fails at once when there is no live connection (IMMEDIATE),
which is how a dropped link is noticed without waiting for a deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import dataclass

import torch
import zmq

from vlarun.runtime.protocol import (
    RecordError,
    StageTiming,
    number,
    parse_schedule,
    parse_timings,
)
from vlarun.runtime.transport import RefusalWatch, Security, dealer_socket
from vlarun.sched.bookings import Booking, Slot
from vlarun.stages import wire
from vlarun.stages.graph import TensorSpec
from vlarun.stages.packet import DTYPES, Limits, Packet


class LinkDown(ConnectionError):
    """No live connection to the edge, or no reply before the deadline. After a timeout,
    ``sent_bytes`` went out and nothing came back for ``waited_s`` seconds: evidence that the
    link moves fewer than sent_bytes / waited_s bytes per second."""

    sent_bytes: int = 0
    waited_s: float = 0.0


@dataclass(kw_only=True)
class Reply:
    """A remote segment's result: tensors, the edge's per-stage timings, and what the robot
    measured (wall time from send to receive, bytes each way)."""

    packet: Packet
    timings: tuple[StageTiming, ...]
    server_s: float
    wall_s: float
    sent_bytes: int
    recv_bytes: int
    schedule: tuple[Slot, ...] = ()  # the edge's committed schedule at the reply
    late: bool = False  # set by the agent: arrived too late for the request to finish in time
    arrived_s: float = 0.0  # time.perf_counter() when it reached the socket (before decoding)


class BadReply(RuntimeError):
    """An edge reply that is well-formed on the wire but not a believable answer (missing or
    non-numeric timings, tensors of the wrong name, shape or dtype, non-finite values): the
    robot runs the segment itself, as after a refusal, and says why."""


def _number(x: object, what: str, low: float = 0.0) -> float:
    """A finite real >= ``low`` (bool is not a number here), or BadReply naming ``what``."""
    try:
        return number(x, what, low)
    except RecordError as e:
        raise BadReply(f"bad reply: {e}") from None


def check_timings(timings: object, stages: tuple[str, ...]) -> tuple[StageTiming, ...]:
    """The per-stage timings of a result for ``stages`` (``records.StageTiming``), or
    BadReply naming what is wrong."""
    try:
        return parse_timings(timings, stages)
    except RecordError as e:
        raise BadReply(f"bad reply: {e}") from None


def check_health(health: object) -> dict:
    """A health map with what planning reads made safe: ``stage_ms`` and ``queue`` keep
    only finite non-negative numbers per stage name, ``schedule`` only a well-formed one."""
    if not isinstance(health, dict):
        return {}
    out = dict(health)
    for key in ("stage_ms", "queue"):
        raw = health.get(key)
        clean = {}
        for name, v in raw.items() if isinstance(raw, dict) else ():
            with contextlib.suppress(BadReply):
                clean[name] = _number(v, key) if isinstance(name, str) else None
        out[key] = {k: v for k, v in clean.items() if v is not None}
    out["schedule"] = parse_schedule(health.get("schedule"))
    return out


def check_packet(packet: Packet, specs: dict[str, TensorSpec], exact: bool) -> None:
    """Every wanted tensor present and nothing else, of the spec's shape (``exact``: all of
    it; otherwise its rank and batch size, for accelerated streams whose intermediate sizes
    depend on their settings), floating point where the spec is, and finite."""
    got = set(packet.tensors)
    if got != set(specs):
        raise BadReply(f"bad reply: tensors {sorted(got)[:8]}, wanted {sorted(specs)}")
    for name, spec in specs.items():
        t = packet.tensors[name]
        shape = tuple(t.shape)
        same = (
            shape == spec.shape
            if exact
            else (len(shape) == len(spec.shape) and shape[:1] == spec.shape[:1])
        )
        if not same:
            raise BadReply(f"bad reply: {name} is {shape}, wanted {spec.shape}")
        if t.dtype.is_floating_point != DTYPES[spec.dtype][0].is_floating_point:
            raise BadReply(f"bad reply: {name} is {t.dtype}, wanted {spec.dtype}")
        if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()):
            raise BadReply(f"bad reply: {name} holds NaN or infinite values")


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
        self.refused: str | None = None  # why the edge turned the handshake down, once it did
        self._connect()

    def _connect(self) -> None:
        self.sock = dealer_socket(self.ctx, self.address, self.sec, self.limits.max_total_bytes)
        self._watch = RefusalWatch(
            self.sock, self.address, self.sec, quiet=self.refused is not None
        )

    @property
    def refusal(self) -> str | None:
        """Why the edge refused this robot's handshake (said once on stderr), or None."""
        return self.refused or self._watch.refused

    def close(self) -> None:
        self.refused = self.refusal
        self._watch.stop(self.sock)
        self.sock.close(0)

    def reset(self) -> None:
        """A fresh socket: drops anything queued for, or arriving from, the old connection."""
        self.close()
        self._connect()

    def _send(self, frames: list[bytes]) -> int:
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise LinkDown(f"no connection to {self.address}") from None
        return sum(len(f) for f in frames)

    def _await(self, rid: int, timeout_s: float) -> tuple[wire.Message, int, float]:
        """The reply to ``rid``, its size and when it arrived (``time.perf_counter()`` as the
        socket had it, before it was read and decoded)."""
        end = time.monotonic() + max(timeout_s, 0.0)
        while True:
            left = end - time.monotonic()
            if left <= 0 or not self.sock.poll(max(int(left * 1e3), 1), zmq.POLLIN):
                if time.monotonic() >= end:
                    raise LinkDown(f"no reply from {self.address} within {timeout_s * 1e3:.0f} ms")
                continue
            arrived = time.perf_counter()
            frames = [f.buffer for f in self.sock.recv_multipart(copy=False)]
            try:
                # The header first: an answer to another request (a late one, or a lying edge's
                # 256 MB "reply") is dropped without building its tensors.
                header = wire.decode_header(frames[0], self.limits)
                if header.rid != rid:
                    continue
                msg = wire.materialize(header, frames[1:], self.limits)
            except Exception:  # noqa: BLE001 - whatever the decoder trips on, from a peer
                continue  # a corrupt reply is as good as none; keep waiting for a valid one
            return msg, sum(len(f) for f in frames), arrived

    def listen(self, timeout_s: float) -> tuple[Slot, ...] | None:
        """Wait up to ``timeout_s`` for what the edge pushes unasked (its ledger, while
        robots are active): the newest schedule that came (checked as a health answer's), or
        None. Anything else that arrives (a late answer to an abandoned request) is dropped,
        as ``_await`` drops it."""
        end = time.monotonic() + max(timeout_s, 0.0)
        newest = None
        while True:
            # once a ledger came, only take what is already here (a newer one), then return
            left = 0.0 if newest is not None else end - time.monotonic()
            if not self.sock.poll(max(int(left * 1e3), 0), zmq.POLLIN):
                if newest is not None or time.monotonic() >= end:
                    return newest
                continue
            frames = self.sock.recv_multipart(copy=True)
            try:
                msg = wire.decode(frames, self.limits)
            except Exception:  # noqa: BLE001 - whatever the decoder trips on, from a peer
                continue
            if msg.kind == "control" and msg.meta.get("op") == "ledger":
                newest = parse_schedule(msg.meta.get("schedule"))

    def health(self, timeout_s: float = 1.0, listen: bool = False) -> tuple[dict, float]:
        """The edge's health map and the round-trip time in seconds. ``listen``: the edge
        pushes its ledger to this socket from now on, while robots are active (read it with
        ``listen()``)."""
        rid = next(_ids)
        t0 = time.perf_counter()
        self._send(wire.control("health", rid, **({"listen": True} if listen else {})))
        msg, _, _ = self._await(rid, timeout_s)
        return check_health(msg.meta), time.perf_counter() - t0

    def book(self, booking: Booking) -> None:
        """Announce an edge segment of a plan the moment it is chosen: its stages arrive in
        ``booking.arrive`` and are due in ``booking.deadline`` (seconds from now; sent held to
        what the edge accepts, ``Booking.to_wire``). Not waited for (the small answer is
        dropped by the next ``_await``): booking must not cost the request time."""
        self._send(wire.control("book", next(_ids), **booking.to_wire()))

    def probe(self, nbytes: int, timeout_s: float = 2.0) -> float:
        """Send ``nbytes`` of padding to the edge and wait for its small answer: seconds of
        the round trip (a bandwidth sample when the robot is not sending anything else)."""
        rid = next(_ids)
        pad = Packet({"pad": torch.zeros(nbytes, dtype=torch.uint8)})
        t0 = time.perf_counter()
        sent = self._send(
            wire.encode(wire.Message("control", rid=rid, meta={"op": "probe"}, packet=pad))
        )
        try:
            self._await(rid, timeout_s)
        except LinkDown as e:  # sent and not answered: evidence about the link's rate
            e.sent_bytes, e.waited_s = sent, time.perf_counter() - t0
            raise
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
        pad: int = 0,
    ) -> Reply:
        """Run ``stages`` on the edge; raise LinkDown when there is no reply in ``timeout_s``
        and RuntimeError when the edge refuses the request. ``pad``: zero bytes sent after the
        tensors (an emulated device's packet at the real model's size)."""
        rid = next(_ids)
        t0 = time.perf_counter()
        sent = self._send(request_frames(rid, stages, packet, want, budget_s, meta, codec, pad))
        try:
            reply, recv, arrived = self._await(rid, timeout_s)
        except LinkDown as e:
            e.sent_bytes, e.waited_s = sent, time.perf_counter() - t0
            raise
        wall = time.perf_counter() - t0
        if reply.kind == "error":
            why = str(reply.meta.get("error"))[:200]
            raise RuntimeError(f"edge refused {'+'.join(stages)}: {why}")
        if reply.kind != "result":
            raise BadReply(f"bad reply: a {str(reply.kind)[:20]!r} message answered a request")
        # Checked here, before any of it is used: a lying edge costs a fallback, not a crash.
        return Reply(
            packet=reply.packet,
            timings=check_timings(reply.meta.get("timings"), stages),
            server_s=_number(reply.meta.get("server_s"), "server_s"),
            wall_s=wall,
            sent_bytes=sent,
            recv_bytes=recv,
            schedule=parse_schedule(reply.meta.get("schedule")),
            arrived_s=arrived,
        )


def request_frames(
    rid: int,
    stages: tuple[str, ...],
    packet: Packet,
    want: tuple[str, ...],
    budget_s: float,
    meta: dict | None = None,
    codec: wire.Codec | None = None,
    pad: int = 0,
) -> list[bytes]:
    """The frames of a data request (``EdgeClient.run``'s arguments): ``stages`` to run on
    ``packet`` within ``budget_s``, the outputs in ``want`` sent back in ``codec``."""
    meta = {**(meta or {}), "want": list(want)}
    if codec is not None:
        meta["reply_codec"] = {"reduce": codec.reduce, "compress": codec.compress}
    msg = wire.Message(
        "data",
        rid=rid,
        stage="+".join(stages),
        deadline_s=budget_s,
        meta=meta,
        packet=packet,
        pad=pad,
    )
    return wire.encode(msg, codec)


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


def reply_limits(policy, emulator=None) -> Limits:
    """What an edge may answer this robot: no packet larger than twice the largest a stage of
    its graph emits (at the longest prompt; an emulated run's stages padded to the real
    model's), with a MiB for the header. A larger "answer" is a lying or broken edge, refused
    by the socket before it is buffered (256 MB replies made a robot miss 45% of deadlines)."""
    graph = policy.graph(policy.model.cfg.max_text_tokens)
    largest = max(st.out_bytes for st in graph.stages)
    if emulator is not None:
        largest = max(largest, *(int(w.out_bytes) for w in emulator.works))
    bound = 2 * int(largest) + (1 << 20)
    return Limits(max_tensor_bytes=bound, max_total_bytes=bound)
