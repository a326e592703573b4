"""What this machine's CPU can do fast, probed once per process.

bf16 matmul is ~4x fp32 on a CPU with AVX-512 BF16 or AMX (the development machines of earlier
sessions), but ~100x slower than fp32 on an AVX2-only CPU such as AMD Zen 3, where oneDNN
emulates it (measured 2026-12-01: 1024^3 matmul, 2 threads, fp32 75 GFLOP/s, bf16 0.9). Code
that picks a dtype for speed, and tests that time bf16, ask here instead of assuming.
"""

from __future__ import annotations

import functools
import time

import torch


@functools.cache
def prepack_supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN can prepack ``dtype`` linear weights on this CPU. Its bf16 path needs
    AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; an AVX2-only CPU raises at reorder time, so a tiny
    weight is tried once."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), 1)
    except (RuntimeError, AttributeError):
        return False
    return True


@functools.cache
def bf16_is_fast() -> bool:
    """True when a bf16 matmul runs at least half as fast as fp32 here (native support);
    False where it is emulated. Measured on one thread (a busy second core must not decide it)
    on a 384^3 product, best of three: ~3 ms in fp32, ~100 ms where bf16 is emulated."""

    def best(dtype: torch.dtype) -> float:
        a = torch.randn(384, 384).to(dtype)
        a @ a
        times = []
        for _ in range(3):
            t = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - t)
        return min(times)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return best(torch.bfloat16) <= 2.0 * best(torch.float32)
    finally:
        torch.set_num_threads(threads)
