"""The machine a number was measured on: its CPU as lscpu's model name says it, and the
vector and matrix extensions its GEMM peak follows from."""

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


# The vector and matrix extensions a CPU GEMM's speed depends on, by their /proc/cpuinfo names.
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_features() -> dict[str, bool]:
    """Which of ``FEATURES`` the CPU has (the first core's ``flags``); all False off Linux."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {name: name in flags for name in FEATURES}


def cpu_summary() -> str:
    """The CPU model and what it has for GEMMs, e.g. "AMD EPYC (AVX2, AVX-512 with bf16, no
    AMX)": the header of a measured number, since its peak follows from these."""
    f = cpu_features()

    def has(flag: str, name: str, bf16: str | None = None) -> str:
        if not f[flag]:
            return f"no {name}"
        return f"{name} with bf16" if bf16 is not None and f[bf16] else name

    avx512, amx = has("avx512f", "AVX-512", "avx512_bf16"), has("amx_tile", "AMX", "amx_bf16")
    return f"{cpu_name()} ({has('avx2', 'AVX2')}, {avx512}, {amx})"
