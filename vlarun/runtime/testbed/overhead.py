"""Runtime overhead per remote stage, against the raw transfer of the same bytes.

    vlarun:  wall time of a remote segment minus the edge's measured compute
             (= transfer both ways + encode/decode + validation + queueing + thread hops)
    raw:     a bare ZeroMQ DEALER -> ROUTER echo of the same request and reply sizes,
             from an echo process (no vlarun code on either side)
    overhead = median(vlarun) - median(raw)       (issue goal: <= 1 ms on loopback)

Run the echo as a process:  python -m vlarun.runtime.testbed.overhead   (prints its endpoint).
"""

from __future__ import annotations

import json
import statistics
import time

import zmq


def echo_main() -> None:
    """Answer every message with a reply of the size its first frame names (an int)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"endpoint": f"tcp://127.0.0.1:{port}"}), flush=True)
    while True:
        frames = s.recv_multipart(copy=False)
        size = int(frames[1].bytes)
        s.send_multipart([frames[0], b"\0" * size], copy=False)


def raw_round_trips(endpoint: str, sizes: list[int], reply_bytes: int, n: int) -> list[float]:
    """Seconds per round trip of frames of ``sizes`` bytes and a ``reply_bytes`` answer."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.connect(endpoint)
    frames = [str(reply_bytes).encode(), *[b"\0" * k for k in sizes]]
    out = []
    try:
        for i in range(n + 3):
            t0 = time.perf_counter()
            s.send_multipart(frames, copy=False)
            s.recv_multipart()
            if i >= 3:  # the first trips include the connection set-up
                out.append(time.perf_counter() - t0)
    finally:
        s.close(0)
    return out


def measure(edge: str, policy, n: int = 30) -> dict:
    """Remote vision stage on ``edge`` vs raw echo of the same bytes; medians in ms."""
    import torch

    from vlarun.runtime.robot.client import EdgeClient, ping
    from vlarun.runtime.testbed import procs
    from vlarun.runtime.transport import Security
    from vlarun.stages import wire
    from vlarun.stages.packet import Packet

    sec = Security(insecure=True)
    cfg = policy.model.cfg
    ids = policy.text_ids("open the drawer")
    packet = Packet({"images": torch.rand(1, cfg.num_images, 3, cfg.image_size, cfg.image_size)})
    meta = {"batch": 1, "text_tokens": len(ids)}
    ping(edge, sec, count=1, timeout_s=5.0)
    client = EdgeClient(edge, sec)
    time.sleep(0.2)
    runs = []
    try:
        for i in range(n + 3):
            rep = client.run(("vision",), packet, ("visual",), 5.0, 5.0, meta)
            if i >= 3:
                runs.append((rep.wall_s - sum(t.compute_s for t in rep.timings), rep))
    finally:
        client.close()
    sizes = [
        len(f)
        for f in wire.encode(
            wire.Message("data", rid=1, stage="vision", deadline_s=5.0, meta=meta, packet=packet)
        )
    ]
    reply = runs[-1][1].recv_bytes
    proc, echo = procs.spawn_module("vlarun.runtime.testbed.overhead")
    try:
        raw = raw_round_trips(echo, sizes, reply, n)
    finally:
        procs.stop(proc)
    vlarun_ms = statistics.median(r[0] for r in runs) * 1e3
    raw_ms = statistics.median(raw) * 1e3
    return {
        "stage": "vision",
        "request_bytes": sum(sizes),
        "reply_bytes": reply,
        "remote_minus_compute_ms": vlarun_ms,
        "raw_round_trip_ms": raw_ms,
        "overhead_ms": vlarun_ms - raw_ms,
        "n": n,
    }


if __name__ == "__main__":
    echo_main()
