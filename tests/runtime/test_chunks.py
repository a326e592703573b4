"""The chunk queue at the seam: a chunk that arrives after the queue ran dry is aligned to the
current tick (its stale head skipped), never replayed from its start."""

import threading

import numpy as np

from vlarun.runtime.robot.chunks import ChunkQueue


def _late_queue(horizon: int, tick_s: float, lead: bool = True):
    """A queue whose second inference returns only when ``release`` is set; chunk k's action
    i is 100 k + i, so an action names its chunk and its index."""
    release = threading.Event()

    def infer(obs, prior):
        if obs["k"]:
            release.wait(5)
        return np.arange(horizon, dtype=float)[:, None] + 100 * obs["k"], obs["k"]

    return ChunkQueue(infer, horizon, tick_s, lead=lead), release


def _run_dry_then_wait(q, release, wait_s):
    q.request({"k": 0})
    first = [q.pop()[0] for _ in range(q.horizon)]  # executed whole: the robot was at rest
    assert not q.actions and q.request({"k": 1})  # the queue ran dry; the next is in flight
    threading.Timer(wait_s, release.set).start()
    return first


def test_a_late_chunk_resumes_at_the_current_tick():
    q, release = _late_queue(horizon=16, tick_s=0.02)
    first = _run_dry_then_wait(q, release, 0.2)  # >= 10 ticks late (less a timer start)
    assert first == list(range(16)) and q.skipped == []
    resumed = q.pop()[0]
    assert 109 <= resumed <= 115  # not 100: the stale head is not replayed
    assert q.skipped == [resumed - 100]
    rest = [q.pop()[0] for _ in range(len(q.actions))]
    assert rest == list(range(int(resumed) + 1, 116))  # and the rest runs in order


def test_a_chunk_later_than_its_length_keeps_only_its_last_action():
    q, release = _late_queue(horizon=4, tick_s=0.01)
    _run_dry_then_wait(q, release, 0.2)  # ~20 ticks late, the chunk has 4
    assert q.pop()[0] == 103 and q.skipped == [3] and not q.actions


def test_a_synchronous_queue_waits_and_runs_the_chunk_whole():
    q, release = _late_queue(horizon=8, tick_s=0.01, lead=False)
    _run_dry_then_wait(q, release, 0.1)
    assert [q.pop()[0] for _ in range(8)] == list(range(100, 108))
    assert q.skipped == [] and len(q.stalls) >= 1  # the wait is a stall, counted, not skipped
