"""Local bad inputs for `vlarun bench hostile` (issue 64, 3): files a user or a script may hand
vlarun's own commands, each run as a fresh `vlarun` process that must refuse it in one line,
exit 2, before allocating what the file claims.

Per input it reports the exit code, how many lines the process wrote to stderr (and the first),
whether a traceback appeared, its wall time and its peak RSS: ``VmHWM`` of the process's own
address space, written by the process at exit (``ru_maxrss`` will not do: Linux carries the
high-water mark across exec, so a child of a 1.4 GB test runner reported 1.4 GB), and sampled
every 20 ms as well in case it never reaches its exit. The goal (issue 64): one line, exit 2,
peak RSS < 500 MB, for:

  * ``npy-liar``: a 228-byte .npy whose header claims 100000 x 100000 x 3 uint8 (27.9 GiB);
  * ``png-huge`` / ``png-bomb``: PNG headers claiming 12000 x 12000 and 20000 x 20000 pixels
    (a few hundred bytes each; PIL calls the second a decompression bomb);
  * ``st-truncated`` / ``st-flipped`` / ``st-header-2^40``: a shipped checkpoint's
    safetensors file cut in half, with two header bytes flipped, or a header length of 2^40;
  * ``config-deep``: a checkpoint whose config.json asks for 100,000 LM layers;
  * ``episodes-huge``: `vlarun eval --episodes 99999999999999999999`.

The inputs are crafted in a temporary directory; nothing here touches the network.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from vlarun.runtime.testbed import procs

LOCAL_ATTACKS = (
    "npy-liar",
    "png-huge",
    "png-bomb",
    "st-truncated",
    "st-flipped",
    "st-header-2^40",
    "config-deep",
    "episodes-huge",
)
RSS_GOAL_MB = 500.0
TIMEOUT_S = 120.0


def _npy_liar(path: Path) -> Path:
    """A .npy whose header claims 100000 x 100000 x 3 uint8 over 100 bytes of body."""
    header = "{'descr': '|u1', 'fortran_order': False, 'shape': (100000, 100000, 3), }"
    header += " " * (64 - (10 + len(header) + 1) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    with path.open("ab") as f:
        f.write(b"\x00" * 100)
    return path


def _png_header(path: Path, side: int) -> Path:
    """A PNG whose header claims ``side`` x ``side`` grey pixels, with one row of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * (side + 1)))
        + chunk(b"IEND", b"")
    )
    return path


def _frame(path: Path) -> Path:
    import numpy as np

    np.save(path, np.zeros((64, 64, 3), np.uint8))
    return path


def _damaged(root: Path, policy_dir: Path, damage: Callable[[bytes], bytes]) -> Path:
    d = root / "ckpt"
    shutil.copytree(policy_dir, d)
    weights = d / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    return d


def _deep(root: Path, policy_dir: Path) -> Path:
    d = root / "ckpt"
    shutil.copytree(policy_dir, d)
    config = json.loads((d / "config.json").read_text())
    config["vla"]["llm"]["num_layers"] = 100000
    (d / "config.json").write_text(json.dumps(config))
    return d


