"""`vlarun bench serve`: openpi-protocol serving overhead and concurrency, with the real client.

The server runs in this process (its own event-loop thread and model thread), the clients are
``openpi_client.WebsocketClientPolicy`` instances in threads, over loopback. Reported:

  * server overhead per request: the server's wall time for a request (frame received ->
    reply sent) minus the model's own time (``policy.predict``), i.e. decoding, layout mapping,
    encoding and the thread hand-off; and the client's round trip minus the model time;
  * concurrency: requests/s and per-request latency with 1 client and with N clients at once.
    One model thread serves everyone, so N clients share it: the check is that the server adds
    queueing only, not blocking (the event loop stays free while a request computes).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np

from vlarun.config import POLICY_FLAGS_RETIRED, POLICY_HELP, opt


@dataclass(frozen=True)
class BenchServeOptions:
    """openpi-protocol serving: per-request server overhead and N clients at once."""

    policy: str = opt("tiny-ar", "policy to serve: " + POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    requests: int = opt(40, "requests per client")
    clients: int = opt(4, "clients at once in the concurrency run")
    threads: int = opt(1, "torch threads for the model")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.requests < 2 or self.clients < 1:
            raise ValueError("--requests must be >= 2 and --clients >= 1")


def _client_run(port: int, key: str, frame: dict, n: int, out: list) -> None:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    client = WebsocketClientPolicy("127.0.0.1", port, api_key=key)
    for _ in range(n):
        t0 = time.perf_counter()
        reply = client.infer(frame)
        rtt = (time.perf_counter() - t0) * 1e3
        out.append((rtt, reply["policy_timing"]["infer_ms"], reply["server_timing"]["infer_ms"]))


def run(o: BenchServeOptions) -> dict:
    import torch

    try:
        import openpi_client  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "bench serve needs openpi-client: pip install --no-deps "
            "openpi-client websockets dm-tree"
        ) from None
    from vlarun.policy import Policy
    from vlarun.runtime.openpi import OpenpiPolicyServer, get_layout

    torch.set_num_threads(o.threads)
    policy = Policy.load(o.policy)
    key = "bench-key"
    server = OpenpiPolicyServer(policy, get_layout("metaworld"), port=0, api_key=key)
    stop = server.start_in_thread()
    cfg = policy.model.cfg
    rng = np.random.default_rng(0)
    frame = {
        "image": rng.integers(0, 255, (cfg.image_size,) * 2 + (3,), dtype=np.uint8),
        "state": np.zeros(4, np.float32),
        "prompt": "open the drawer",
    }
    if cfg.num_images > 1:
        frame["second_image"] = frame["image"].copy()
    try:
        single: list = []
        _client_run(server.port, key, frame, 2, [])  # warm-up: allocations, first connection
        server.server_ms.clear()
        t0 = time.perf_counter()
        _client_run(server.port, key, frame, o.requests, single)
        single_s = time.perf_counter() - t0
        overhead = list(server.server_ms)
        many: list = []
        threads = [
            threading.Thread(target=_client_run, args=(server.port, key, frame, o.requests, many))
            for _ in range(o.clients)
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        many_s = time.perf_counter() - t0
    finally:
        stop()
    med = statistics.median
    model_ms = [m for _, m, _ in single]
    rtt_over = [r - m for r, m, _ in single]
    return {
        "benchmark": "serve-policy (openpi protocol, real openpi-client, loopback)",
        "policy": cfg.name,
        "requests_per_client": o.requests,
        "model_ms_median": med(model_ms),
        "server_overhead_ms_median": med(overhead),
        "server_overhead_ms_p90": float(np.percentile(overhead, 90)),
        "client_rtt_minus_model_ms_median": med(rtt_over),
        "one_client": {
            "requests_per_s": len(single) / single_s,
            "latency_ms_median": med(r for r, _, _ in single),
        },
        "concurrent": {
            "clients": o.clients,
            "requests": len(many),
            "requests_per_s": len(many) / many_s,
            "latency_ms_median": med(r for r, _, _ in many),
            "latency_ms_p99": float(np.percentile([r for r, _, _ in many], 99)),
        },
        "threads": o.threads,
    }


def show(r: dict) -> None:
    c = r["concurrent"]
    print(f"{r['benchmark']}: {r['policy']}, {r['requests_per_client']} requests per client")
    over, p90 = r["server_overhead_ms_median"], r["server_overhead_ms_p90"]
    print(
        f"  model {r['model_ms_median']:.2f} ms; server overhead median {over:.3f} ms "
        f"(p90 {p90:.3f}); client round trip minus model "
        f"{r['client_rtt_minus_model_ms_median']:.3f} ms"
    )
    print(
        f"  1 client: {r['one_client']['requests_per_s']:.1f} req/s, median "
        f"{r['one_client']['latency_ms_median']:.1f} ms"
    )
    print(
        f"  {c['clients']} clients: {c['requests_per_s']:.1f} req/s, median "
        f"{c['latency_ms_median']:.1f} ms, p99 {c['latency_ms_p99']:.1f} ms"
    )


OPTIONS = {"bench-serve": BenchServeOptions}
RUN = {"bench-serve": run}
SHOW = {"bench-serve": show}
