"""Open-loop background load: the other robots of a loaded edge, in a process of their own.

A benchmark cell's load must be what a fleet puts on the edge, not what the bench's spare
CPU lets a few more agents do. Agents run as threads of the bench's process share its
interpreter lock with the robot being measured, and their own fallbacks and waits change the
load they make. Here each background robot sends the same request, encoded once (the
policy's input packet for one camera frame, the whole graph on the edge, padded to the
emulated model's packet), every ``period_s``, robot ``i`` at phase ``i / robots`` of the
period, whether or not its last answer came: open loop, so the arrival process is the
fleet's, not a function of the edge's speed. Answers are read and counted (answered in
time, answered late, refused, lost), never used; ``run(rows=...)`` also keeps one row per
request (when it was sent, how it ended, its wall time, the edge's compute share for it), as
`vlarun bench scaleout` reads them. This is the one load generator: a benchmark that needs
robots sending requests runs it, in a process of its own or a thread.

The parent encodes the request (``encode_request``) and hands it over in a file of
length-prefixed frames (``write_frames`` / ``read_frames``, no pickle); each send renumbers
the header only (``wire.renumber``). ``OpenLoopLoad`` starts the process (pinned where the
bench says) and collects its counts when it stops.

    python -m vlarun.runtime.testbed.loadgen --edge tcp://127.0.0.1:5555 --frames req.bin \\
        --robots 4 --period-s 3.3 --insecure
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from vlarun.runtime.protocol import RecordError, parse_timings
from vlarun.stages import wire
from vlarun.stages.packet import Limits

MAGIC = b"VLRQ"
MAX_FRAMES = 64  # a request has a header, one frame per tensor and a pad frame
MAX_FRAME_BYTES = 1 << 30


def camera_frames(policy, seed: int = 0) -> np.ndarray:
    """Random uint8 frames of every camera the policy reads: (cameras, S, S, 3)."""
    cfg = policy.model.cfg
    shape = (cfg.num_images, cfg.image_size, cfg.image_size, 3)
    return np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8)


def encode_request(policy, instruction: str, budget_s: float, emulator=None) -> list[bytes]:
    """The frames of one whole-policy request of ``policy`` (a random camera frame, a zero
    state), with ``budget_s`` for the edge; padded to the real model's first input packet
    when an ``emulate.StageEmulator`` stands in for it."""
    from vlarun.runtime.robot.client import request_frames

    image = camera_frames(policy)
    state = np.zeros(policy.state_size, dtype=np.float32) if policy.state_size else None
    packet, ids = policy.inputs(image, instruction, state, 0)
    graph = policy.graph(len(ids))
    stages = tuple(s.name for s in graph.stages)
    want = tuple(s.name for s in graph.stages[-1].outputs)
    meta = {"batch": 1, "text_tokens": len(ids)}
    pad = 0 if emulator is None else emulator.pad_bytes(stages, "in", packet.nbytes)
    return request_frames(0, stages, packet, want, budget_s, meta, None, pad)


def write_frames(frames: list[bytes], path: Path) -> None:
    """``MAGIC``, the frame count and each frame's length (big-endian), then the frames."""
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack(">I", len(frames)))
        f.write(b"".join(struct.pack(">Q", len(fr)) for fr in frames))
        for fr in frames:
            f.write(fr)


def read_frames(path: Path) -> list[bytes]:
    """The frames ``write_frames`` wrote; a file that is not one raises ``ValueError``."""
    data = Path(path).read_bytes()
    if data[:4] != MAGIC or len(data) < 8:
        raise ValueError(f"{path}: not a request file (no {MAGIC!r} header)")
    (count,) = struct.unpack(">I", data[4:8])
    if not 1 <= count <= MAX_FRAMES or len(data) < 8 + 8 * count:
        raise ValueError(f"{path}: {count} frames (1 to {MAX_FRAMES} allowed) or a cut header")
    sizes = struct.unpack(f">{count}Q", data[8 : 8 + 8 * count])
    at, frames = 8 + 8 * count, []
    if any(n > MAX_FRAME_BYTES for n in sizes) or at + sum(sizes) != len(data):
        raise ValueError(f"{path}: frame lengths {list(sizes)} do not match the file")
    for n in sizes:
        frames.append(data[at : at + n])
        at += n
    wire.decode_header(frames[0], Limits())  # a valid request header, or PacketError
    return frames


