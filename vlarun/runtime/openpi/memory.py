"""Giving memory back to the operating system after a burst of large requests.

glibc keeps freed heap memory for reuse: after clients pipelined 1.5 GB of requests and left,
the openpi server's RSS stayed at 692 MB (349 MB idle) 10 s later. Buffers below the mmap
threshold (which glibc raises to as much as 32 MiB after freeing a large mapped one) come from
the heap, and a heap shrinks only at its top. ``malloc_trim(0)`` returns every free page of
every arena (madvise), so the server calls it once a burst is over: when its last connection
closes, or after ``TRIM_AFTER_BYTES`` of requests since the last trim, at most once a second,
off the event loop, after collecting the cyclic garbage that holds refused requests (``trim``).
Elsewhere than glibc there is nothing to call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
import time
from collections.abc import Callable

TRIM_AFTER_BYTES = 256 * 2**20  # requests freed since the last trim that warrant one mid-burst
MIN_BURST_BYTES = 16 * 2**20  # less than this since the last trim: nothing worth trimming
TRIM_EVERY_S = 1.0


def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): no such call
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_TRIM = _malloc_trim()


def trim() -> bool:
    """Collect cyclic garbage, then return the allocator's free memory to the OS; False where
    there is no allocator call (the garbage is collected all the same).

    The collection comes first because a refused or abandoned request's frame is often held
    by a reference cycle (an exception's traceback holds the frame that raised it, whose
    locals hold the request; asyncio's futures hold their exceptions), which only the cyclic
    collector frees, and it runs on allocations, which stop when the burst does: 10 s after 6
    connections pipelined 15 MiB frames the server held 443 MB (346 idle), 364 after one
    ``gc.collect()``, 361 after the trim."""
    gc.collect()
    return _TRIM is not None and bool(_TRIM(0))


class Trimmer:
    """Counts request bytes handled and trims when a burst of them is over (module docstring).
    Thread-safe; ``maybe_trim`` is cheap when nothing is due."""

    def __init__(
        self,
        after_bytes: int = TRIM_AFTER_BYTES,
        every_s: float = TRIM_EVERY_S,
        min_bytes: int = MIN_BURST_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after_bytes, self.every_s, self.min_bytes = after_bytes, every_s, min_bytes
        self.clock = clock  # injected by tests: a timed rule checked without the wall clock
        self._bytes = 0  # since the last trim
        # Since the last trim at a burst's end: a mid-burst trim runs while the burst's frames
        # are still queued or held, so only one after the burst frees them (bytes are counted
        # as frames arrive: a mid-burst trim after the last one arrived left none to count,
        # and 443 MB against 346 idle stayed).
        self._burst = 0
        self._last = -float("inf")
        self._lock = threading.Lock()
        self.trims = 0

    def handled(self, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes
            self._burst += nbytes

    def due(self, idle: bool) -> bool:
        """Whether a trim is due: a burst of at least ``min_bytes`` ended (``idle``: no
        connection left) or ``after_bytes`` went by mid-burst, and none in ``every_s``."""
        return self.wait_s(idle) == 0.0

    def wait_s(self, idle: bool) -> float | None:
        """Seconds until the trim a burst calls for may run (0: now), or None when none is
        called for. A burst that ends within ``every_s`` of a mid-burst trim still gets its
        trim, that much later: skipped, the last of its memory stayed (512 MB against 354 idle
        10 s after 16 MiB frames were pipelined, 2026-12-05)."""
        with self._lock:
            if (self._burst < self.min_bytes) if idle else (self._bytes < self.after_bytes):
                return None
            return max(0.0, self._last + self.every_s - self.clock())

    def maybe_trim(self, idle: bool) -> bool:
        if not self.due(idle):
            return False
        with self._lock:
            self._bytes, self._last = 0, self.clock()
            if idle:
                self._burst = 0
        self.trims += 1
        return trim()
