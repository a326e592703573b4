"""An emulated real-size model plans with the small policies' measured accuracy costs only as a
labelled proxy (``plans.carried_to``), and only when asked (``AgentConfig.settings_proxy``)."""

from vlarun.models.presets import get_preset
from vlarun.runtime.agent import AgentConfig
from vlarun.runtime.costview import make_scheduler
from vlarun.runtime.emulate import Emulation
from vlarun.sched.plans import MEASURED_SETTINGS_FILE, carried_to, load_settings


def test_measured_costs_are_carried_to_the_emulated_model_with_their_source():
    rows = load_settings(MEASURED_SETTINGS_FILE)
    carried = carried_to(rows, "openvla-7b")
    measured = [r for r in carried if r.models is not None]
    assert measured and all("openvla-7b" in r.models for r in measured)
    assert all(r.source.startswith("proxy for openvla-7b: measured on mt10-") for r in measured)
    assert [r.relative_success for r in carried] == [r.relative_success for r in rows]


def _joint_settings(proxy: bool) -> set[str]:
    emu = {"emulate": Emulation("openvla-7b", "orin-agx-32gb"),
           "edge_emulate": Emulation("openvla-7b", "rtx4090")}  # fmt: skip
    cfg = AgentConfig(slo_s=1.0, strategy="vlarun-joint", robot_device="orin-agx-32gb",
                      edge_device="rtx4090", settings_file=str(MEASURED_SETTINGS_FILE),
                      settings_proxy=proxy, meter="none", **emu)  # fmt: skip
    sched = make_scheduler(get_preset("tiny-ar"), cfg, 8, "float32")
    space = sched.space
    return {str(dict(space.settings[k].knobs)) for k in range(len(space.settings))
            if space.eligible[k]}  # fmt: skip


def test_vlarun_joint_plans_with_the_proxy_only_when_asked():
    alone, proxied = _joint_settings(False), _joint_settings(True)
    assert len(alone) == 1  # the costs belong to mt10 policies: only full compute is eligible
    assert len(proxied) > 1 and any("'token_budget': 0.07" in s for s in proxied)
