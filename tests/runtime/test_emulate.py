"""Emulated devices: stages padded to the real model's time on a named device, overruns
counted, on the robot (agent) and the edge (server) alike."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vlarun.runtime.edge.server import EdgeServer, ServerConfig
from vlarun.runtime.emulate import Emulation, StageEmulator, StandIn
from vlarun.runtime.robot.agent import AgentConfig, RobotAgent
from vlarun.runtime.transport import Security

INSTRUCTION = "open the drawer"


def test_targets_follow_the_device_and_the_batch():
    orin = StageEmulator.build(Emulation("openvla-7b", "orin-agx-32gb"))
    rtx = StageEmulator.build(Emulation("openvla-7b", "rtx4090"))
    assert set(orin.targets) == {"vision", "prefill", "decode"}
    for stage in orin.targets:
        assert orin.target_s(stage) > 2 * rtx.target_s(stage) > 0  # the 4090 is far faster
    # Batching shares the weights' traffic: 4 decodes at once cost far less than 4 alone.
    assert rtx.target_s("decode", 4) < 2 * rtx.target_s("decode")
    scaled = StageEmulator.build(Emulation("openvla-7b", "rtx4090", time_scale=10.0))
    assert scaled.target_s("prefill") == pytest.approx(rtx.target_s("prefill") / 10)


def test_pad_waits_for_the_target_and_counts_overruns():
    emu = StageEmulator.build(Emulation("openvla-7b", "rtx4090", jitter=0.0))
    scale = emu.target_s("vision") / 0.05  # a 50 ms target
    emu = StageEmulator.build(Emulation("openvla-7b", "rtx4090", time_scale=scale, jitter=0.0))
    took = emu.pad("vision", time.perf_counter())
    assert took >= emu.target_s("vision") and emu.violations == 0
    emu.pad("vision", time.perf_counter() - 1.0)  # its own compute took 1 s: cannot be padded
    r = emu.report()
    assert r["executions"] == 2 and r["emulation_violations"] == 1 and not r["valid"]
    assert r["worst_overrun_ms"] > 900
    assert r["by_stage"]["vision"]["violations"] == 1  # the report names the stage
    assert r["by_stage"]["vision"]["executions"] == 2
    emu.clear_counts()  # a warm-up's executions are not the run's
    r = emu.report()
    assert r["executions"] == r["emulation_violations"] == 0 and r["by_stage"] == {} and r["valid"]
    # Packets: padded up to the real model's (OpenVLA: 0.6 MB of images in, 2.1 MB of vision
    # features out of the vision stage), never down.
    vision = emu.targets["vision"]
    assert emu.pad_bytes(("vision", "prefill"), "in", 1000) == vision.in_bytes - 1000
    assert emu.pad_bytes(("vision",), "out", 0) == vision.out_bytes > 2e6
    assert emu.pad_bytes(("vision",), "in", 10**9) == 0
    # Under a setting, the real model's work as the plan space transforms it: TRIAGE at 7% of
    # the visual tokens takes less prefill, nothing else changes.
    triage = {
        "token_budget": 0.07,
        "cache_interval": 1,
        "early_exit_sigma": None,
        "weights": "native",
    }
    assert emu.target_s("prefill", 1, triage) < 0.9 * emu.target_s("prefill")
    assert emu.target_s("decode", 1, triage) == emu.target_s("decode")
    with pytest.raises(ValueError, match="'in' or 'out'"):
        emu.pad_bytes(("vision",), "up", 0)
    with pytest.raises(ValueError, match="no stage"):
        StageEmulator.build(Emulation("openvla-7b", "rtx4090"), ("denoise",))
    with pytest.raises(ValueError, match="MODEL:DEVICE"):
        Emulation.parse("openvla-7b")
    with pytest.raises(ValueError, match="time_scale"):
        Emulation("openvla-7b", "rtx4090", time_scale=0)


def _scale_for(device: str, total_s: float) -> float:
    emu = StageEmulator.build(Emulation("openvla-7b", device))
    return sum(emu.target_s(s) for s in emu.targets) / total_s


def test_robot_and_edge_take_the_emulated_devices_times(policy):
    """tiny-ar's stages (vision, prefill, decode) run for real on both sides and take what
    OpenVLA-7B's take on an Orin (robot, 0.6 s per inference here) or a 4090 (edge, scaled
    by the same factor): the robot alone is slower than the edge round trip."""
    scale = _scale_for("orin-agx-32gb", 0.6)
    robot = Emulation("openvla-7b", "orin-agx-32gb", time_scale=scale, jitter=0.0)
    edge = Emulation("openvla-7b", "rtx4090", time_scale=scale, jitter=0.0)
    image = np.zeros((128, 128, 3), np.uint8)
    both = {
        "robot": StandIn.emulating(robot),
        "edge": StandIn.emulating(edge),
        "meter": "none",
    }
    local = RobotAgent(policy, AgentConfig(slo_s=5.0, strategy="device-only", **both))
    try:
        inf = local.infer(image, INSTRUCTION)
        want = sum(local.emulator.target_s(s) for s in inf.ran)
        assert inf.latency_s >= want and local.emulator.executions == 3
    finally:
        local.close()
    cfg = ServerConfig(emulate=edge)
    with EdgeServer(policy, Security(insecure=True), cfg) as srv:
        agent = RobotAgent(
            policy,
            AgentConfig(slo_s=5.0, strategy="edge-only", **both),
            srv.address,
            Security(insecure=True),
        )
        try:
            agent.warmup(image, INSTRUCTION, runs=1)
            remote = agent.infer(image, INSTRUCTION)
        finally:
            agent.close()
        # The scheduler prices OpenVLA-7B on the (scaled) Orin and 4090: with a deadline the
        # Orin misses, it plans the edge in, and its prediction is the emulated time's.
        slo = 0.5 * want  # half the emulated Orin's time (not the measured one: a busy CPU)
        planner = RobotAgent(
            policy,
            AgentConfig(slo_s=slo, strategy="vlarun", **both),
            srv.address,
            Security(insecure=True),
        )
        try:
            planner.warmup(image, INSTRUCTION, runs=1)
            runs = [planner.infer(image, INSTRUCTION) for _ in range(3)]
        finally:
            planner.close()
        assert all("edge" in r.planned.values() for r in runs)
        # ~150 ms of the 300 ms deadline to spare here, but a full suite's process has paused
        # one request's edge answer past it (2026-12-06: "no reply within 92 ms"): one request
        # of three that ran as planned is what the claim needs; the others say why they did not.
        ok = [r for r in runs if r.fallback is None]
        assert ok, [r.fallback for r in runs]
        planned = ok[-1]
        assert planned.predicted_s == pytest.approx(planned.latency_s, rel=0.5)
        assert remote.fallback is None and set(remote.ran.values()) == {"edge"}
        # The link carried OpenVLA's two 224 px images, not tiny-ar's 128 px one.
        assert remote.bytes_sent >= srv.emulator.targets["vision"].in_bytes
        for stage, ms in remote.stage_ms.items():
            assert ms * 1e-3 >= srv.emulator.target_s(stage) * 0.999
        assert remote.latency_s < inf.latency_s  # the 4090's round trip beats the Orin
        report = srv.health()["emulation"]  # what the bench reads over the wire
        assert report["executions"] >= 3 and report["emulated"] == "openvla-7b on rtx4090"


# Failed 3 of 3 times in fresh-clone full suites on 2026-12-06 (the link estimate stayed at
# its cap): on this loopback edge a probe comes back as fast as the least health answer, and
# Link.observe_transfer dropped every such sample, so the handoff hung on one probe happening
# to be slower. Such a probe now counts as a lower bound on the rate (tests/sched).
def test_a_request_running_here_hands_its_rest_to_the_edge_when_the_link_comes_back(policy):
    """OpenVLA-7B on an emulated Orin misses its deadline alone. A request planned here while
    the link was held down (a timeout's bound) sends its rest to the edge at the next stage
    boundary once the monitor's probes show the link back: the prefill and decode run on the
    emulated 4090 and the request ends long before the robot alone would have."""
    scale = _scale_for("orin-agx-32gb", 1.2)  # the robot alone: 1.2 s here, prefill ends at 0.4
    robot = Emulation("openvla-7b", "orin-agx-32gb", time_scale=scale, jitter=0.0)
    edge = Emulation("openvla-7b", "rtx4090", time_scale=scale, jitter=0.0)
    image = np.zeros((128, 128, 3), np.uint8)
    cfg = AgentConfig(
        slo_s=0.8,
        strategy="vlarun",
        robot=StandIn.emulating(robot),
        edge=StandIn.emulating(edge),
        meter="none",
    )
    with EdgeServer(policy, Security(insecure=True), ServerConfig(emulate=edge)) as srv:
        agent = RobotAgent(policy, cfg, srv.address, Security(insecure=True))
        try:
            agent.warmup(image, INSTRUCTION, runs=1)
            mon = agent.monitor
            mon.probe_every_s = 1e9  # no probe until the request has been planned
            # ... but its loop ticks often: a tick of the default 0.57 s, begun before the
            # link came back, could outlast the last stage boundary (the handoff then flaked)
            mon.up_every_s = 0.02
            time.sleep(0.7)
            agent.learner.refresh_link(agent.monitor)
            # As a request that timed out leaves it: the link is down. Far below what a probe
            # measures even on a loaded machine (CI), so the link looks back (>= 2x) at once.
            agent.link.cap(0.05)
            local_s = sum(agent.emulator.target_s(s) for s in ("vision", "prefill", "decode"))

            # The link comes back while the first stage runs here: the monitor probes again
            # (every 20 ms), and the request goes on once a probe has come back. Waiting for
            # that event, not racing it: a timer and a 0.4 s stage bound lost the race in
            # loaded full suites (CI at 48a0c38: a probe was in only after the last boundary).
            run_here = agent.executor.local
            waited = [0.0]

            def local(stage, *args, **kwargs):
                took = run_here(stage, *args, **kwargs)
                if stage.name == "vision":
                    start = time.perf_counter()
                    mon.probe_every_s = 0.02
                    while not any(k == "transfer" for k, _, _ in mon.evidence):
                        assert time.perf_counter() - start < 30, "no probe came back in 30 s"
                        time.sleep(0.01)  # polls the probes' evidence (it has no event)
                    waited[0] = time.perf_counter() - start
                return took

            agent.executor.local = local
            inf = agent.infer(image, INSTRUCTION)
        finally:
            agent.close()
    assert set(inf.planned.values()) == {"robot"}  # planned for the link held down
    # Seen failing in fresh-clone full suites (2026-12-06): no handoff. Say what the handoff
    # rule saw, so that a next failure names its cause.
    why = (
        f"link {agent.link.bandwidth_mbps:.3g} Mbps (planned at {inf.link_mbps}), "
        f"monitor up {mon.up.is_set()}, ran {inf.ran}"
    )
    assert inf.handoff is not None and inf.fallback is None, why
    assert inf.ran["decode"] == "edge" and inf.edge_at_s is not None
    assert inf.latency_s - waited[0] < 0.8 * local_s  # less the wait for the probe
    assert inf.energy_j > 0
