"""A user-space TCP relay that shapes a link: bandwidth, one-way delay and jitter, changing
over time. It stands between robot and edge where ``tc netem`` is not available (this kernel
has no netem) and where tests run without root (``tc tbf`` in a network namespace needs it).

Each direction is a serial link: a chunk read at time t leaves the wire at
    free = max(t, free) + bytes / bandwidth,   delivered at free + delay (+ jitter),
and chunks are delivered in order (TCP). A schedule changes the bandwidth at given times,
e.g. "10:50" = 50 Mbit/s from 10 s after start (the bandwidth drop of the benchmark);
SIGUSR1 restarts that clock.

Run as a process:  python -m vlarun.runtime.testbed.relay --upstream HOST:PORT --mbps 200 ...
(prints {"endpoint": "tcp://127.0.0.1:PORT"} on its first line).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field

CHUNK = 16 * 1024  # bytes read at once: small enough that shaping stays smooth


@dataclass
class LinkShape:
    """Bandwidth (Mbit/s), one-way delay and uniform jitter (ms), and a schedule of
    (seconds after start, Mbit/s) bandwidth changes."""

    mbps: float = 1000.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    schedule: list[tuple[float, float]] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)

    def bytes_per_s(self, now: float) -> float:
        mbps = self.mbps
        for at, value in sorted(self.schedule):
            if now - self.start >= at:
                mbps = value
        return mbps * 1e6 / 8

    def restart(self) -> None:
        """Start the schedule's clock now (SIGUSR1): a run can align the schedule with its own
        start, whatever the set-up before it took."""
        self.start = time.monotonic()

    def delay_s(self, rng: random.Random) -> float:
        return (self.delay_ms + rng.uniform(0, self.jitter_ms)) * 1e-3


async def _pump(reader, writer, shape: LinkShape, rng: random.Random) -> None:
    queue: asyncio.Queue = asyncio.Queue()
    free = time.monotonic()
    last = 0.0

    async def deliver() -> None:
        while True:
            at, data = await queue.get()
            if data is None:
                break
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():  # pass a half-close on; the peer may still answer
            writer.write_eof()

    task = asyncio.create_task(deliver())
    try:
        while data := await reader.read(CHUNK):
            now = time.monotonic()
            free = max(now, free) + len(data) / shape.bytes_per_s(now)
            last = max(last, free + shape.delay_s(rng))  # in order, as TCP delivers
            queue.put_nowait((last, data))
    except (ConnectionError, OSError):
        pass
    queue.put_nowait((0.0, None))
    with contextlib.suppress(ConnectionError, OSError):
        await task


async def serve(upstream: tuple[str, int], shape: LinkShape, port: int = 0, ready=None) -> None:
    rng = random.Random(0)

    async def handle(r_client, w_client) -> None:
        try:
            r_up, w_up = await asyncio.open_connection(*upstream)
        except OSError:
            w_client.close()
            return
        await asyncio.gather(_pump(r_client, w_up, shape, rng), _pump(r_up, w_client, shape, rng))
        for w in (w_up, w_client):
            w.close()

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, shape.restart)
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    if ready is not None:
        ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def parse_schedule(text: str) -> list[tuple[float, float]]:
    """'10:50,20:200' -> [(10.0, 50.0), (20.0, 200.0)]."""
    out = []
    for part in filter(None, text.split(",")):
        at, mbps = part.split(":")
        out.append((float(at), float(mbps)))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="HOST:PORT or tcp://HOST:PORT of the edge")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mbps", type=float, default=1000.0)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--schedule", default="", help="bandwidth changes, e.g. '10:50'")
    a = p.parse_args(argv)
    host, port = a.upstream.removeprefix("tcp://").rsplit(":", 1)
    shape = LinkShape(a.mbps, a.delay_ms, a.jitter_ms, parse_schedule(a.schedule))

    def ready(bound: int) -> None:
        print(json.dumps({"endpoint": f"tcp://127.0.0.1:{bound}"}), flush=True)

    try:
        asyncio.run(serve((host, int(port)), shape, a.port, ready))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
