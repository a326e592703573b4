"""The floor of a Python ZeroMQ relay hop on this machine (the bound of the scale-out front's
overhead): a DEALER asks an echo ROUTER directly, and through a relay process that does nothing
but forward (ROUTER in, DEALER out, frames passed on as they came), in turn; prints the medians
and the paired median difference. Request 197 kB, reply 131 kB (the vision stage of tiny-ar).

    .venv/bin/python scripts/relay-floor.py [--n 300]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np
import zmq

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="paired round trips")
    n = ap.parse_args().n
    q: mp.Queue = mp.Queue()
    mp.Process(target=_echo, args=(q, False), daemon=True).start()
    direct = q.get()
    mp.Process(target=_echo, args=(q, True), daemon=True).start()
    behind = q.get()
    mp.Process(target=_relay, args=(f"tcp://127.0.0.1:{behind}", q), daemon=True).start()
    relayed = q.get()
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
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
    ra, rb = ra[20:], rb[20:]
    diff = np.array(rb) - np.array(ra)
    print(f"direct {statistics.median(ra) * 1e3:.3f} ms, relayed {statistics.median(rb) * 1e3:.3f}"
          f" ms, paired hop {np.median(diff) * 1e3:+.3f} ms (n={n})")  # fmt: skip


if __name__ == "__main__":
    main()
