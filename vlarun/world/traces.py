"""Conditions that change during a run: bandwidth traces, read by the emulated runs of real
processes (`vlarun bench coinfer --trace`) and by the fleet simulator (`vlarun fleet --trace`).

A trace is a JSON object: ``name``, ``about``, ``seconds`` (its length, emulated seconds) and
``bandwidth_mbps``, a list of ``[t, Mbit/s]`` from ``t = 0``, each holding until the next.
Shipped (``traces/``): ``wifi-drive`` (a robot driving away from an access point and back) and
``steps``.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

TRACES_DIR = Path(__file__).with_name("traces")


def load_trace(spec: str) -> dict:
    """A trace by shipped name or file; ValueError names what is wrong."""
    path = Path(spec)
    if not path.suffix and (TRACES_DIR / f"{spec}.json").exists():
        path = TRACES_DIR / f"{spec}.json"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in TRACES_DIR.glob("*.json")))
        raise ValueError(f"no trace {spec!r}: not a file, nor one of {shipped}")
    t = json.loads(path.read_text())
    steps = t.get("bandwidth_mbps")
    if not isinstance(steps, list) or not steps or steps[0][0] != 0:
        raise ValueError(f"{path}: bandwidth_mbps must be [[0, Mbit/s], [t, Mbit/s], ...]")
    times = [float(s[0]) for s in steps]
    if times != sorted(times) or any(float(s[1]) <= 0 for s in steps):
        raise ValueError(f"{path}: times must ascend and rates be positive")
    if float(t.get("seconds", 0)) <= times[-1]:
        raise ValueError(f"{path}: seconds must outlast the last change ({times[-1]} s)")
    return t | {"path": str(path)}


def bandwidth_at(trace: dict, t: float) -> float:
    """The trace's bandwidth (Mbit/s) at ``t`` seconds from its start."""
    steps = trace["bandwidth_mbps"]
    i = bisect.bisect_right([float(s[0]) for s in steps], t) - 1
    return float(steps[max(i, 0)][1])