def argv_for(name: str, root: Path, policy: str) -> list[str]:
    """The `vlarun` arguments of attack ``name``, its files written under ``root``."""
    from vlarun.paths import policy_dir

    act = ["act", "--instruction", "open", "--image"]
    if name == "npy-liar":
        return [*act, str(_npy_liar(root / "liar.npy")), "--policy", policy]
    if name in ("png-huge", "png-bomb"):
        side = 12000 if name == "png-huge" else 20000
        return [*act, str(_png_header(root / f"{side}.png", side)), "--policy", policy]
    if name == "episodes-huge":
        return [
            "eval",
            "--policy",
            policy,
            "--workers",
            "1",
            "--tasks",
            "reach-v3",
            "--episodes",
            "99999999999999999999",
        ]
    source = policy_dir(policy)
    damages = {
        "st-truncated": lambda b: b[: len(b) // 2],
        "st-flipped": lambda b: b[:8] + b"\xff\xfe" + b[10:],
        "st-header-2^40": lambda b: (2**40).to_bytes(8, "little") + b[8:],
    }
    if name in damages:
        ckpt = _damaged(root, source, damages[name])
    elif name == "config-deep":
        ckpt = _deep(root, source)
    else:
        raise ValueError(f"unknown local attack {name!r}; valid: {', '.join(LOCAL_ATTACKS)}")
    return [*act, str(_frame(root / "frame.npy")), "--policy", str(ckpt)]


# Runs `vlarun ARGS` and, at exit, writes the process's own VmHWM (kB) to $VLARUN_PEAK_FILE.
_CHILD = """
import atexit, os, runpy, sys

def _peak():
    from vlarun.runtime.testbed.procs import status_kb

    open(os.environ["VLARUN_PEAK_FILE"], "w").write(str(status_kb("self", "VmHWM") or 0))

atexit.register(_peak)
sys.argv = ["vlarun", *sys.argv[1:]]
runpy.run_module("vlarun", run_name="__main__")
"""


def run_one(name: str, policy: str = "tiny-ar") -> dict:
    """One bad input against a fresh `vlarun` process: its exit, stderr and peak RSS."""
    with tempfile.TemporaryDirectory(prefix=f"vlarun-{name}-") as tmp:
        argv = argv_for(name, Path(tmp), policy)
        peak_file = Path(tmp) / "peak_kb"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VLARUN_PEAK_FILE": str(peak_file)}
        err_path = Path(tmp) / "stderr"
        t0 = time.monotonic()
        with err_path.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, *argv],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
            status, sampled_kb = _wait(proc, TIMEOUT_S)
        seconds = time.monotonic() - t0
        stderr = err_path.read_text(errors="replace")
        at_exit_kb = int(peak_file.read_text()) if peak_file.exists() else 0
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    peak_kb = max(at_exit_kb, sampled_kb)
    peak_mb = peak_kb / 1024 if peak_kb else None
    one_line = code == 2 and len(lines) == 1 and "Traceback" not in stderr
    return {
        "attack": name,
        "kind": "local",
        "command": "vlarun " + " ".join(a if "/" not in a else Path(a).name for a in argv),
        "exit": code,
        "stderr_lines": len(lines),
        "first_line": lines[0][:200] if lines else "",
        "traceback": "Traceback" in stderr,
        "seconds": seconds,
        "peak_rss_mb": peak_mb,
        "met": bool(one_line and peak_mb is not None and peak_mb < RSS_GOAL_MB),
    }


def _wait(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, int]:
    """(wait status, the largest VmHWM sampled) of ``proc``; status None if it outlived
    ``timeout_s`` (then it is killed: an input that runs that long is a failed refusal)."""
    end, peak = time.monotonic() + timeout_s, 0
    while time.monotonic() < end:
        peak = max(peak, procs.status_kb(proc.pid, "VmHWM") or 0)
        pid, status = os.waitpid(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, peak
        time.sleep(0.02)
    proc.kill()
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return None, peak


def local_attack(name: str, policy: str) -> dict:
    """The row of one of ``LOCAL_ATTACKS`` (bench.attacks runs it)."""
    return run_one(name, policy)


def show_rows(rows: list[dict]) -> None:
    """The local inputs' own table (their columns are not a server's)."""
    if not rows:
        return
    print()
    print("| local input | exit | stderr lines | peak RSS MB | s | goal met | first line |")
    print("|---|---|---|---|---|---|---|")
    for w in rows:
        rss = "-" if w["peak_rss_mb"] is None else f"{w['peak_rss_mb']:.0f}"
        print(
            f"| {w['attack']} | {w['exit']} | {w['stderr_lines']} | {rss} | "
            f"{w['seconds']:.1f} | {'yes' if w['met'] else 'NO'} | {w['first_line']} |"
        )
