"""Robot agent: every strategy gives the local actions; killing the edge mid-episode leaves
the robot finishing locally within deadline + one local inference, and it reconnects when the
edge returns."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from vlarun.runtime.emulate import StandIn
from vlarun.runtime.robot.agent import AgentConfig, RobotAgent
from vlarun.runtime.robot.chunks import ChunkQueue
from vlarun.runtime.robot.episode import run_episode
from vlarun.runtime.robot.planner import Plan
from vlarun.runtime.testbed import procs
from vlarun.runtime.transport import Security
from vlarun.stages.wire import Codec

INSECURE = Security(insecure=True)
INSTRUCTION = "open the drawer"  # as conftest.py (not importable: several conftests)


class StubEnv:
    """Meta-World's interface without the simulator: fixed frames, success after n steps."""

    instruction = INSTRUCTION

    def __init__(self, n: int, size: int = 128) -> None:
        self.n, self.t = n, 0
        self.image = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)

    def reset(self, seed=None):
        self.t = 0
        return {"image": self.image}, {}

    def step(self, action):
        assert action.shape == (4,)
        self.t += 1
        done = self.t >= self.n
        return {"image": self.image}, 0.0, done, False, {"success": done}


def _wait(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_the_agent_takes_every_strategy_by_its_canonical_name_and_refuses_others():
    """sched/strategy.py spells the names once: the agent takes each, and the old alias."""
    from vlarun.sched.strategy import STRATEGIES as CANONICAL

    for name in (*CANONICAL, "vlarun"):
        assert AgentConfig(strategy=name).strategy == name
    with pytest.raises(ValueError, match="unknown strategy 'edge-first'; strategies: device-only"):
        AgentConfig(strategy="edge-first")


@pytest.mark.parametrize("strategy", ["edge-only", "fixed-split", "vlarun", "vlarun-placement"])
def test_strategies_give_the_local_actions(server, policy, strategy):
    image = StubEnv(1).image
    expected = policy.predict(image, INSTRUCTION)
    cfg = AgentConfig(slo_s=2.0, strategy=strategy, codec=Codec())
    agent = RobotAgent(policy, cfg, server.address, INSECURE)
    try:
        assert agent.edge_up
        agent.warmup(image, INSTRUCTION, runs=1)
        for _ in range(3):
            inf = agent.infer(image, INSTRUCTION)
            assert inf.fallback is None
            np.testing.assert_allclose(inf.actions, expected, atol=1e-5)
        if not strategy.startswith("vlarun"):
            assert "edge" in inf.ran.values()
            assert all(ms >= 0 for ms in inf.remote_overhead_ms)
    finally:
        agent.close()


def test_after_warmup_the_first_request_builds_nothing_inside_its_deadline(
    server, policy, monkeypatch
):
    """The graph, stand-in factors and scheduler are built by warmup (``prepare``), not by the
    first request: built there they cost it ~60 ms (more under load), which the scheduler
    learned as its placement's residual and spread and so shunned that placement."""
    from vlarun.policy import base as policy_module
    from vlarun.runtime.robot import costview

    image = StubEnv(1).image
    cfg = AgentConfig(slo_s=2.0, strategy="vlarun")
    agent = RobotAgent(policy, cfg, server.address, INSECURE)
    try:
        agent.warmup(image, INSTRUCTION, runs=1)

        def built_in_a_request(*args, **kwargs):
            raise AssertionError("one-time setup inside a timed request")

        for module, name in (
            (costview, "make_scheduler"),
            (costview, "stand_in_factors"),
            (policy_module, "build_graph"),
        ):
            monkeypatch.setattr(module, name, built_in_a_request)
        inf = agent.infer(image, INSTRUCTION)
        assert inf.predicted_s is not None  # planned by the scheduler
    finally:
        agent.close()


def test_chunk_queue_appends_behind_the_queue_and_leads_by_the_latency():
    gate = threading.Event()
    gate.set()

    def infer(obs, prior):
        gate.wait(5)
        return np.full((4, 4), float(obs["k"])), obs["k"]

    q = ChunkQueue(infer, horizon=4, tick_s=0.05)
    assert q.refill_at == 3  # latency unknown yet: the most lead
    q.request({"k": 0})
    assert q.pop()[0] == 0
    assert q.refill_at == 2  # that inference took < 1 tick: 1 tick + 1 spare
    q.latency_s = 0.12  # 2.4 ticks: start with 3 actions left
    gate.clear()
    assert q.needs_refill() and q.request({"k": 1})
    assert not q.request({"k": 2})  # one inference in flight at a time
    assert [q.pop()[0] for _ in range(3)] == [0, 0, 0]  # the old chunk bridges the wait
    gate.set()
    q.join()
    assert [q.pop()[0] for _ in range(4)] == [1, 1, 1, 1]  # appended, executed whole
    q.latency_s = 0.04  # 0.8 ticks: start when 2 actions are left (ceil + 1 spare tick)
    assert q.refill_at == 2
    assert q.records == [0, 1] and len(q.stalls) <= 1  # only the very first chunk waited for
    sync = ChunkQueue(infer, horizon=4, tick_s=0.05, lead=False)
    assert sync.refill_at == 0


def test_edge_killed_mid_episode_robot_finishes_locally_and_reconnects(policy):
    edge, endpoint = procs.start_edge()
    port = int(endpoint.rsplit(":", 1)[1])
    slo = 0.6
    agent = RobotAgent(policy, AgentConfig(slo_s=slo, strategy="edge-only"), endpoint, INSECURE)
    restarted = None
    try:
        assert _wait(lambda: agent.edge_up, 10)
        env = StubEnv(60)
        agent.warmup(env.image, INSTRUCTION)
        local_s = sum(agent.local_s.values())
        records: list = []

        def on_inference(i, inf):
            records.append(inf)
            if sum("edge" in r.ran.values() for r in records) == 3 and edge.poll() is None:
                procs.stop(edge, kill=True)  # SIGKILL: no goodbye on the wire

        ep = run_episode(agent, env, 0, control_hz=40.0, max_steps=60, on_inference=on_inference)
        assert ep["success"] and ep["steps"] == 60  # the episode finished
        assert edge.poll() is not None
        # The first request after the kill falls back, or (when the monitor heard the edge go
        # first) is planned on the robot: either way everything from there on runs here.
        kill_at = next(
            i for i, r in enumerate(records) if r.fallback or "edge" not in r.ran.values()
        )
        assert all("edge" in r.ran.values() for r in records[:kill_at])
        assert all(r.ran and set(r.ran.values()) == {"robot"} for r in records[kill_at:])
        # No step later than its deadline plus one local inference (+ slack for a shared CPU).
        worst = max(r.late_s for r in records)
        assert worst <= 1.5 * local_s + 0.05, (worst, local_s)
        assert not agent.edge_up
        restarted, _ = procs.start_edge(port=port)
        assert _wait(lambda: agent.edge_up, 15), "no reconnect after the edge came back"
        # The monitor's socket hears the edge first; the agent's own DEALER may still be
        # reconnecting (its first send then fails "no connection" and the edge is marked down
        # until the monitor hears it again). Wait for the event itself: a request served by
        # the edge, within a generous bound.
        again: list = []
        end = time.monotonic() + 30.0
        while time.monotonic() < end and not any(
            "edge" in r.ran.values() and r.fallback is None for r in again
        ):
            again.append(agent.infer(env.image, INSTRUCTION))
        assert any("edge" in r.ran.values() and r.fallback is None for r in again), [
            (r.ran, r.fallback) for r in again[-3:]
        ]
        assert agent.monitor.reconnects >= 1
    finally:
        agent.close()
        procs.stop(edge, kill=True)
        if restarted is not None:
            procs.stop(restarted)


def test_a_timed_out_request_caps_the_bandwidth_estimate(policy):
    from vlarun.runtime.robot.client import LinkDown

    agent = RobotAgent(policy, AgentConfig(bandwidth_mbps=500.0, rtt_ms=0.0))
    e = LinkDown("no reply")
    e.sent_bytes, e.waited_s = 200_000, 0.2  # 1.6 Mbit not through in 0.2 s: < 8 Mbit/s
    agent.learner.bound_bandwidth(e)
    assert agent.link.bandwidth_mbps <= 8.0 + 1e-9
    small = LinkDown("no reply")
    small.sent_bytes, small.waited_s = 1000, 0.2  # too small to say anything about bandwidth
    agent.learner.bound_bandwidth(small)
    assert agent.link.bandwidth_mbps == pytest.approx(8.0)
    assert not agent.edge_up and agent.infer(StubEnv(1).image, INSTRUCTION).ran == {
        "vision": "robot",
        "prefill": "robot",
        "decode": "robot",
    }


def test_bench_runs_episodes_back_to_back_until_its_step_count(policy):
    """A successful episode ends early; the co-inference bench then starts the next one so a
    strategy's run always holds ``steps`` control steps (and enough requests to count)."""
    from vlarun.bench.coinfer import _episodes

    agent = RobotAgent(policy, AgentConfig(slo_s=1.0, strategy="device-only"))
    seen: list[float] = []
    try:
        ep = _episodes(agent, StubEnv(10), 100.0, 25, lambda: seen.append(1.0))
    finally:
        agent.close()
    assert ep["episodes"] == 3 and ep["success"] == 2 / 3  # 10 + 10 + 5 (cut by the count)
    assert len(ep["inferences"]) == len(seen) >= 25 // policy.model.cfg.horizon
    assert ep["control_hz"] > 0


def test_no_accepted_edge_answer_makes_a_request_late(server, policy):
    """A deadline about as long as the edge takes: the robot waits only until the deadline
    less what its own later stages need, the edge gets that less the packet's ways as its own
    deadline. Whatever came back in time and was used finished in time; the rest fell back
    (at most deadline + one local run)."""
    image = StubEnv(1).image
    probe = RobotAgent(
        policy, AgentConfig(slo_s=2.0, strategy="edge-only"), server.address, INSECURE
    )
    try:
        probe.warmup(image, INSTRUCTION, runs=1)
        usual = np.median([probe.infer(image, INSTRUCTION).latency_s for _ in range(5)])
    finally:
        probe.close()
    for strategy in ("edge-only", "fixed-split"):
        cfg = AgentConfig(slo_s=float(usual), strategy=strategy)
        agent = RobotAgent(policy, cfg, server.address, INSECURE)
        try:
            agent.warmup(image, INSTRUCTION, runs=1)
            local = sum(agent.local_s.values())
            infs = [agent.infer(image, INSTRUCTION) for _ in range(12)]
        finally:
            agent.close()
        for inf in infs:
            if inf.fallback is None and "edge" in inf.ran.values() and not inf.late_edge:
                assert inf.late_s <= 0.01, (strategy, inf.late_s)  # decoding's few ms at most
            # One local run: as warm-up measured it, or as this one took (a busy machine runs
            # it slower than its warm-up did; a robot that waited past the deadline still fails).
            here = sum(ms for s, ms in inf.stage_ms.items() if inf.ran.get(s) == "robot") / 1e3
            assert inf.late_s <= 1.5 * max(local, here) + 0.05, (strategy, inf.late_s, local, here)


class _Pinned(RobotAgent):
    """Runs one placement whatever its strategy: the first stage here, the middle ones on the
    edge, the last here again (a split the scheduler may choose; no fixed strategy has it)."""

    def plan(self, text_tokens: int):
        names = [s.name for s in self.graph(text_tokens).stages]
        where = {n: "edge" for n in names}
        where[names[0]] = where[names[-1]] = "robot"
        return Plan(
            text_tokens=text_tokens,
            fixed=where,
            setting=self.cfg.setting,
            planner="pinned",
            link_mbps=self.link.bandwidth_mbps,
        )


def test_the_robot_does_not_wait_for_an_answer_its_own_later_stage_would_make_late(server, policy):
    """vision here, prefill on the edge, decode here on a 4x-slowed robot, under a deadline
    that fits the edge's usual answer but not the decode after it. The robot waits for the
    edge only while its decode still fits (and tells the edge so): the answer is refused or
    not waited for, and the request runs here, instead of arriving "in time" and then being
    made late by the decode (before: the edge was given the rest of the deadline, so the
    answer was used and the request ended about half a decode late)."""
    image = StubEnv(1).image
    loose = _Pinned(
        policy,
        AgentConfig(slo_s=5.0, strategy="edge-only", robot=StandIn(slowdown=4.0)),
        server.address,
        INSECURE,
    )
    try:
        loose.warmup(image, INSTRUCTION, runs=1)
        # The fastest edge answer, not the median: on a busy machine the median can be far
        # above what the run below sees, and a deadline set from it is met without the case.
        usual = float(np.min([loose.infer(image, INSTRUCTION).latency_s for _ in range(5)]))
        decode = loose.local_s["decode"]  # tiny-ar: vision, prefill, decode
    finally:
        loose.close()
    assert decode > 0.04  # the 4x decode: long enough that half of it is a clear miss
    cfg = AgentConfig(slo_s=usual - decode / 2, strategy="edge-only", robot=StandIn(slowdown=4.0))
    agent = _Pinned(policy, cfg, server.address, INSECURE)
    try:
        agent.warmup(image, INSTRUCTION, runs=1)
        infs = [agent.infer(image, INSTRUCTION) for _ in range(6)]
    finally:
        agent.close()
    for inf in infs:
        if inf.fallback is None and "edge" in inf.ran.values() and not inf.late_edge:
            assert inf.late_s <= 0.01, (
                f"an edge answer was used and the request was late by {inf.late_s:.3f} s"
            )
    assert any(inf.fallback is not None or inf.late_edge for inf in infs)  # the case was met


def test_the_robots_stage_times_have_one_learner_the_planners_calibration(policy):
    """The warm-up's times prime the planner's scheduler; every request's stages teach it
    (a fixed strategy's and an edge-down one's too); what the executor reserves for the robot
    stages after an edge segment and the real-time chunk's freeze read it back in this host's
    seconds (``Planner.robot_s``). No second estimate of the same quantity."""
    agent = RobotAgent(policy, AgentConfig(slo_s=5.0, strategy="device-only"))
    try:
        image = StubEnv(1).image
        warm = agent.warmup(image, INSTRUCTION, runs=1)
        assert set(warm) == {"vision", "prefill", "decode"}  # tiny-ar
        assert agent.local_s == pytest.approx(warm, rel=1e-9)  # this-cpu: no conversion
        before = dict(agent.local_s)
        inf = agent.infer(image, INSTRUCTION)
        for name, ms in inf.stage_ms.items():
            # the factor is the median of its recent ratios: of two, their mean
            want = (before[name] + ms * 1e-3) / 2
            assert agent.local_s[name] == pytest.approx(want, rel=1e-6, abs=1e-6), name
        assert not hasattr(agent.learner, "local_s")  # the learner keeps no copy
        # Plain floats: a numpy scalar here made an edge reply's ``late`` a numpy bool, which
        # the fleet robots' JSON rows could not hold.
        assert all(type(v) is float for v in agent.local_s.values())
    finally:
        agent.close()


def test_a_scheduler_built_while_the_edge_was_down_is_primed_once_the_edge_is_heard(policy):
    """An edge-down request teaches the planner's scheduler its stage times (so it is built
    before any health reply); the first health reply carrying the edge's per-stage estimates
    primes the edge side of it all the same, once."""
    agent = RobotAgent(policy, AgentConfig(slo_s=5.0, strategy="vlarun"))
    try:
        image = StubEnv(1).image
        inf = agent.infer(image, INSTRUCTION)  # no edge: robot-only, nobody's plan
        assert inf.predicted_s is None and set(inf.ran.values()) == {"robot"}  # edge down
        n = agent.planner.text_tokens
        sched = agent.planner.scheduler(n)
        assert all(role == "robot" for _, role in sched.cal.stage_factor)  # taught, not primed
        agent.planner.prepare(n, {}, {"stage_ms": {"vision": 3.0, "prefill": 5.0}})
        edge = {s: f for (s, role), f in sched.cal.stage_factor.items() if role == "edge"}
        assert set(edge) == {"vision", "prefill"}
        agent.planner.prepare(n, {}, {"stage_ms": {"vision": 300.0}})  # once: not again
        assert sched.cal.stage_factor[("vision", "edge")] == edge["vision"]
    finally:
        agent.close()
