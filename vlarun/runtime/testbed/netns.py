"""A real shaped link in the kernel: a network namespace for the edge, a veth pair to it, and
``tc tbf`` (token bucket) on both ends for bandwidth. Needs root, ``ip`` and ``tc``;
``available()`` says why not otherwise. Delay and jitter are not here: this kernel has no
``netem``, so they come from the user-space relay (relay.py) placed in front of the edge.

    with VethLink(mbps=200) as link:          # robot side 10.x.y.1, edge side 10.x.y.2
        proc = link.popen([...serve-edge --host link.edge_ip ...])
        link.set_rate(50)                     # the bandwidth drop
"""

from __future__ import annotations

import os
import shutil
import subprocess


def available() -> str | None:
    """None if namespaces and tc can be used here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


def _run(*args: str) -> None:
    r = subprocess.run(args, capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")


class VethLink:
    """Names and the /30 subnet come from the process id, so parallel sessions do not clash."""

    def __init__(self, mbps: float, burst_kbit: int = 64, tag: int | None = None) -> None:
        tag = os.getpid() % 60000 if tag is None else tag
        self.ns, self.robot_if, self.edge_if = f"vlr{tag}", f"vlr{tag}a", f"vlr{tag}b"
        base = f"10.{200 + tag // 16384}.{(tag // 64) % 256}.{(tag % 64) * 4}"
        prefix = base.rsplit(".", 1)[0]
        last = int(base.rsplit(".", 1)[1])
        self.robot_ip, self.edge_ip = f"{prefix}.{last + 1}", f"{prefix}.{last + 2}"
        self.mbps, self.burst_kbit = mbps, burst_kbit

    def __enter__(self) -> VethLink:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        try:
            _run("ip", "netns", "add", self.ns)
            _run("ip", "link", "add", self.robot_if, "type", "veth", "peer", "name", self.edge_if)
            _run("ip", "link", "set", self.edge_if, "netns", self.ns)
            _run("ip", "addr", "add", f"{self.robot_ip}/30", "dev", self.robot_if)
            _run("ip", "link", "set", self.robot_if, "up")
            self._in_ns("ip", "addr", "add", f"{self.edge_ip}/30", "dev", self.edge_if)
            self._in_ns("ip", "link", "set", self.edge_if, "up")
            self._in_ns("ip", "link", "set", "lo", "up")
            self._shape("add", self.mbps)
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "link", "del", self.robot_if], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=10)

    def _in_ns(self, *args: str) -> None:
        _run("ip", "netns", "exec", self.ns, *args)

    def _shape(self, verb: str, mbps: float) -> None:
        """tbf on each side's egress: robot -> edge on the robot's end, edge -> robot inside."""
        spec = ["tbf", "rate", f"{mbps}mbit", "burst", f"{self.burst_kbit}kbit", "latency", "100ms"]
        _run("tc", "qdisc", verb, "dev", self.robot_if, "root", *spec)
        self._in_ns("tc", "qdisc", verb, "dev", self.edge_if, "root", *spec)

    def set_rate(self, mbps: float) -> None:
        """Change the bandwidth both ways (e.g. the 200 -> 50 Mbit/s drop)."""
        self._shape("change", mbps)
        self.mbps = mbps

    def popen(self, args: list[str], **kw) -> subprocess.Popen:
        """Start a process inside the edge's namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *args], **kw)
