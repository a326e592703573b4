"""Meters at run time: the robot agent reads its power meter around every request and reports
what it measured beside the modelled account. This machine has no meter, so the RAPL reader
runs on a powercap-shaped directory whose counter a thread advances at a known power."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from vlarun.runtime.robot.agent import AgentConfig, RobotAgent
from vlarun.sched import meters
from vlarun.sched.meters import RaplMeter, WindowMeter, detect_meters, window_meter
from vlarun.sched.records import summarise

WATTS = 40.0


@pytest.fixture
def rapl(tmp_path, monkeypatch):
    """intel-rapl:0 whose energy_uj grows at WATTS (wrapping at max_energy_range_uj).

    The counter is written at the moment it is read (each ``read_rapl`` first stores the value
    for now, then reads the file as sysfs would be read): a thread advancing it every few ms
    was starved for tens of ms on a busy machine, and the stale file then disagreed with the
    agent's clock by more than the test's tolerance, as a real RAPL counter never does."""
    d = tmp_path / "intel-rapl:0"
    d.mkdir()
    (d / "name").write_text("package-0\n")
    wrap = 2**32
    (d / "max_energy_range_uj").write_text(f"{wrap}\n")
    start, base = time.monotonic(), wrap - 10**6  # wraps during the test
    real = meters.read_rapl

    def read_now(root):
        uj = int(base + (time.monotonic() - start) * WATTS * 1e6) % wrap
        tmp = d / "energy_uj.tmp"
        tmp.write_text(f"{uj}\n")
        os.replace(tmp, d / "energy_uj")  # whole values only, as sysfs reads are
        return real(root)

    read_now(tmp_path)
    monkeypatch.setattr(meters, "read_rapl", read_now)
    return tmp_path


def test_agent_reports_the_robot_energy_its_meter_read(policy, rapl):
    image = np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8)
    agent = RobotAgent(
        policy,
        AgentConfig(strategy="device-only", slo_s=5.0),
        meter=WindowMeter(RaplMeter(root=rapl)),
    )
    try:
        infs = [agent.infer(image, "open the drawer") for _ in range(3)]
    finally:
        agent.close()
    for inf in infs:
        assert inf.measured_robot_j == pytest.approx(WATTS * inf.latency_s, rel=0.3, abs=0.05)
        assert inf.meter == "rapl (counter)"
    rows = [inf.row() for inf in infs]
    s = summarise(rows, policy.model.cfg.horizon)
    assert s["energy_source"] == "modelled; robot measured by rapl (counter)"
    assert s["measured_robot_j_mean"] > 0


@pytest.mark.skipif(bool(detect_meters()), reason="this machine has a readable meter")
def test_no_meter_here_is_modelled_and_a_named_missing_meter_is_refused():
    assert window_meter("auto") is None and window_meter("none") is None
    with pytest.raises(ValueError, match="meter 'rapl' cannot be read on this machine"):
        window_meter("rapl")