def run(
    endpoint: str,
    frames: list[bytes],
    robots: int,
    period_s: float,
    stop: threading.Event,
    sec=None,
    seconds: float | None = None,
    start_at: float | None = None,
    rows: list | None = None,
    drain_s: float = 2.0,
) -> dict:
    """Send ``frames`` as ``robots`` robots (one socket each) every ``period_s`` until
    ``stop`` (or ``seconds`` after the first send); the counts of what was sent and how it was
    answered. Robot i sends first at ``start_at`` + i x period / robots (``time.monotonic``,
    which every process on the machine shares; default: 0.2 s from now), so a run that
    starts its measured robot at a time of its own fixes the phase between them.

    ``rows``: a list that gets one dict per request sent (``t``: seconds after the start,
    ``kind``: ok | late | refused | lost, ``wall_s``, ``compute_s``: the edge's share for
    it); the answers still in flight are waited for up to ``drain_s`` (and their budget)."""
    import zmq

    from vlarun.runtime.transport import Security, dealer_socket

    if robots < 1 or period_s <= 0:
        raise ValueError(f"need robots >= 1 and period_s > 0, got {robots}, {period_s}")
    sec = sec or Security(insecure=True)
    budget = wire.decode_header(frames[0], Limits()).deadline_s
    ctx = zmq.Context()
    socks = [dealer_socket(ctx, endpoint, sec) for _ in range(robots)]
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    counts = {"sent": 0, "unsent": 0, "answered": 0, "late": 0, "refused": 0, "lost": 0}
    start = time.monotonic() + 0.2 if start_at is None else start_at  # connections first
    due = [start + i * period_s / robots for i in range(robots)]
    sent_at: dict[int, float] = {}
    book = _Book(counts, budget, start, rows)
    rid = 0
    end = None if seconds is None else start + seconds
    try:
        while not stop.is_set() and (end is None or time.monotonic() < end):
            i = int(np.argmin(due))
            wait = min(due[i] - time.monotonic(), 0.1)  # and look at ``stop`` meanwhile
            for sock, _ in poller.poll(max(int(wait * 1e3), 0)) if wait > 0 else ():
                _read(sock, sent_at, book)
            if time.monotonic() < due[i]:
                continue
            rid += 1
            try:
                socks[i].send_multipart(wire.renumber(frames, rid), zmq.NOBLOCK, copy=False)
                counts["sent"] += 1
                sent_at[rid] = time.monotonic()
            except zmq.Again:  # no connection yet (IMMEDIATE): a robot that could not send
                counts["unsent"] += 1
            due[i] += period_s
        # The answers still in flight: wait for each until its budget (at most drain_s) is
        # out; one poll would return with the first and miss the ones behind it.
        drain_end = time.monotonic() + min(budget, drain_s)
        while sent_at and (left := drain_end - time.monotonic()) > 0:
            for sock, _ in poller.poll(max(int(left * 1e3), 1)):
                _read(sock, sent_at, book)
        for t in sent_at.values():  # never answered
            book.end(t, "lost")
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    return counts | {"robots": robots, "period_s": period_s}


class _Book:
    """How the requests ended: the counts and, when asked for, one row per request."""

    KINDS = {"ok": "answered", "late": "late", "refused": "refused", "lost": "lost"}

    def __init__(self, counts: dict, budget_s: float, start: float, rows: list | None) -> None:
        self.counts, self.budget_s, self.start, self.rows = counts, budget_s, start, rows

    def end(self, sent: float, kind: str, compute_s: float = 0.0) -> None:
        self.counts[self.KINDS[kind]] += 1
        if self.rows is not None:
            wall = time.monotonic() - sent if kind != "lost" else math.nan
            self.rows.append(
                {"t": sent - self.start, "kind": kind, "wall_s": wall, "compute_s": compute_s}
            )


