"""`vlarun bench accel | decode`: accelerators in closed loop, and Jacobi decoding."""

from __future__ import annotations

from vlarun.bench import accel, decode

OPTIONS = {"bench-accel": accel.BenchAccelOptions, "bench-decode": decode.BenchDecodeOptions}
RUN = {"bench-accel": accel.run, "bench-decode": decode.run}
SHOW = {
    "bench-accel": lambda r: print(accel.format_result(r)),
    "bench-decode": lambda r: print(decode.format_result(r)),
}
