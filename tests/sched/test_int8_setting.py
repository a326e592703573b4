"""Weight-only int8 as a plan-space setting: a row of the shipped settings table (accuracy cost
unmeasured), priced as the int8 bytes the transform streams and holds, left out by an accuracy
floor and by the runtime's scheduler (which cannot run it yet)."""

import dataclasses

import pytest
import torch

from vlarun.models.presets import get_preset
from vlarun.models.vla import VLA
from vlarun.policy.setting import AccelSetting
from vlarun.runtime.robot.agent import AgentConfig
from vlarun.runtime.robot.costview import make_scheduler
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import stage_works
from vlarun.sched.plans import NO_LOSS, USABLE_MEMORY, build_space, memory_needed
from vlarun.sched.settings_table import load_settings
from vlarun.stages.families import Workload
from vlarun.transforms.int8 import int8_layers, quantize_int8

MODEL = "tiny-openvla"  # autoregressive: prefill and decode both stream the LM
W = Workload(1, 24, "bfloat16")
DEVICES = {"robot": get_device("orin-nx-16gb"), "edge": get_device("rtx4090")}


def _setting(space, weights: str) -> int:
    """Index of the setting that changes nothing but ``weights``."""
    return next(
        k
        for k, g in enumerate(space.settings)
        if g.value("weights") == weights
        and all(
            g.value(n) == v
            for n, v in (("token_budget", 1.0), ("layers_kept", 1.0), ("cache_interval", 1))
        )
    )


@pytest.fixture(scope="module")
def space():
    cfg = get_preset(MODEL)
    return cfg, build_space(cfg, stage_works(cfg, W), DEVICES, W, None)


def test_the_shipped_table_names_int8_unmeasured():
    rows = {(r.knob, r.value): r for r in load_settings()}
    assert rows[("weights", "native")].relative_success == 1.0
    int8 = rows[("weights", "int8")]
    assert int8.relative_success is None and int8.source.startswith("not measured")


def test_int8_streams_the_transforms_bytes_at_the_same_flops(space):
    cfg, sp = space
    native, int8 = ({w.name: w for w in sp.works[_setting(sp, x)]} for x in ("native", "int8"))
    # What the transform saves per pass, counted on the quantised model itself.
    torch.manual_seed(0)
    model = VLA(cfg).to(torch.bfloat16)
    quantised = quantize_int8(model)
    float_w = dict(model.named_modules())
    saved = sum(
        float_w[n].weight.nbytes - (m.weight_int8.nbytes + m.scale.nbytes)
        for n, m in int8_layers(quantised).items()
    )
    assert saved > 0
    for stage in ("prefill", "decode"):
        assert int8[stage].flops == native[stage].flops  # the matmuls still run in bf16
        assert int8[stage].weight_bytes == native[stage].weight_bytes - saved
        assert int8[stage].bytes == native[stage].bytes - saved * native[stage].passes
    assert int8["vision"] == native["vision"]  # the vision tower stays float


def test_int8_fits_a_robot_the_native_weights_do_not():
    cfg = get_preset(MODEL)
    works = stage_works(cfg, W)
    robot = ("robot",) * len(works)
    need = memory_needed(works, robot, "bfloat16")["robot"]
    # A robot with room for ~90% of the bf16 model: int8 (about half the LM's bytes) fits.
    small = dataclasses.replace(DEVICES["robot"], mem_gb=0.9 * need / USABLE_MEMORY / 1e9)
    sp = build_space(cfg, works, {**DEVICES, "robot": small}, W, None)
    all_robot = next(p for p, edge in enumerate(sp.placements) if not edge.any())
    assert not sp.executable[_setting(sp, "native"), all_robot]
    assert sp.executable[_setting(sp, "int8"), all_robot]


def test_an_accuracy_floor_leaves_unmeasured_int8_out(space):
    cfg, _ = space
    for floor in (NO_LOSS, 0.9):
        sp = build_space(cfg, stage_works(cfg, W), DEVICES, W, floor)
        assert sp.eligible.any() and not sp.eligible[_setting(sp, "int8")]


def test_the_runtimes_scheduler_never_plans_int8():
    # Even with no accuracy floor (which admits unmeasured settings): the runtime cannot run it.
    cfg = AgentConfig(strategy="vlarun-joint", accuracy_floor="none")
    sched = make_scheduler(get_preset(MODEL), cfg, 24, "float32")
    assert {g.value("weights") for g in sched.space.settings} == {"native"}


def test_a_plan_naming_int8_reaches_the_runtime_and_is_refused_there():
    st = AccelSetting.from_knobs({"weights": "int8"})
    assert st == AccelSetting(weights="int8") and AccelSetting.from_knobs(st.knobs()) == st
    with pytest.raises(ValueError, match="weights=int8"):
        st.hooks("autoregressive")
