"""Edge servers and link relays as separate processes (benchmarks, tests, demos).

Each child prints one JSON line with its endpoint first; ``start_*`` waits for it (with a
timeout, so a child that fails to start is reported with its stderr instead of hanging), and
``stop`` ends exactly that child: SIGTERM, then SIGKILL if it lingers.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _spawn(
    args: list[str], timeout_s: float, cpus: set[int] | None = None, stdin: bool = False
) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # stderr goes to a file, not a pipe: a pipe nobody drains would block a chatty child.
    err_file = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the child
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None  # before it runs anything
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=err_file,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        env=env,
        text=True,
        preexec_fn=pin,
    )
    proc.err_file = err_file  # closed by stop()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()
            if line.startswith("{"):
                sel.close()
                return proc, json.loads(line)["endpoint"]
        if proc.poll() is not None:
            break
    sel.close()
    stop(proc, close=False)
    err_file.seek(0)
    err = err_file.read()
    err_file.close()
    raise RuntimeError(f"{' '.join(args[:4])} did not start: {err.strip()[-500:]}")


def start_edge(
    port: int = 0,
    extra: list[str] | None = None,
    timeout_s: float = 60.0,
    cpus: set[int] | None = None,
    keys: str | Path | None = None,
):
    """`vlarun serve-edge` on loopback; (process, endpoint). ``cpus``: pinned there.
    ``keys``: a folder from `local_keys`, and the edge speaks CurveZMQ and admits only the
    robot key written there; without it, plain TCP (`--insecure`: tests and benchmarks)."""
    args = ["-m", "vlarun.cli", "serve-edge", "--port", str(port), "--json"]
    if keys is None:
        args.append("--insecure")
    else:
        keys = Path(keys)
        args += ["--keys", str(keys / "edge.key_secret"), "--authorized-keys", str(keys / "robots")]
    return _spawn(args + (extra or []), timeout_s, cpus)


def local_keys(directory: str | Path):
    """Fresh key pairs for an edge started here and the one robot it serves, in ``directory``
    (0700; the caller removes it): even on loopback another local user could otherwise reach
    the port. Returns the robot's `Security` for that edge."""
    from vlarun.runtime.transport import Security, generate_keys, load_keys

    directory = Path(directory)
    generate_keys(directory, "edge")
    robot = generate_keys(directory, "robot")
    (directory / "robots").mkdir(mode=0o700)
    (directory / "robots" / "robot.key").write_text(Path(robot["public"]).read_text())
    return Security(
        own=load_keys(robot["secret"]), server_public=load_keys(directory / "edge.key").public
    )


def start_relay(
    upstream: str,
    mbps: float,
    delay_ms: float = 0.0,
    schedule: str = "",
    timeout_s: float = 20.0,
    cpus: set[int] | None = None,
):
    """A shaping relay in front of ``upstream``; (process, endpoint). ``cpus``: pinned there."""
    args = [
        "-m",
        "vlarun.runtime.testbed.relay",
        "--upstream",
        upstream,
        "--mbps",
        str(mbps),
        "--delay-ms",
        str(delay_ms),
        "--schedule",
        schedule,
    ]
    return _spawn(args, timeout_s, cpus)


def spawn_module(
    module: str,
    args: list[str] | None = None,
    timeout_s: float = 20.0,
    cpus: set[int] | None = None,
    stdin: bool = False,
):
    """``python -m module args`` that prints its endpoint first; (process, endpoint).
    ``cpus``: the CPUs it may run on (pinned before it starts); ``stdin``: a pipe to it
    (``proc.stdin``, text), else it reads nothing."""
    return _spawn(["-m", module, *(args or [])], timeout_s, cpus, stdin)


def stderr_of(proc: subprocess.Popen) -> str:
    """What a child started here wrote to stderr so far (after ``stop(proc, close=False)``)."""
    err_file = getattr(proc, "err_file", None)
    if err_file is None or err_file.closed:
        return ""
    err_file.seek(0)
    return err_file.read()


def run_queue_wait_s(pid: int) -> float | None:
    """Seconds the threads of process ``pid`` have waited on a run queue, runnable but not
    running (the second field of Linux ``/proc/PID/task/*/schedstat``); None where unreadable.
    Two readings' difference over a run says whether the processes sharing a core got in each
    other's way (a pinned benchmark's check that its timings are its own)."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between the listing and the read
    return total / 1e9


def status_kb(pid: int | str, field: str) -> int | None:
    """One memory field of Linux ``/proc/PID/status`` (``VmRSS``, ``VmHWM``, ...), in kB;
    ``pid`` may be ``"self"``. None where the process is gone or the field is absent (not
    Linux). The one reader: a process's own peak must be ``VmHWM``, never ``ru_maxrss``, which
    Linux carries across exec from the parent (a child of a large process reports its size)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_mb(proc: subprocess.Popen) -> float | None:
    """A live process's peak resident memory so far (Linux ``VmHWM``), MB; None elsewhere."""
    kb = status_kb(proc.pid, "VmHWM")
    return kb / 1024 if kb is not None else None


def stop(
    proc: subprocess.Popen, kill: bool = False, timeout_s: float = 5.0, close: bool = True
) -> None:
    if proc.poll() is None:
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    streams = (proc.stdin, proc.stdout, proc.stderr)
    for stream in (*streams, getattr(proc, "err_file", None) if close else None):
        if stream is not None:
            stream.close()
