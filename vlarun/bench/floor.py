"""`vlarun bench floor`: the floor under the scale-out front's overhead on this machine.

* relay: a DEALER asks an echo ROUTER directly, and through a relay process that does nothing
  but forward (ROUTER in, DEALER out, frames passed on as they came), in turn: the medians and
  the paired median difference, the cost of one Python ZeroMQ relay hop. Request 197 kB,
  reply 131 kB (the vision stage of tiny-ar).
* ray: what a Ray actor call costs for the payload sizes of a remote stage (a 100-byte header
  plus 100 B .. 197 kB), frames back (echo) and a short answer (one way): the reason the
  scale-out front relays payloads over ZeroMQ and uses Ray only as its control plane (needs
  the scale extra).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass

import numpy as np
import zmq

from vlarun.config import opt

PARTS = ("relay", "ray")


@dataclass(frozen=True)
class BenchFloorOptions:
    """The floor of one ZeroMQ relay hop, and of a Ray actor call, on this machine."""

    parts: tuple[str, ...] = opt(("relay",), "relay (ZeroMQ hop) and/or ray (actor call)")
    n: int = opt(300, "paired round trips of the relay part")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.parts) - set(PARTS))
        if unknown:
            raise ValueError(f"unknown parts {unknown}; valid: {', '.join(PARTS)}")
        if self.n < 1:
            raise ValueError("--n must be >= 1")


REPLY = b"\0" * 131072


def _echo(port_q, routed: bool) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    port_q.put(s.bind_to_random_port("tcp://127.0.0.1"))
    while True:
        f = s.recv_multipart(copy=False)
        head = [f[0], f[1]] if routed else [f[0]]  # behind the relay: its identity, then ours
        s.send_multipart([*head, b"h" * 100, REPLY], copy=False)


def _relay(upstream: str, port_q) -> None:
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    port_q.put(front.bind_to_random_port("tcp://127.0.0.1"))
    back = ctx.socket(zmq.DEALER)
    back.connect(upstream)
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    while True:
        events = dict(poller.poll(20))
        if front in events:
            f = front.recv_multipart(copy=False)
            back.send_multipart([f[0].bytes, *f[1:]], copy=False)
        if back in events:
            f = back.recv_multipart(copy=False)
            front.send_multipart([f[0].bytes, *f[1:]], copy=False)


def relay_floor(n: int) -> dict:
    """Direct and relayed round trips, taking turns; medians in ms."""
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_echo, args=(q, False), daemon=True)]
    procs[-1].start()
    direct = q.get()
    procs.append(mp.Process(target=_echo, args=(q, True), daemon=True))
    procs[-1].start()
    behind = q.get()
    procs.append(mp.Process(target=_relay, args=(f"tcp://127.0.0.1:{behind}", q), daemon=True))
    procs[-1].start()
    relayed = q.get()
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        a.connect(f"tcp://127.0.0.1:{direct}")
        b.connect(f"tcp://127.0.0.1:{relayed}")
        time.sleep(0.5)
        payload = [b"h" * 120, b"\0" * 196700]
        ra, rb = [], []
        for _ in range(n + 20):
            for sock, out in ((a, ra), (b, rb)):
                t = time.perf_counter()
                sock.send_multipart(payload)
                sock.recv_multipart()
                out.append(time.perf_counter() - t)
    finally:
        a.close(0)
        b.close(0)
        for p in procs:
            p.terminate()
            p.join(5)
    ra, rb = ra[20:], rb[20:]
    diff = np.array(rb) - np.array(ra)
    return {
        "direct_ms": statistics.median(ra) * 1e3,
        "relayed_ms": statistics.median(rb) * 1e3,
        "paired_hop_ms": float(np.median(diff)) * 1e3,
        "n": n,
    }


def ray_floor() -> list[dict]:
    """Echo and one-way Ray actor call times per payload size, ms."""
    import logging

    import ray

    @ray.remote(num_cpus=0, resources={"edge": 1}, max_concurrency=16)
    class Echo:
        def echo(self, frames):
            return frames

        def small(self, frames):
            return b"ok"

    ray.init(
        num_cpus=2,
        resources={"edge": 2},
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=100 << 20,
        logging_level=logging.ERROR,
    )
    rows = []
    try:
        actor = Echo.remote()
        for size in (100, 20_000, 90_000, 197_000):
            frames = [b"h" * 100, b"x" * size]
            for _ in range(20):
                ray.get(actor.echo.remote(frames))
            n, t = 200, time.perf_counter()
            for _ in range(n):
                ray.get(actor.echo.remote(frames))
            echo_ms = (time.perf_counter() - t) / n * 1e3
            t = time.perf_counter()
            for _ in range(n):
                ray.get(actor.small.remote(frames))
            rows.append(
                {
                    "bytes": size,
                    "echo_ms": echo_ms,
                    "one_way_ms": (time.perf_counter() - t) / n * 1e3,
                }
            )
    finally:
        ray.shutdown()
    return rows


def run(o: BenchFloorOptions) -> dict:
    return {
        "relay": relay_floor(o.n) if "relay" in o.parts else None,
        "ray": ray_floor() if "ray" in o.parts else None,
    }


def show(r: dict) -> None:
    if r["relay"] is not None:
        x = r["relay"]
        print(
            f"direct {x['direct_ms']:.3f} ms, relayed {x['relayed_ms']:.3f} ms, paired hop "
            f"{x['paired_hop_ms']:+.3f} ms (n={x['n']})"
        )
    for x in r["ray"] or []:
        print(
            f"{x['bytes']:>7} B: Ray echo {x['echo_ms']:.2f} ms, one way {x['one_way_ms']:.2f} ms"
        )


OPTIONS = {"bench-floor": BenchFloorOptions}
RUN = {"bench-floor": run}
SHOW = {"bench-floor": show}
