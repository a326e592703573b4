"""The open-loop load generator: a request encoded once, sent on a fixed period by robots in
a process of their own, answered by a real edge."""

from __future__ import annotations

import struct
import threading

import pytest

from vlarun.runtime.testbed import loadgen
from vlarun.stages import wire

INSTRUCTION = "open the drawer"


def test_a_request_file_round_trips_and_a_bad_one_is_refused(policy, tmp_path):
    frames = loadgen.encode_request(policy, INSTRUCTION, 1.0)
    path = tmp_path / "req.bin"
    loadgen.write_frames(frames, path)
    assert loadgen.read_frames(path) == frames
    renumbered = wire.renumber(frames, 7)
    assert wire.decode(renumbered).rid == 7 and renumbered[1:] == frames[1:]
    msg = wire.decode(frames)
    assert msg.kind == "data" and msg.stage == "vision+prefill+decode"
    assert "actions" in msg.meta["want"] and msg.deadline_s == 1.0
    bad = tmp_path / "bad.bin"
    for data in (b"nope", loadgen.MAGIC + struct.pack(">I", 2) + struct.pack(">QQ", 5, 9)):
        bad.write_bytes(data)
        with pytest.raises(ValueError):
            loadgen.read_frames(bad)


def test_open_loop_robots_send_on_their_period_whatever_the_answers(server, policy):
    """Two robots every 0.2 s for 1.2 s: about 12 requests, sent on time (not after the last
    answer), each answered by the edge. The requests carry a 10 s budget so that the drain
    waits for every answer (it waits up to the budget), however busy the machine is: a 1 s
    budget counted answers queued behind a loaded CPU as lost (issue 64, 6)."""
    frames = loadgen.encode_request(policy, INSTRUCTION, 10.0)
    counts = loadgen.run(
        server.address, frames, 2, 0.2, threading.Event(), seconds=1.2, drain_s=10.0
    )
    assert 11 <= counts["sent"] + counts["unsent"] <= 13
    assert counts["unsent"] <= 2  # only before the connection is up
    assert counts["answered"] + counts["late"] == counts["sent"] and counts["refused"] == 0


def test_the_process_reports_its_counts_when_stopped(server, policy):
    """It runs until stopped and then reports: stopped once the edge has answered five of its
    requests (waited for, not a fixed second: a busy machine starts the process late)."""
    import time

    before = server.health()["replies"]  # the edge may have served other tests' robots
    with loadgen.OpenLoopLoad(policy, server.address, 1, 0.1, 10.0) as load:
        deadline = time.monotonic() + 120
        while server.health()["replies"] < before + 5 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert load.requests >= 5 and load.counts["answered"] >= 5


def test_a_bad_request_file_names_the_problem(tmp_path, capsys):
    path = tmp_path / "req.bin"
    path.write_bytes(b"junk")
    with pytest.raises(SystemExit):
        loadgen.main(["--edge", "tcp://127.0.0.1:9", "--frames", str(path), "--insecure"])
    assert "not a request file" in capsys.readouterr().err


def test_a_request_carries_every_camera_the_policy_reads():
    """mt10w-flow reads a workspace and a wrist view: the background robots' request (and the
    fleet robots' frames) hold both, or the policy refuses the packet."""
    from pathlib import Path

    from vlarun.policy.base import Policy

    root = Path(__file__).resolve().parents[2]
    two = Policy.from_checkpoint(root / "checkpoints" / "mt10w-flow")
    assert loadgen.camera_frames(two).shape == (2, 128, 128, 3)
    msg = wire.decode(loadgen.encode_request(two, INSTRUCTION, 1.0))
    assert msg.packet.tensors["images"].shape[1] == 2


def test_robots_send_first_at_the_time_they_are_given(server, policy):
    """The phase is fixed from outside: nothing is sent before ``start_at``, then one
    request per robot per period (0.6 s from now, 2 robots x 0.2 s, 0.3 s: about 4)."""
    import time

    frames = loadgen.encode_request(policy, INSTRUCTION, 1.0)
    t0 = time.monotonic()
    counts = loadgen.run(
        server.address, frames, 2, 0.2, threading.Event(), seconds=0.3, start_at=t0 + 0.6
    )
    assert time.monotonic() - t0 >= 0.9
    assert 3 <= counts["sent"] + counts["unsent"] <= 4 and counts["unsent"] == 0


def test_rows_say_how_each_request_ended_and_what_the_edge_spent_on_it(server, policy):
    """One row per request sent: answered ones carry the edge's compute share (from the
    reply's timings) and their wall time; the counts agree with the rows."""
    rows: list[dict] = []
    frames = loadgen.encode_request(policy, INSTRUCTION, 10.0)  # the drain waits for each
    counts = loadgen.run(
        server.address, frames, 2, 0.2, threading.Event(), seconds=0.8, rows=rows, drain_s=10.0
    )
    assert len(rows) == counts["sent"] >= 3
    assert {r["kind"] for r in rows} <= {"ok", "late"}
    assert all(r["compute_s"] > 0 and r["wall_s"] >= r["compute_s"] for r in rows)
    assert sorted(r["t"] for r in rows) == [r["t"] for r in sorted(rows, key=lambda r: r["t"])]


def test_a_request_never_answered_is_lost(policy):
    """An edge that reads and never answers: every request sent ends as lost once the drain
    is over, counted and in the rows."""
    import zmq

    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    rows: list[dict] = []
    try:
        frames = loadgen.encode_request(policy, INSTRUCTION, 0.1)
        counts = loadgen.run(
            f"tcp://127.0.0.1:{port}",
            frames,
            1,
            0.1,
            threading.Event(),
            seconds=0.5,
            rows=rows,
            drain_s=0.1,
        )
    finally:
        silent.close(0)
        ctx.term()
    assert counts["sent"] >= 2 and counts["lost"] == counts["sent"] == len(rows)
    assert {r["kind"] for r in rows} == {"lost"}
