"""The machine a number was measured on: its CPU as lscpu's model name says it."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU model (the first core's ``model name`` in /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
