"""A process's descendants and the TCP ports they listen on, read from Linux's /proc (no
third-party dependency). Used to check that a local Ray cluster listens on loopback only and
that nothing of it is left after the front stops; elsewhere than Linux both return nothing.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def is_loopback(host: str) -> bool:
    """``host`` names this machine's loopback interface: 127.0.0.0/8, ::1 (IPv4-mapped too),
    or localhost. An interface name or a wildcard (0.0.0.0, ::, *) is not."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name} (pid {self.pid}) on {host}:{self.port}"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(name, parent pid, start time in clock ticks) of ``pid``, or None when it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    name, rest = raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()
    return name, int(rest[1]), int(rest[19])


def children() -> dict[int, list[tuple[int, int]]]:
    """Every live process by its parent: parent pid -> [(pid, start time)] (one scan)."""
    out: dict[int, list[tuple[int, int]]] = {}
    if not PROC.is_dir():
        return out
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            out.setdefault(st[1], []).append((int(entry.name), st[2]))
    return out


def descendants(*roots: int, tree: dict[int, list[tuple[int, int]]] | None = None) -> dict:
    """Every live process below ``roots`` (children, their children, ...): pid -> start time
    (so a pid reused later is not mistaken for one of them)."""
    tree = children() if tree is None else tree
    out: dict[int, int] = {}
    todo = [c for r in roots for c in tree.get(r, [])]
    while todo and len(out) < 100_000:
        pid, start = todo.pop()
        if pid not in out:
            out[pid] = start
            todo.extend(tree.get(pid, []))
    return out


def start_time(pid: int) -> int | None:
    """``pid``'s start time (clock ticks after boot), None when it is gone."""
    st = _stat(pid)
    return None if st is None else st[2]


def alive(procs: dict[int, int]) -> list[int]:
    """The pids of ``procs`` (pid -> start time, from ``descendants``) still running (zombies
    count as gone: they hold no socket and no memory)."""
    out = []
    for pid, start in procs.items():
        st = _stat(pid)
        if st is None or st[2] != start:
            continue
        try:
            state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def cmdline(pid: int) -> str:
    """``pid``'s command line, arguments joined by spaces ("" when it is gone)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _addr(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    # IPv6: four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)


def listeners(pids) -> list[Listener]:
    """The TCP sockets in LISTEN state that processes ``pids`` hold (IPv4 and IPv6)."""
    owner: dict[int, int] = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            owner.setdefault(inode, pid)
    out: list[Listener] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != _LISTEN or int(f[9]) not in owner:
                continue
            pid = owner[int(f[9])]
            host, port = _addr(f[1])
            st = _stat(pid)
            out.append(Listener(pid, st[0] if st else "?", host, port))
    return out
