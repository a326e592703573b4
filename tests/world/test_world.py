"""Worlds: the emulated devices' truth, which the scheduler never reads (issue 47, 1-2)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from vlarun.models.presets import get_preset
from vlarun.runtime.emulate import (
    Emulation,
    StageEmulator,
    StandIn,
    emulated_device,
    world_meter,
)
from vlarun.sched.cost import roofline, stage_works
from vlarun.world import WorldError, load_world, shipped_worlds

TESTBED = ("orin-agx-32gb", "rtx4090")


def test_the_scheduler_plans_with_the_world_module_blocked():
    """Every scheduler module, and the agent's scheduler for a run emulated under the
    adversarial world, import and plan while importing vlarun.world raises."""
    code = """
import importlib, importlib.abc, pkgutil, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vlarun.world" or name.startswith("vlarun.world."):
            raise ImportError("the world is blocked: " + name)
sys.meta_path.insert(0, Block())
import vlarun.sched
for m in pkgutil.iter_modules(vlarun.sched.__path__):
    importlib.import_module("vlarun.sched." + m.name)
from vlarun.runtime.robot.agent import AgentConfig
from vlarun.runtime.emulate import Emulation, StandIn
from vlarun.runtime.robot.costview import make_scheduler
from vlarun.models.presets import get_preset
robot = Emulation("openvla-7b", "orin-agx-32gb", world="adversarial")
edge = Emulation("openvla-7b", "rtx4090", world="adversarial")
cfg = AgentConfig(slo_s=1.0, robot=StandIn.emulating(robot), edge=StandIn.emulating(edge))
sched = make_scheduler(get_preset("tiny-openvla"), cfg, 12, "float32")
world = [m for m in sys.modules if m == "vlarun.world" or m.startswith("vlarun.world.")]
print("planned", len(sched.space.placements), bool(world))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("planned") and r.stdout.split()[-1] == "False", r.stdout


def test_the_catalog_world_pads_as_the_emulator_always_did():
    emu = StageEmulator.build(Emulation("openvla-7b", "rtx4090", time_scale=4.0))
    for work in stage_works(get_preset("openvla-7b")):
        old = roofline(work, emulated_device(emu.emulation)).seconds
        assert emu.target_s(work.name) == pytest.approx(old, rel=1e-9)
    assert "tests queueing and the link only" in emu.report()["world"]


def test_published_world_pads_to_its_measured_times_and_counts_undescribed_settings():
    emu = StageEmulator.build(
        Emulation("openvla-7b", "orin-agx-32gb", time_scale=2.0, world="published")
    )
    assert emu.target_s("prefill") == pytest.approx(0.2295 / 2)  # TRIAGE Table I
    triage = {"token_budget": 0.34}
    assert emu.target_s("prefill", 1, triage) == pytest.approx(0.1677 / 2, rel=1e-3)
    pruned = {"layers_kept": 0.75}  # no measurement of its time effect: full time, counted
    assert emu.target_s("decode", 1, pruned) == emu.target_s("decode")
    import time

    emu.pad("decode", time.perf_counter() - 10, knobs=pruned)  # an overrun: no sleep
    assert emu.report()["undescribed_settings"] == {"layers_kept": 1}
    assert "published" in emu.report()["world"]


def test_adversarial_world_stalls_one_execution_in_a_hundred():
    world = load_world("adversarial", "openvla-7b", TESTBED)
    jitter = world.device("rtx4090").jitter
    rng = random.Random(0)
    stalls = sum(jitter.factor(rng) > 2.0 for _ in range(20_000))
    assert 120 <= stalls <= 280  # 1% of 20,000: 200, 4.5 sigma either way
    orin = world.device("orin-agx-32gb")
    catalog = load_world("catalog", "openvla-7b", TESTBED).device("orin-agx-32gb")
    assert orin.stage_s("decode") == pytest.approx(1.2 * catalog.stage_s("decode"), rel=1e-4)
    gpu = world.device("rtx4090")
    assert gpu.setting_ratio("prefill", {"token_budget": 0.34})[0] == pytest.approx(
        1 - 0.5 * (1 - 0.455), abs=0.01
    )  # half of the FLOPs' share


def test_the_world_is_the_meter_of_an_emulated_run():
    from vlarun.runtime.robot.agent import AgentConfig

    def sides(world):
        return tuple(StandIn.emulating(Emulation("openvla-7b", d, world=world)) for d in TESTBED)

    assert world_meter(*sides("catalog")) is None  # today's account: the scheduler's own powers
    name, devices, radio = world_meter(*sides("adversarial"))
    assert name == "adversarial" and devices["edge"].busy_w == pytest.approx(38.67)
    assert devices["robot"].busy_w == 10.0 and radio.listen_w == 0.5  # the world charges listening
    with pytest.raises(ValueError, match="one world"):
        AgentConfig(
            robot=StandIn.emulating(Emulation("openvla-7b", "orin-agx-32gb", world="published")),
            edge=StandIn.emulating(Emulation("openvla-7b", "rtx4090")),
        )


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda w: w.pop("devices"), "the file has no 'devices'"),
        (lambda w: w["devices"]["rtx4090"]["stages"]["vision"].pop("seconds"), "no 'seconds'"),
        (lambda w: w["devices"]["rtx4090"]["settings"][0].update(knob="turbo"), "unknown knob"),
        (lambda w: w["devices"]["rtx4090"]["power"].update(idle_w=900), "idle_w <= busy_w"),
        (lambda w: w.update(model="pi0"), "describes pi0; this run emulates openvla-7b"),
    ],
)
def test_a_bad_world_file_is_refused_naming_what_is_wrong(tmp_path, mutate, needle):
    data = json.loads(Path(load_world("published", "openvla-7b").path).read_text())
    mutate(data)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    with pytest.raises(WorldError, match=needle):
        load_world(str(path), "openvla-7b", TESTBED)


def test_worlds_are_found_by_name_and_unknown_ones_listed(tmp_path):
    assert {"catalog", "published", "adversarial"} <= set(shipped_worlds())
    with pytest.raises(WorldError, match="nor one of catalog, adversarial, published"):
        load_world("utopia", "openvla-7b")
    with pytest.raises(WorldError, match="has no device 'jetson-thor'"):
        load_world("published", "openvla-7b", ("jetson-thor",))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(WorldError, match="not JSON"):
        load_world(str(tmp_path / "x.json"), "openvla-7b")
