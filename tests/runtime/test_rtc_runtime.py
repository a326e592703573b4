"""Asynchronous execution with real-time chunking: the next request leads by the plan's p95,
a stall is counted when the delay outlasts the queue, an aligned chunk resumes at the current
tick, and the freeze travels with the request to whichever side runs the head."""

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vlarun.accel.rtc import P95_Z
from vlarun.policy.base import Policy
from vlarun.policy.setting import AccelSetting
from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.robot.agent import AgentConfig, Inference, RobotAgent
from vlarun.runtime.robot.chunks import ChunkQueue, Prior
from vlarun.runtime.robot.episode import run_loop
from vlarun.runtime.robot.planner import Plan
from vlarun.runtime.segments import Schema
from vlarun.runtime.transport import Security
from vlarun.sched.contract import ExecutionPlan
from vlarun.stages.packet import PacketError

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTION = "open the drawer"


class TickEnv:
    """An environment that never ends early and records every action it is stepped with."""

    def __init__(self) -> None:
        self.actions: list[np.ndarray] = []

    def reset(self, seed=None):
        self.actions = []
        return {"image": np.zeros((4, 4, 3), np.uint8)}, {}

    def step(self, action):
        self.actions.append(np.asarray(action, dtype=float))
        return {"image": np.zeros((4, 4, 3), np.uint8)}, 0.0, False, False, {"success": False}

    @staticmethod
    def hold_action(last):
        return np.array([-1.0])  # what the robot does while it holds still


def counting_policy(horizon: int):
    """Chunk k's action i is 100 k + i: an executed action names its chunk and its index."""
    priors: list[Prior] = []

    def infer(obs, prior):
        priors.append(prior)
        k = len(priors) - 1
        return (100.0 * k + np.arange(horizon, dtype=float))[:, None], k

    return infer, priors


def _run(delay: int, merge: str = "switch", horizon: int = 8, steps: int = 40):
    env, (infer, priors) = TickEnv(), counting_policy(horizon)
    r = run_loop(
        infer,
        env,
        0,
        horizon,
        control_hz=20.0,
        asynchronous=True,
        max_steps=steps,
        merge=merge,
        delay_steps=delay,
    )
    return r, [float(a[0]) for a in env.actions], priors


@pytest.mark.parametrize("delay", [1, 2, 3, 4])
def test_no_stall_while_the_delay_fits_the_queue(delay):
    r, executed, priors = _run(delay)
    assert r["stalls"] == 0 and r["skipped_actions"] == 0
    assert executed[:delay] == [-1.0] * delay  # start-up: the robot at rest, not a stall
    assert r["startup_ms"] == pytest.approx(delay * 50.0)
    # Requested with delay + 1 actions left (the lead), each chunk arrives `delay` ticks later
    # and takes over at its index `delay`: the action meant for that tick.
    for seam in r["seams"]:
        assert executed[seam] % 100 == delay
    # Requested with delay + 1 actions queued, or as soon as a chunk arrives with fewer.
    assert all(len(p.actions) == min(delay + 1, 8 - delay) for p in priors[2:])


@pytest.mark.parametrize("delay", [5, 6])
def test_a_stall_is_counted_when_the_delay_outlasts_the_queue(delay):
    # H = 8: a request leads by at most H - 1 = 7 actions, and after a chunk takes over at
    # its index `delay` only 8 - delay remain: the next one, `delay` ticks away, comes late.
    r, executed, _ = _run(delay)
    assert r["stalls"] > 0
    held = sum(a == -1.0 for a in executed[delay:])  # ticks held still after start-up
    assert held > 0 and held == pytest.approx(r["stall_ms_total"] / 50.0)
    # A late chunk resumes at the current tick: its stale head is skipped, never replayed.
    assert r["skipped_actions"] > 0
    for seam in r["seams"]:
        assert executed[seam] % 100 == delay


def test_the_append_queue_bridges_and_a_synchronous_one_waits():
    r, executed, _ = _run(3, merge="append")
    assert r["stalls"] == 0 and executed[3:11] == list(range(8))  # the first chunk whole
    env, (infer, _) = TickEnv(), counting_policy(4)
    sync = run_loop(
        infer, env, 0, 4, control_hz=20.0, asynchronous=False, max_steps=14, delay_steps=2
    )
    got = [float(a[0]) for a in env.actions]
    assert got == [-1, -1, 0, 1, 2, 3, -1, -1, 100, 101, 102, 103, -1, -1]
    assert sync["stalls"] == 2 and sync["seams"] == [8, 14]


def test_blend_is_acts_temporal_ensemble():
    def infer(obs, prior):
        return np.full((4, 1), 10.0 * len(prior.actions)), None

    q = ChunkQueue(infer, horizon=4, tick_s=0.05, inline=True, merge="blend", delay_steps=1)
    q.request({})
    assert q.pop() is None and q.actions[0] == 0.0  # start-up; the first chunk is all zeros
    q.pop()
    q.request({})  # 3 queued: this chunk says 30 everywhere, and arrives a tick later
    q.pop()
    w = np.exp(-0.01)  # the second plan of a tick weighs exp(-m), the first 1 (ACT)
    assert [float(a[0]) for a in q.actions] == pytest.approx([30 * w / (1 + w)] * 2 + [30.0])


