"""`vlarun run-robot` through an edge outage (issue 64, 5): the edge process is stopped
(SIGSTOP) while a robot whose better plan is the edge runs, then continued (SIGCONT). The
robot's records show it fell back to itself during the stop and was on the edge again within
the link monitor's bound after the edge continued; the printed line says when.

Event-driven: the edge is stopped once three plans have run on it, continued once two requests
begun after the stop ran here, and the run ends at the end of the episode in which the robot
was back on the edge; every wait is bounded. The return is timed from the edge's first answer
after SIGCONT (a health probe of this test's own), not from the signal: how soon a continued
process answers is the machine's (0.3 s and more on a busy shared one), not the robot's."""

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
from vlarun.runtime.robot.client import EdgeClient, LinkDown
from vlarun.runtime.testbed import procs
from vlarun.runtime.transport import robot_security

# A robot this many times slower than the edge, under a deadline the edge meets with room on
# a busy machine (at 200 ms, beside two CPU burners, its answers came late and the plans left
# it again and again) and the robot alone never does: every plan made with the edge up puts
# stages there.
SLOWDOWN, SLO_MS = 10, 1000
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


def _answered(client: EdgeClient) -> float:
    """When the edge answered a health request (monotonic), waiting for the connection first:
    a send with no connection up fails at once (the handshake, or a reconnection after the
    stop, is still under way) and is tried again; a sent request waits for its own answer."""
    end = time.monotonic() + WAIT_S
    while True:
        try:
            client.health(timeout_s=max(0.0, end - time.monotonic()))
            return time.monotonic()
        except LinkDown:
            if time.monotonic() >= end:
                raise
            time.sleep(0.01)  # the connection's state has no event to wait on here


class Outage:
    """Stops the edge after three plans ran on it, continues it once two requests begun after
    the stop ran here, and says when the robot was on the edge again; reads the robot's
    records as they complete (``run-robot --log``'s hook)."""

    def __init__(self, pid: int, endpoint: str, keys) -> None:
        self.pid, self.rows = pid, queue.Queue()
        self.endpoint, self.keys = endpoint, keys
        self.stopped = self.continued = self.answered = self.back = None
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
            prober = self._prober()
            os.kill(self.pid, signal.SIGSTOP)
            self.stopped, here = time.monotonic(), [0]

            def fell_back(r: dict) -> bool:
                here[0] += r["started_s"] >= self.stopped and "@edge" not in r["ran"]
                return here[0] >= 2

            self._until(fell_back, "two requests run here during the stop")
            os.kill(self.pid, signal.SIGCONT)
            self.continued = time.monotonic()
            self.answered = _answered(prober)  # the continued edge's first answer
            prober.close()

            def again(r: dict) -> bool:
                return r.get("edge_at_s") is not None and r["edge_at_s"] >= self.continued

            self._until(again, "a plan on the edge after it continued")
            self.back = time.monotonic()
        except (TimeoutError, LinkDown) as e:
            self.failed = str(e)
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def _prober(self) -> EdgeClient:
        """A client of the robot's key, connected (one health answer) while the edge runs,
        so that its handshake is not part of the first answer's time after SIGCONT."""
        keys = self.keys
        sec = robot_security(False, str(keys / "edge.key"), str(keys / "robot.key_secret"))
        client = EdgeClient(self.endpoint, sec)
        _answered(client)
        return client

    def start(self) -> Outage:
        self._thread.start()
        return self


def test_run_robot_falls_back_during_an_outage_and_returns_to_the_edge(edge, monkeypatch, capsys):
    proc, endpoint, keys = edge
    outage = Outage(proc.pid, endpoint, keys).start()
    monkeypatch.setattr("vlarun.apps.runtime._step_logger", lambda: outage.log)
    play = episode.run_episode

    def until_back(*args, **kwargs):  # episodes after the return end at their first step
        return play(*args, **kwargs, stop_at=time.perf_counter() if outage.back else None)

    monkeypatch.setattr(episode, "run_episode", until_back)
    clock0, timelines = [], episode.outage_timelines

    def outage_timelines(infs, start, outages):  # the run's clock: its outages' zero
        clock0.append(start)
        return timelines(infs, start, outages)

    monkeypatch.setattr(episode, "outage_timelines", outage_timelines)
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
        str(SLOWDOWN),
        "--slo-ms",
        str(SLO_MS),
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
    took = first_back - outage.answered
    assert took <= bound + local + 0.5, (took, bound, local, outage.answered - cont)
    # The run says so: the outage the stop caused (the one the monitor saw begin before the
    # edge continued and end after it; a late answer on a busy machine may add short ones),
    # seen over within the monitor's bound of the edge's first answer, and when the plans were.
    at = lambda t: clock0[0] + t  # noqa: E731 - the run's seconds, on the test's clock
    ended = [t for t in out["edge_outages"] if t["up_s"] is not None]
    spans = [t for t in ended if at(t["down_s"]) <= cont <= at(t["up_s"])]
    assert len(spans) == 1, (ended, cont - clock0[0])
    seen = spans[0]
    assert at(seen["up_s"]) - outage.answered <= bound + 0.5, (seen, outage.answered - clock0[0])
    assert seen["why_not_back"] is None and seen["edge_again_after_restore_ms"] is not None
    show_run_robot(out)
    printed = capsys.readouterr().out
    line = f"back at {seen['up_s']:.1f} s: plans left the edge after "
    assert line in printed, printed
    assert f"on the edge again {seen['edge_again_after_restore_ms']:.0f} ms after" in printed


def _outage(down: float, up: float | None) -> dict:
    """An outage record as `run-robot --json` has it (the plans left and came back)."""
    return {
        "down_s": down,
        "up_s": up,
        "left_edge_after_drop_ms": 90.0,
        "edge_again_after_restore_ms": 150.0,
        "why_not_back": None,
    }


def test_outages_a_shaped_link_explains_are_counted_in_one_line():
    """`make demo-coinfer`'s 2 Mbit/s stretch makes the monitor's probes flap: those outages
    are one line beside the link's own; an outage outside the stretch keeps its line."""
    from vlarun.apps.runtime import outage_lines

    outages = [_outage(5.2, 5.4), _outage(6.4, 6.5), _outage(11.0, 11.3)]
    lines = outage_lines(outages, {"drop_s": 5.0, "restore_s": 9.0})
    assert (
        lines[0] == "  2 edge outage(s) seen while the shaped link was down (5 s to 9 s): "
        "--json has them"
    )
    assert len(lines) == 2 and lines[1].startswith("  edge unanswered at 11.0 s, back at 11.3 s")
    assert len(outage_lines(outages)) == 3  # no shaped link: one line each


def test_the_longest_outages_are_the_ones_printed():
    """A busy edge's late health answers add short outages around the one that mattered: past
    three, the longest are printed (in time order), the rest counted."""
    from vlarun.apps.runtime import outage_lines

    flaps = [
        _outage(t, t + d) for t, d in ((0.5, 0.1), (1.0, 0.6), (2.0, 0.2), (9.0, 0.3), (9.5, 0.1))
    ]
    stop, last = _outage(4.0, 8.0), _outage(12.0, None)
    lines = outage_lines([*flaps[:3], stop, *flaps[3:], last])
    assert [line.split(",")[0] for line in lines[:3]] == [
        "  edge unanswered at 1.0 s",
        "  edge unanswered at 4.0 s",
        "  edge unanswered at 12.0 s",
    ]
    assert lines[3] == "  (+4 shorter edge outages: --json has them)" and len(lines) == 4