def _read(sock, sent_at: dict[int, float], book: _Book) -> None:
    import zmq

    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            header = wire.decode_header(frames[0], Limits())
        except wire.PacketError:
            continue
        t = sent_at.pop(header.rid, None)
        if t is None:
            continue
        if header.kind == "error":
            book.end(t, "refused")
            continue
        compute = 0.0
        if book.rows is not None:  # the edge's share of each stage it ran for this request
            with contextlib.suppress(RecordError):
                stages = tuple(header.stage.split("+"))
                compute = sum(x.share_s for x in parse_timings(header.meta.get("timings"), stages))
        book.end(t, "late" if time.monotonic() - t > book.budget_s else "ok", compute)


class OpenLoopLoad:
    """``robots`` background robots sending ``policy``'s whole-policy request to
    ``endpoint`` every ``period_s`` (``budget_s`` each; padded as ``emulator`` says) from a
    process of their own, on the CPUs this process may use; ``counts`` holds what they saw
    once the block ends. ``robots`` = 0 starts nothing."""

    def __init__(
        self,
        policy,
        endpoint: str,
        robots: int,
        period_s: float,
        budget_s: float,
        emulator=None,
        start_at: float | None = None,
    ) -> None:
        self.policy, self.endpoint, self.robots = policy, endpoint, robots
        self.period_s, self.budget_s, self.emulator = period_s, budget_s, emulator
        self.start_at = start_at  # the first send (time.monotonic), as ``run`` takes it
        self.proc: subprocess.Popen | None = None
        self.counts: dict = {}
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def requests(self) -> int:
        return int(self.counts.get("sent", 0))

    def __enter__(self) -> OpenLoopLoad:
        if self.robots <= 0:
            return self
        from vlarun.runtime.testbed import procs

        self._dir = tempfile.TemporaryDirectory()
        path = Path(self._dir.name) / "request.bin"
        frames = encode_request(self.policy, "open the drawer", self.budget_s, self.emulator)
        write_frames(frames, path)
        args = [
            "--edge",
            self.endpoint,
            "--frames",
            str(path),
            "--robots",
            str(self.robots),
            "--period-s",
            str(self.period_s),
            "--insecure",
        ]
        if self.start_at is not None:
            args += ["--start-at", repr(self.start_at)]
        self.proc, _ = procs.spawn_module("vlarun.runtime.testbed.loadgen", args)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        from vlarun.runtime.testbed import procs

        self.proc.send_signal(signal.SIGINT)  # stop sending, report the counts
        try:
            out, _ = self.proc.communicate(timeout=10)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            self.counts = json.loads(lines[-1]) if lines else {}
        except subprocess.TimeoutExpired:
            self.counts = {}
        procs.stop(self.proc)
        if self._dir is not None:
            self._dir.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m vlarun.runtime.testbed.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--edge", required=True, help="the edge's endpoint (tcp://HOST:PORT)")
    ap.add_argument("--frames", required=True, help="a request file (write_frames)")
    ap.add_argument("--robots", type=int, default=4, help="background robots")
    ap.add_argument("--period-s", type=float, default=1.0, help="each robot's request period")
    ap.add_argument("--seconds", type=float, default=None, help="stop after (default: SIGINT)")
    ap.add_argument(
        "--start-at",
        type=float,
        default=None,
        help="first send at this time.monotonic() (default: in 0.2 s)",
    )
    ap.add_argument("--insecure", action="store_true", help="plain TCP (the bench's own edge)")
    a = ap.parse_args(argv)
    if not a.insecure:
        ap.error("the load generator talks to a local benchmark edge only: pass --insecure")
    try:
        frames = read_frames(Path(a.frames))
    except (OSError, ValueError, wire.PacketError) as e:
        ap.error(str(e))
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(json.dumps({"endpoint": a.edge, "robots": a.robots}), flush=True)
    counts = run(a.edge, frames, a.robots, a.period_s, stop, seconds=a.seconds, start_at=a.start_at)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