def test_the_next_request_leads_by_the_plans_p95():
    q = ChunkQueue(
        lambda o, p: (np.zeros((8, 1)), None), horizon=8, tick_s=0.05, predict=lambda record: record
    )
    q.latency_s = 0.01  # measured: under a tick
    assert q.refill_at == 2
    q.predicted_s = 0.12  # the plan's p95: 2.4 ticks, so start with 4 actions left
    assert q.refill_at == 4 and q.lead_s == 0.12
    q.predicted_s = 0.15  # exactly 3 ticks (float noise does not make it 4)
    assert q.refill_at == 4
    q.predicted_s = 5.0  # longer than the chunk: the most lead there is
    assert q.refill_at == 7
    inf = Inference(
        actions=np.zeros((8, 4)),
        planned={},
        ran={},
        latency_s=0.1,
        slo_s=0.4,
        fallback=None,
        predicted_s=0.100,
        energy_j=1.0,
        predicted_sigma_s=0.02,
    )
    assert inf.predicted_p95_s == pytest.approx(0.100 + P95_Z * 0.02)
    assert inf.row()["predicted_p95_ms"] == pytest.approx(1e3 * (0.100 + P95_Z * 0.02))
    q.request({})
    q.join()
    assert q.predicted_s is None  # what the last record's plan predicted (none here)


# -- the agent: d from the executed plan, local or on the edge ------------------------------------


@pytest.fixture(scope="module")
def dit():
    torch.set_num_threads(1)
    return Policy.from_checkpoint(ROOT / "checkpoints" / "tiny-dit")  # diffusion, H = 4


def _frame(policy, value: int = 90) -> np.ndarray:
    size = policy.model.cfg.image_size
    return np.full((size, size, 3), value, np.uint8)


def _prior(agent, queued: int, period_s: float = 0.05) -> Prior:
    first = agent.infer(_frame(agent.policy, 30), INSTRUCTION)
    h = agent.policy.model.cfg.horizon
    model = first.model_actions[h - queued :]
    return Prior(4, first.actions[h - queued :], model, period_s, None)


def _plan(agent, where: str, latency_s: float, sigma_s: float = 0.0):
    """The agent's ``plan`` for this test: a scheduler's plan at the identity setting (as the
    agent's scheduler names it) whose contract predicts ``latency_s`` with spread ``sigma_s``."""

    def plan(text_tokens: int) -> Plan:
        cands = agent.scheduler(text_tokens).cands
        contract = ExecutionPlan(
            placement={"vision": where, "prefill": where, "denoise": where},
            settings=cands.space.settings[cands.k0].as_dict(),
            relative_success=None,
            latency_s=latency_s,
            residual_s=0.0,
            energy_j=1.0,
            actions_per_joule=1.0,
            feasible=True,
            slo_s=5.0,
            stage_start={},
            stage_end={},
            sigma_s=sigma_s,
        )
        return Plan(
            text_tokens=text_tokens,
            setting=AccelSetting(),
            planner="test",
            link_mbps=1.0,
            contract=contract,
        )

    return plan


def test_d_comes_from_the_plans_p95_and_the_queued_actions_are_frozen(dit, monkeypatch):
    agent = RobotAgent(dit, AgentConfig(slo_s=5.0, strategy="device-only", rtc=True))
    prior = _prior(agent, queued=3)
    plan = _plan(agent, "robot", 0.040, sigma_s=0.010)  # 40 ms + 1.645 x 10 ms: 1.13 periods -> 2
    monkeypatch.setattr(agent, "plan", plan)
    inf = agent.infer(_frame(dit), INSTRUCTION, prior=prior)
    assert inf.rtc_delay == 2 and inf.fallback is None
    np.testing.assert_array_equal(inf.model_actions[:2], prior.model[:2])
    assert not np.array_equal(inf.model_actions[2], prior.model[2])
    # Without RTC the same request is free.
    free = RobotAgent(dit, AgentConfig(slo_s=5.0, strategy="device-only"))
    assert free.infer(_frame(dit), INSTRUCTION, prior=prior).rtc_delay is None


def test_d_follows_a_plan_change_within_one_request(dit, monkeypatch):
    # The plan puts the head on the edge at a predicted 10 ms (d = 1); the edge is gone, so
    # the request runs here instead, and d is recomputed before the head runs: the time spent
    # so far plus the local stages left (more than two periods of 20 ms on this CPU).
    agent = RobotAgent(dit, AgentConfig(slo_s=5.0, strategy="edge-only", rtc=True))
    agent.warmup(_frame(dit), INSTRUCTION)
    prior = _prior(agent, queued=3, period_s=0.001)
    monkeypatch.setattr(agent, "plan", _plan(agent, "edge", 0.0005))
    inf = agent.infer(_frame(dit), INSTRUCTION, prior=prior)
    assert inf.fallback == "link: edge down" and set(inf.ran.values()) == {"robot"}
    assert inf.rtc_delay == 3  # > the plan's 1: the local latency, clipped to the overlap
    np.testing.assert_array_equal(inf.model_actions[:3], prior.model)


