"""Network conditions: the user-space relay (bandwidth, delay, a scheduled drop) and the
kernel path (namespace + veth + tc tbf, root only)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from vlarun.runtime.testbed import netns, procs

SINK = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 0)); s.listen(4); s.settimeout(30)
    print(s.getsockname()[1], flush=True)
    for _ in range(int(sys.argv[2])):
        c, _ = s.accept(); c.settimeout(30)
        want, n = int.from_bytes(c.recv(4, socket.MSG_WAITALL), "big"), 0
        while n < want:
            n += len(c.recv(1 << 16))
        c.sendall(b"k"); c.close()
    """
)


def _sink(host: str, conns: int, nbytes: int, prefix: list[str] | None = None):
    proc = subprocess.Popen(
        [*(prefix or []), sys.executable, "-c", SINK, host, str(conns), str(nbytes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, int(proc.stdout.readline())


def _send_s(host: str, port: int, nbytes: int) -> float:
    """Seconds to push ``nbytes`` and get the sink's one-byte acknowledgement."""
    t0 = time.perf_counter()
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(nbytes.to_bytes(4, "big") + b"\0" * nbytes)
        assert s.recv(1) == b"k"
    return time.perf_counter() - t0


def test_relay_shapes_bandwidth_delay_and_drop():
    nbytes = 250_000  # 2 Mbit
    sink, port = _sink("127.0.0.1", 3, nbytes)
    relay, via = procs.start_relay(f"127.0.0.1:{port}", mbps=20, delay_ms=30, schedule="1.5:5")
    try:
        host, rport = via.removeprefix("tcp://").rsplit(":", 1)
        fast = _send_s(host, int(rport), 1000)
        assert 0.06 <= fast < 1.0  # one round trip of 2 x 30 ms; no bandwidth to speak of
        before = _send_s(host, int(rport), nbytes)
        assert 0.1 <= before < 1.4  # 2 Mbit at 20 Mbit/s = 0.1 s, plus delays
        time.sleep(max(1.6 - before - fast, 0))
        after = _send_s(host, int(rport), nbytes)
        assert after >= 0.4  # 2 Mbit at 5 Mbit/s
    finally:
        procs.stop(relay)
        sink.kill()
        sink.wait(5)


@pytest.mark.skipif(netns.available() is not None, reason=f"kernel shaping: {netns.available()}")
def test_veth_tbf_link_and_rate_change():
    nbytes = 1_250_000  # 10 Mbit
    with netns.VethLink(mbps=20) as link:
        sink = link.popen(
            [sys.executable, "-c", SINK, link.edge_ip, "2", str(nbytes)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            port = int(sink.stdout.readline())
            slow = _send_s(link.edge_ip, port, nbytes)
            link.set_rate(200)
            fast = _send_s(link.edge_ip, port, nbytes)
        finally:
            sink.kill()
            sink.wait(5)
    assert slow >= 0.4  # 10 Mbit at 20 Mbit/s = 0.5 s
    assert fast < slow / 3


def test_threads_are_not_left_behind():
    assert not [t for t in threading.enumerate() if t.name in ("edge-io", "edge-worker")]


def test_idle_probes_come_often_but_take_a_bounded_share_of_the_link():
    import zmq

    from vlarun.runtime.robot.monitor import LinkMonitor
    from vlarun.runtime.transport import Security

    mon = LinkMonitor("tcp://127.0.0.1:9", Security(insecure=True), zmq.Context.instance())
    mon.last_remote = 0.0
    assert mon.probe_due(10.0)  # idle and never probed
    mon._last_probe, mon._probe_took = 10.0, 0.004  # a fast link: every probe_every_s
    assert not mon.probe_due(10.2) and mon.probe_due(10.26)
    mon._probe_took = 0.4  # 96 KiB took 0.4 s (2 Mbit/s): at most half of the link
    assert not mon.probe_due(10.79) and mon.probe_due(10.81)
    mon.last_remote = 10.8  # the agent's own requests measure the link: no probe
    assert not mon.probe_due(10.9)


def test_the_monitor_feeds_its_evidence_in_the_order_it_came():
    """Light probes that timed out while the link was slow (caps), then the full probe after
    the restore: the estimate is the restored link's. Fed out of order, the older caps held
    it down after the sample that beat them (a restore seen one probe later)."""
    import zmq

    from vlarun.runtime.robot.monitor import LinkMonitor
    from vlarun.runtime.transport import Security
    from vlarun.sched.link import Link

    mon = LinkMonitor("tcp://127.0.0.1:9", Security(insecure=True), zmq.Context.instance())
    link = Link(200.0, 0.0)
    mon.evidence += [("cap", 0.6, 0.0), ("cap", 0.6, 0.0), ("transfer", 96 * 1024, 0.0125)]
    mon.feed(link)
    assert link.bandwidth_mbps > 50.0
    mon.evidence += [("transfer", 96 * 1024, 0.0125), ("bound", 96 * 1024, 0.4)]
    mon.feed(link)  # a timeout after the sample: the link is slow again
    assert link.bandwidth_mbps < 2.5
