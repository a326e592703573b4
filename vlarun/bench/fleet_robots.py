"""The robots of a fleet run, each a process of its own (`vlarun bench coinfer --robots N`).

A robot is its own computer. As threads of the bench's process the robots shared one
interpreter lock: an answer that reached a robot's socket in time waited for the lock before
the robot read it (up to 37 ms at 16 robots, with the lock handed over every 0.5 ms), so the
robot's give-up point and the edge's deadline, both exact to the millisecond, were missed by
milliseconds that no robot would lose. Here each robot is ``python -m vlarun.bench.fleet_robots``:
it loads the policy, builds its agent (``AgentConfig`` as JSON on its command line), warms up,
says it is ready, waits for the start time on its stdin, then sends one request every period,
out of phase with the others, and writes one JSON line per inference to its rows file. The
processes inherit the bench's CPUs (the robot core when pinned); on one core they wait for the
kernel's scheduler, which wakes a robot whose answer arrived within a fraction of a
millisecond, not for a lock.

    with RobotFleet(policy_name, cfg, endpoint, robots=16, requests=20) as fleet:
        rows = fleet.run()            # every robot's inferences, once all have ended
        fleet.peak_rss_mb             # the largest robot's peak resident memory
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

START_LEAD_S = 0.5  # from "go" to robot 0's first request: every robot has read its start
INSTRUCTION = "open the drawer"


class RobotFleet:
    """``robots`` agents of ``cfg`` (an ``AgentConfig``) running ``policy`` (a name or path
    ``Policy.load`` reads) against ``endpoint``, each a process; ``requests`` each, one every
    ``period_s`` (default: the deadline, ``cfg.slo_s``). Entering starts them and returns once
    all are warm (``RuntimeError`` naming the robot that did not start, the others stopped);
    ``run`` starts their clocks and returns their rows."""

    def __init__(
        self,
        policy: str,
        cfg,
        endpoint: str,
        robots: int,
        requests: int,
        period_s: float | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        if robots < 1 or requests < 1:
            raise ValueError(f"a fleet needs >= 1 robot and >= 1 request, got {robots}, {requests}")
        self.policy, self.cfg, self.endpoint = policy, cfg, endpoint
        self.robots, self.requests = robots, requests
        self.period_s = period_s or cfg.slo_s
        self.timeout_s = timeout_s  # for the whole run, once started
        self.procs: list[subprocess.Popen] = []
        self.peak_rss_mb: float | None = None
        # Over the robots' padded stages once run (None: not emulated): executions, violations.
        self.emulation: dict | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    def _rows_path(self, i: int) -> Path:
        return Path(self._dir.name) / f"robot{i}.jsonl"

    def _spawn(self, i: int) -> subprocess.Popen:
        from vlarun.config import to_dict
        from vlarun.runtime.testbed import procs

        args = [
            "--policy",
            self.policy,
            "--config",
            json.dumps(to_dict(self.cfg)),
            "--edge",
            self.endpoint,
            "--index",
            str(i),
            "--robots",
            str(self.robots),
            "--requests",
            str(self.requests),
            "--period-s",
            repr(self.period_s),
            "--rows",
            str(self._rows_path(i)),
        ]
        # Started together they share one core: each loads torch and warms up in turn.
        proc, _ = procs.spawn_module(__name__, args, timeout_s=60 + 15 * self.robots, stdin=True)
        return proc

    def __enter__(self) -> RobotFleet:
        self._dir = tempfile.TemporaryDirectory()
        with ThreadPoolExecutor(self.robots) as ex:
            futures = [ex.submit(self._spawn, i) for i in range(self.robots)]
        failed = [(i, f.exception()) for i, f in enumerate(futures) if f.exception()]
        self.procs = [f.result() for f in futures if not f.exception()]
        if failed:
            self.__exit__()
            i, e = failed[0]
            raise RuntimeError(f"fleet robot {i} of {self.robots} did not start: {e}") from e
        return self

    def run(self, start_at: float | None = None) -> list[dict]:
        """Start every robot (robot 0's first request at ``start_at``, a ``time.monotonic()``
        value, which is one clock for every process; default: ``START_LEAD_S`` from now, the
        others a share of the period after it) and wait for all; their rows, robot by robot.
        A robot that ends with an error raises ``RuntimeError`` with its stderr's tail."""
        from vlarun.runtime.emulate import merge_reports
        from vlarun.runtime.testbed import procs

        start = time.monotonic() + START_LEAD_S if start_at is None else start_at
        for p in self.procs:
            p.stdin.write(f"{start!r}\n")
            p.stdin.flush()
        end = time.monotonic() + max(start - time.monotonic(), 0) + self.timeout_s
        rss, emulation = [], []
        for i, p in enumerate(self.procs):
            try:
                p.wait(max(end - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                procs.stop(p, kill=True, close=False)
                raise RuntimeError(
                    f"fleet robot {i} did not finish in {self.timeout_s:g} s: "
                    f"{procs.stderr_of(p).strip()[-500:]}"
                ) from None
            tail = [ln for ln in p.stdout.read().splitlines() if ln.startswith("{")]
            done = json.loads(tail[-1]) if tail else {}
            if p.returncode != 0 or "peak_rss_mb" not in done:
                raise RuntimeError(
                    f"fleet robot {i} failed (exit {p.returncode}): "
                    f"{procs.stderr_of(p).strip()[-500:]}"
                )
            rss.append(float(done["peak_rss_mb"]))
            if done.get("emulation"):
                emulation.append(done["emulation"])
        self.peak_rss_mb = max(rss)
        self.emulation = merge_reports(emulation) if emulation else None
        return [
            json.loads(ln)
            for i in range(self.robots)
            for ln in self._rows_path(i).read_text().splitlines()
            if ln
        ]

    def __exit__(self, *exc) -> None:
        from vlarun.runtime.testbed import procs

        for p in self.procs:
            procs.stop(p)  # a robot still waiting for its start, or still running, ends here
        self.procs = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _robot(a: argparse.Namespace) -> tuple[int, dict | None]:
    """One robot: warm, ready, started, ``a.requests`` inferences out of phase; the number
    done and its emulator's report (None: not emulated)."""
    import torch

    from vlarun.config import from_dict
    from vlarun.policy import Policy
    from vlarun.runtime.robot.agent import AgentConfig, RobotAgent
    from vlarun.runtime.testbed.loadgen import camera_frames
    from vlarun.runtime.transport import Security

    torch.set_num_threads(1)  # a robot's one core is shared with the others
    policy = Policy.load(a.policy)
    cfg = from_dict(AgentConfig, json.loads(a.config))
    image = camera_frames(policy)
    agent = RobotAgent(policy, cfg, a.edge, Security(insecure=True))
    done = 0
    try:
        agent.warmup(image, INSTRUCTION, runs=1)
        if agent.emulator is not None:  # warmed while the other robots load: not the run
            agent.emulator.clear_counts()
        print(json.dumps({"endpoint": a.edge, "ready": True}), flush=True)
        line = sys.stdin.readline().strip()
        if not line:  # the bench ended before starting the fleet
            return 0, None
        first = float(line) + a.index * a.period_s / a.robots  # out of phase, as in a fleet
        late = time.monotonic() - first
        if late > 0.01:
            print(
                f"robot {a.index}: started {late:.2f} s after its phase; the phase is not held",
                file=sys.stderr,
            )
        time.sleep(max(-late, 0.0))
        with open(a.rows, "w") as rows:
            while done < a.requests:
                t0 = time.monotonic()
                inf = agent.infer(image, INSTRUCTION)
                done += 1
                rows.write(json.dumps(inf.row()) + "\n")
                rows.flush()
                time.sleep(max(a.period_s - (time.monotonic() - t0), 0.0))
    finally:
        agent.close()
    return done, None if agent.emulator is None else agent.emulator.report()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m vlarun.bench.fleet_robots", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--policy", required=True, help="a policy name or path Policy.load reads")
    ap.add_argument("--config", required=True, help="the AgentConfig, as JSON (config.to_dict)")
    ap.add_argument("--edge", required=True, help="the edge's endpoint (tcp://HOST:PORT)")
    ap.add_argument("--index", type=int, required=True, help="this robot's index, from 0")
    ap.add_argument("--robots", type=int, required=True, help="robots in the fleet")
    ap.add_argument("--requests", type=int, required=True, help="inferences to run")
    ap.add_argument("--period-s", type=float, required=True, help="one request every ...")
    ap.add_argument("--rows", required=True, help="where each inference's row goes (JSON lines)")
    a = ap.parse_args(argv)
    if not 0 <= a.index < a.robots or a.requests < 1 or a.period_s <= 0:
        ap.error(
            f"need 0 <= --index < --robots, --requests >= 1 and --period-s > 0, got "
            f"{a.index}, {a.robots}, {a.requests}, {a.period_s}"
        )
    done, emulation = _robot(a)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the parent, so a robot
    # started by a large bench process reported the bench's size as its own.
    from vlarun.runtime.testbed.procs import status_kb

    peak = (status_kb("self", "VmHWM") or 0) / 1024
    print(
        json.dumps({"done": done, "peak_rss_mb": round(peak, 1), "emulation": emulation}),
        flush=True,
    )


if __name__ == "__main__":
    main()