def test_the_freeze_travels_to_the_edge_in_the_packet(dit):
    server = EdgeServer(dit, Security(insecure=True), ServerConfig()).start()
    agent = RobotAgent(dit, AgentConfig(slo_s=5.0, strategy="edge-only", rtc=True), server.address)
    try:
        assert agent.monitor.up.wait(10)
        prior = _prior(agent, queued=3)
        inf = agent.infer(_frame(dit), INSTRUCTION, prior=prior)
        assert inf.fallback is None and set(inf.ran.values()) == {"edge"}
        d = inf.rtc_delay
        assert d >= 1
        np.testing.assert_array_equal(inf.model_actions[:d], prior.model[:d])
    finally:
        agent.close()
        server.stop()


def test_the_edge_refuses_a_freeze_outside_the_horizon(dit):
    schema = Schema(dit.model.cfg, "float32")  # H = 4
    freeze = lambda d, s: {"rtc_delay": torch.tensor([d]), "rtc_exec": torch.tensor([s])}  # noqa: E731
    schema.check_values(freeze(2, 2))
    for d, s in ((3, 2), (-1, 2), (0, 0), (0, 5)):
        with pytest.raises(PacketError, match="rtc_exec"):
            schema.check_values(freeze(d, s))


@pytest.mark.parametrize("setting", ["exit:0.5", "exit:1"])
def test_a_jacobi_setting_freezes_the_queued_actions(policy, setting):
    """Under a token decoder (Jacobi with early exit; sigma 1 all but never exits) the agent
    freezes as under greedy decoding: the decoder takes the forced prefix (it refused it once)."""
    st = AccelSetting.parse(setting)
    agent = RobotAgent(policy, AgentConfig(slo_s=5.0, strategy="device-only", rtc=True, setting=st))
    prior = _prior(agent, queued=3, period_s=1e-4)  # d: the whole overlap (H = 4)
    inf = agent.infer(_frame(policy), INSTRUCTION, prior=prior)
    assert inf.setting == str(st) and inf.rtc_delay == 3
    np.testing.assert_array_equal(inf.model_actions[:3], prior.model)
    decoder = agent.executor.under(st).hooks.decoder
    assert decoder.last is not None and len(decoder.steps) == 2  # the Jacobi decoder ran


def test_a_fast_policy_refuses_the_freeze_before_any_request():
    """A FAST code has no prefix that is the first d actions, under any decoder."""
    with pytest.raises(ValueError, match="FAST"):
        RobotAgent(Policy.load("tiny-pi0-fast", seed=0), AgentConfig(rtc=True))


# -- the entry points: `vlarun run-robot --rtc` and Robot(rtc=True) -------------------------------


def test_run_robot_rtc_parses_and_reaches_the_agent_config(capsys):
    from vlarun.apps.runtime import RunRobotOptions, agent_config
    from vlarun.cli import build_parser, main
    from vlarun.config import parse_into

    parser = build_parser("run-robot", RunRobotOptions)
    o = parse_into(RunRobotOptions, parser.parse_args(["--rtc", "--policy", "mt10w-flow"]))
    assert o.rtc and agent_config(o, AccelSetting(), 0.4).rtc
    plain = parse_into(RunRobotOptions, parser.parse_args([]))
    assert not plain.rtc and not agent_config(plain, AccelSetting(), 0.4).rtc
    assert main(["run-robot", "--rtc", "--sync"]) == 2  # one line, before anything loads
    assert "--sync queues none" in capsys.readouterr().err


def test_the_robot_api_freezes_the_queued_actions(dit):
    from vlarun.runtime.robot.control import Robot

    with Robot(dit, control_hz=10, strategy="device-only", rtc=True) as robot:
        assert robot.agent.cfg.rtc
        robot.warmup(_frame(dit), INSTRUCTION)
        for t in range(12):
            robot.act(_frame(dit, 40 + 10 * t), INSTRUCTION)
            time.sleep(robot.tick_s)
        assert robot.inferences[0].rtc_delay is None  # the first found nothing queued
        # A request that found actions queued froze some (one that found the queue dry, on
        # a loaded machine, has nothing to freeze).
        frozen = [inf.rtc_delay for inf in robot.inferences if inf.rtc_delay is not None]
        assert frozen and all(1 <= d <= 3 for d in frozen)  # H = 4: at most H - 1 queued
        assert robot.summary()["rtc_requests"] == len(frozen)
    with pytest.raises(ValueError, match="real-time chunking needs"):
        Robot("tiny-oft", rtc=True)
