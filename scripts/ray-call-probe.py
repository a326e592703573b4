"""What a Ray actor call costs on this machine for the payload sizes of a remote stage: the
reason the scale-out front relays payloads over ZeroMQ and uses Ray only as its control plane.
Times ``ray.get(actor.echo.remote(frames))`` (frames back) and ``actor.small.remote(frames)``
(a short answer: the one-way cost) for a 100-byte header plus 100 B .. 197 kB.

    .venv/bin/python scripts/ray-call-probe.py
"""

from __future__ import annotations

import logging
import time

import ray


@ray.remote(num_cpus=0, resources={"edge": 1}, max_concurrency=16)
class _Echo:
    def echo(self, frames):
        return frames

    def small(self, frames):
        return b"ok"


def main() -> None:
    ray.init(num_cpus=2, resources={"edge": 2}, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 << 20, logging_level=logging.ERROR)  # fmt: skip
    actor = _Echo.remote()
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
        one_way_ms = (time.perf_counter() - t) / n * 1e3
        print(f"{size:>7} B: echo {echo_ms:.2f} ms, one way {one_way_ms:.2f} ms")
    ray.shutdown()


if __name__ == "__main__":
    main()
