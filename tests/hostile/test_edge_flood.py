"""A pipelining flood from many identities (issue 45, 9): 8 DEALER sockets each send a valid
tiny-ar request (~200 KB) every 2 ms without reading a reply. ZeroMQ's receive queue held
1000 messages per robot, so the edge buffered gigabytes before ``--max-queued-per-robot``
saw a single request (16 robots: 347 -> 2410 MB). With 16 messages per robot it stops
reading a flooding robot's connection and TCP pushes back: the edge's memory stays bounded
and an honest robot is still answered."""

from __future__ import annotations

import threading
import time

import zmq

from vlarun.bench.hostile import _edge_packet, rss
from vlarun.runtime.robot.client import EdgeClient, ping, request_frames
from vlarun.runtime.testbed import procs
from vlarun.runtime.transport import Security

INSECURE = Security(insecure=True)


def test_a_pipelining_flood_does_not_grow_the_edge():
    edge, endpoint = procs.start_edge(extra=["--policy", "tiny-ar", "--threads", "1"])
    try:
        ping(endpoint, INSECURE, count=1, timeout_s=30.0)
        before = rss(edge.pid)
        packet, meta = _edge_packet("tiny-ar")
        frames = request_frames(1, ("vision", "prefill", "decode"), packet, ("actions",), 5.0, meta)
        assert sum(map(len, frames)) > 150_000  # each message is ~200 KB
        stop, sent = threading.Event(), [0] * 8
        ctx = zmq.Context()

        def flood(i: int) -> None:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            try:
                while not stop.is_set():
                    try:
                        s.send_multipart(frames, zmq.NOBLOCK)
                        sent[i] += 1
                    except zmq.Again:  # pushed back: what the bound is for
                        pass
                    time.sleep(0.002)
            finally:
                s.close(0)

        threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(4.0)
        peak = rss(edge.pid)
        stop.set()
        for t in threads:
            t.join(10)
        ctx.term()
        grown_mb = (peak - before) / 2**20
        # 8 robots x 16 messages x 0.2 MB = 26 MB at most in ZeroMQ's queues, plus the edge's
        # own queue of at most 16 per robot (refused beyond); at the old 1000 per robot the
        # flood had queued ~1.6 GB within these 4 s.
        assert grown_mb < 250, f"the edge grew by {grown_mb:.0f} MB ({sum(sent)} sent)"
        client = EdgeClient(endpoint, INSECURE)
        try:
            deadline = time.monotonic() + 60
            while True:  # the flood's backlog drains; then an honest robot is served
                try:
                    client.run(
                        ("vision", "prefill", "decode"), packet, ("actions",), 5.0, 6.0, meta
                    )
                    break
                except Exception:  # noqa: BLE001 - busy while the backlog drains
                    assert time.monotonic() < deadline, "an honest robot was never served"
        finally:
            client.close()
    finally:
        procs.stop(edge)
