"""Memory given back after a burst (issue 45, item 14): glibc keeps freed heap memory; the
servers trim it once a burst of requests is over."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from vlarun.runtime.openpi import memory


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(memory._TRIM is None, reason="no glibc malloc_trim here")
def test_a_trim_returns_freed_heap_memory_that_glibc_would_keep():
    """256 MB in 64 KiB buffers (below the mmap threshold: the heap), all freed but the last
    (which pins the heap's top): RSS stays up until the trim gives the free pages back."""
    memory.trim()
    keep = []
    chunks = [b"x" * 65536 for _ in range(4096)]
    keep.append(b"y" * 65536)  # allocated last: the top of the heap stays in use
    high = _rss_mb()
    del chunks
    kept = _rss_mb()
    assert kept > high - 64  # glibc kept (most of) it
    assert memory.trim()
    assert _rss_mb() < kept - 150
    assert keep


def test_a_trim_is_due_after_a_burst_ends_or_a_large_one_goes_on_and_not_twice_a_second():
    now = [1000.0]  # a clock that moves only when told: on a busy machine the wall clock did
    t = memory.Trimmer(after_bytes=100, every_s=60.0, min_bytes=10, clock=lambda: now[0])
    assert not t.due(idle=True)
    t.handled(20)
    assert t.due(idle=True) and not t.due(idle=False)  # a burst over, not a large one going on
    t.handled(100)
    assert t.due(idle=False)
    t.maybe_trim(idle=False)
    assert t.trims == 1
    t.handled(1000)
    assert not t.due(idle=True)  # one a minute here (every_s)
    now[0] += 1.5
    wait = t.wait_s(idle=True)  # ... but put off, not dropped: the burst's end still gets one
    assert wait == 58.5
    now[0] += 58.5
    assert t.due(idle=True)
    assert memory.Trimmer(min_bytes=10).wait_s(idle=True) is None  # nothing to give back
    # A burst whose every frame arrived before a mid-burst trim still gets one when it ends:
    # its frames were queued or held then, and are freed only after.
    t = memory.Trimmer(after_bytes=100, every_s=0.0, min_bytes=10)
    t.handled(500)
    t.maybe_trim(idle=False)
    assert t.trims == 1
    assert t.due(idle=True) and not t.due(idle=False)
    t.maybe_trim(idle=True)
    assert t.trims == 2 and not t.due(idle=True)


def _server(trimmer: memory.Trimmer):
    pytest.importorskip("openpi_client")
    from vlarun.policy import Policy
    from vlarun.runtime import openpi

    srv = openpi.OpenpiPolicyServer(Policy.load("tiny-ar"), openpi.get_layout("metaworld"), port=0)
    srv.trimmer = trimmer
    return srv


def _one_client_then_trims(srv, trims: int) -> None:
    """One client asks once and leaves; wait (the event, 30 s at most) for ``trims``."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    stop = srv.start_in_thread(30)
    try:
        c = WebsocketClientPolicy("127.0.0.1", srv.port)
        c.infer({"image": np.zeros((128, 128, 3), np.uint8), "prompt": "open the drawer"})
        c._ws.close()
        deadline = time.monotonic() + 30
        while srv.trimmer.trims < trims and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.trimmer.trims == trims and srv.connections == 0
    finally:
        stop()


def test_the_openpi_server_trims_when_its_last_client_leaves():
    _one_client_then_trims(_server(memory.Trimmer(min_bytes=1)), 1)


def test_a_burst_ending_just_after_a_trim_is_trimmed_once_it_may_be():
    """The last client leaves within ``every_s`` of a mid-burst trim: the server trims once
    ``every_s`` has passed, instead of keeping the burst's memory until the next client."""
    srv = _server(memory.Trimmer(min_bytes=1, every_s=1.0))
    srv.trimmer.handled(10)
    srv.trimmer.maybe_trim(idle=True)  # a trim just now
    srv.trimmer.handled(10)  # ... and a burst's memory since
    assert srv.trimmer.trims == 1
    _one_client_then_trims(srv, 2)


def test_a_trim_frees_requests_that_only_a_reference_cycle_still_holds():
    """A refused request's frame is often held by a cycle (an exception's traceback holds the
    frame that raised it, whose locals hold the request); the cyclic collector runs on
    allocations, which stop with the burst. A trim collects it first."""
    import gc
    import weakref

    class Request:
        def __init__(self) -> None:
            self.frame = bytearray(16 * 2**20)

    def refuse(request: Request) -> Exception:
        try:
            raise RuntimeError("busy")
        except RuntimeError as e:
            return e  # e.__traceback__ -> this frame -> request, and the caller keeps e below

    gc.disable()  # as after a burst: nothing allocates, so nothing collects
    try:
        request = Request()
        seen = weakref.ref(request)
        err = refuse(request)
        err.cycle = err  # the exception holds itself: garbage only the cyclic collector finds
        del request, err
        assert seen() is not None  # unreachable, yet alive
        # gc.collect() is a no-op while another thread collects (an earlier test's server
        # thread may): trim until the request is gone, as a server trims burst after burst.
        # With the collection left out of trim() it never goes (the collector is off here).
        deadline = time.monotonic() + 5.0
        while seen() is not None and time.monotonic() < deadline:
            memory.trim()
        assert seen() is None
    finally:
        gc.enable()
