"""Which device a command runs on (``resolve_device``), and what this machine's CPU can do
fast, probed once per process.

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


DEVICE_HELP = "cpu | cuda | cuda:N (default cpu)"


def resolve_device(name: str) -> torch.device:
    """The torch device ``--device NAME`` asks for. Asking for CUDA where there is none raises
    one ValueError naming what is missing (a CPU-only torch build, or no visible GPU, or an
    index past the last GPU); nothing is allocated before the check."""
    text = str(name).strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    head, _, index = text.partition(":")
    if head != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    if torch.version.cuda is None:
        raise ValueError(
            f"--device {name}: this torch ({torch.__version__}) is a CPU-only build; install a "
            "CUDA build of torch on a machine with an NVIDIA GPU"
        )
    if not torch.cuda.is_available():
        raise ValueError(
            f"--device {name}: no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)"
        )
    count = torch.cuda.device_count()
    i = int(index) if index else 0
    if i >= count:
        raise ValueError(f"--device {name}: only {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return torch.device("cuda", i)


def cpu_only(name: str, command: str) -> torch.device:
    """``resolve_device`` for a command whose CUDA path is not built yet: CUDA where there is
    none fails as everywhere; CUDA where there is one fails naming the command."""
    device = resolve_device(name)
    if device.type != "cpu":
        raise ValueError(f"{command} --device {name}: this command runs on the CPU only so far")
    return device


def settle(tensors) -> None:
    """Wait for the device work that produces ``tensors`` (a dict or iterable), so a host
    timer around it measures the work, not its launch. A no-op on the CPU."""
    values = tensors.values() if isinstance(tensors, dict) else tensors
    for t in values:
        if t.device.type == "cuda":
            torch.cuda.synchronize(t.device)
            return
