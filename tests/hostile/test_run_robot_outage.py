"""`vlarun run-robot` through an edge outage (issue 64, 5): the edge process is stopped
(SIGSTOP) while a robot whose better plan is the edge runs, then continued (SIGCONT). The
robot's records show it fell back to itself during the stop and was on the edge again within
the link monitor's bound after the edge continued; the printed line says when.

Event-driven: the edge is stopped once three plans have run on it, continued once two requests
begun after the stop ran here, and the run ends at the end of the episode in which the robot
was back on the edge; every wait is bounded."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest

from vlarun.apps.runtime import RunRobotOptions, cmd_run_robot, show_run_robot
from vlarun.cli import build_parser, parse_into
from vlarun.runtime.robot import episode
from vlarun.runtime.testbed import procs

WAIT_S = 120.0  # any one event, at most (a busy machine; it takes ~1 s on a quiet one)


@pytest.fixture(autouse=True)
def _headless(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))


@pytest.fixture
def edge(tmp_path):
    """A `vlarun serve-edge` process (tiny-ar, CurveZMQ with keys made here); (process,
    endpoint, keys folder). Left running (SIGCONT first) whatever the test does to it."""
    procs.local_keys(tmp_path)
    proc, endpoint = procs.start_edge(
        extra=["--policy", "tiny-ar", "--threads", "1"], keys=tmp_path
    )
    try:
        yield proc, endpoint, tmp_path
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        procs.stop(proc)


def _on_edge(row: dict) -> bool:
    return "@edge" in row["ran"] and row["fallback"] is None


class Outage:
    """Stops the edge after three plans ran on it, continues it once two requests begun after
    the stop ran here, and says when the robot was on the edge again; reads the robot's
    records as they complete (``run-robot --log``'s hook)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.rows = pid, queue.Queue()
        self.stopped = self.continued = self.back = None
        self.failed: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def log(self, i: int, inf) -> None:
        self.rows.put(inf.row())

    def _until(self, done, what: str) -> None:
        end = time.monotonic() + WAIT_S
        try:
            while not done(self.rows.get(timeout=max(0.0, end - time.monotonic()))):
                pass
        except queue.Empty:
            raise TimeoutError(f"no {what} within {WAIT_S:g} s") from None

    def _run(self) -> None:
        try:
            n = [0]

            def edge_ran(r: dict) -> bool:
                n[0] += _on_edge(r)
                return n[0] >= 3

            self._until(edge_ran, "three plans on the edge")
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped, here = time.monotonic(), [0]

            def fell_back(r: dict) -> bool:
                here[0] += r["started_s"] >= self.stopped and "@edge" not in r["ran"]
                return here[0] >= 2

            self._until(fell_back, "two requests run here during the stop")
            os.kill(self.pid, signal.SIGCONT)
            self.continued = time.monotonic()

            def again(r: dict) -> bool:
                return r.get("edge_at_s") is not None and r["edge_at_s"] >= self.continued

            self._until(again, "a plan on the edge after it continued")
            self.back = time.monotonic()
        except TimeoutError as e:
            self.failed = str(e)
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def start(self) -> Outage:
        self._thread.start()
        return self


def test_run_robot_falls_back_during_an_outage_and_returns_to_the_edge(edge, monkeypatch, capsys):
    proc, endpoint, keys = edge
    outage = Outage(proc.pid).start()
    monkeypatch.setattr("vlarun.apps.runtime._step_logger", lambda: outage.log)
    play = episode.run_episode

    def until_back(*args, **kwargs):  # episodes after the return end at their first step
        return play(*args, **kwargs, stop_at=time.perf_counter() if outage.back else None)

    monkeypatch.setattr(episode, "run_episode", until_back)
    # A robot three times slower than the edge: every plan the scheduler makes with the edge
    # up puts stages there.
    argv = [
        "--edge",
        endpoint,
        "--server-key",
        str(keys / "edge.key"),
        "--keys",
        str(keys / "robot.key_secret"),
        "--task",
        "reach-v3",
        "--episodes",
        "8",
        "--strategy",
        "vlarun",
        "--robot-slowdown",
        "3",
        "--log",
    ]
    o = parse_into(RunRobotOptions, build_parser("run-robot", RunRobotOptions).parse_args(argv))
    out = cmd_run_robot(o)
    assert outage.failed is None and outage.back is not None, outage.failed or "the run ended"
    infs = [r for e in out["episodes"] for r in e["inferences"]]
    stop, cont = outage.stopped, outage.continued
    during = [r for r in infs if stop <= r["started_s"] < cont]
    assert during and not any(_on_edge(r) for r in during)  # fell back: nothing on the edge
    assert any(r["fallback"] and r["fallback"].startswith("link") for r in infs)
    # Back within the monitor's bound: it sees the edge at most restore_bound_s after the
    # edge answers again, and the request running here then is the last before an edge plan.
    bound = out["monitor_restore_bound_s"]
    local = max(r["latency_ms"] for r in during) / 1e3
    first_back = min(r["edge_at_s"] for r in infs if (r["edge_at_s"] or 0) >= cont)
    assert first_back - cont <= bound + local + 0.5, (first_back - cont, bound, local)
    # The run says so: the outage the stop caused, when it was back, and when the plans were.
    # The monitor sees the stop a health timeout late at most, and the return within its
    # bound: the longest outage it saw is the stop's (a late answer on a busy machine may add
    # short ones).
    ended = [t for t in out["edge_outages"] if t["up_s"] is not None]
    assert ended, out["edge_outages"]
    seen = max(ended, key=lambda t: t["up_s"] - t["down_s"])
    assert seen["up_s"] - seen["down_s"] >= (cont - stop) - bound, (ended, cont - stop)
    assert seen["why_not_back"] is None and seen["edge_again_after_restore_ms"] is not None
    show_run_robot(out)
    printed = capsys.readouterr().out
    line = f"back at {seen['up_s']:.1f} s: plans left the edge after "
    assert line in printed, printed
    assert f"on the edge again {seen['edge_again_after_restore_ms']:.0f} ms after" in printed


def test_outages_a_shaped_link_explains_are_counted_in_one_line():
    """`make demo-coinfer`'s 2 Mbit/s stretch makes the monitor's probes flap: those outages
    are one line beside the link's own; an outage outside the stretch keeps its line."""
    from vlarun.apps.runtime import outage_lines

    def outage(down: float, up: float | None) -> dict:
        return {
            "down_s": down,
            "up_s": up,
            "left_edge_after_drop_ms": 90.0,
            "edge_again_after_restore_ms": 150.0,
            "why_not_back": None,
        }

    outages = [outage(5.2, 5.4), outage(6.4, 6.5), outage(11.0, 11.3)]
    lines = outage_lines(outages, {"drop_s": 5.0, "restore_s": 9.0})
    assert (
        lines[0] == "  2 edge outage(s) seen while the shaped link was down (5 s to 9 s): "
        "--json has them"
    )
    assert len(lines) == 2 and lines[1].startswith("  edge unanswered at 11.0 s, back at 11.3 s")
    assert len(outage_lines(outages)) == 3  # no shaped link: one line each
