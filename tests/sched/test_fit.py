"""'Does it fit': the planner's weight bytes against the models themselves (float and after the
int8 transform), the per-device verdicts, and `vlarun plan` when no placement fits."""

import json

import pytest
import torch

from vlarun.cli import main
from vlarun.models.presets import get_preset
from vlarun.models.vla import VLA
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import stage_works
from vlarun.sched.fit import fit_report
from vlarun.sched.plans import int8_weights, memory_parts
from vlarun.stages.families import Workload
from vlarun.transforms.int8 import int8_layers, quantize_int8

W = Workload()


def _bytes(model: torch.nn.Module) -> int:
    """What a model holds in weights: its parameters, plus the int8 weights and scales."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    q = sum(m.weight_int8.nbytes + m.scale.nbytes for m in int8_layers(model).values())
    return params + q


@pytest.mark.parametrize("name", ["tiny-pi0", "tiny-openvla", "tiny-cogact", "tiny-smolvla"])
def test_whole_model_weight_bytes_are_the_models_own(name):
    cfg = get_preset(name)
    torch.manual_seed(0)
    model = VLA(cfg).to(torch.bfloat16)
    works = stage_works(cfg, W)
    roles = ("robot",) * len(works)
    native, _ = memory_parts(works, roles, "bfloat16")["robot"]
    assert native == _bytes(model)
    quantised = quantize_int8(model)
    int8, _ = memory_parts(works, roles, "bfloat16", int8_weights(cfg))["robot"]
    assert int8 == _bytes(quantised) < native


def test_int8_groups_are_what_the_transform_quantises():
    cfg = get_preset("tiny-pi0")
    layers = int8_layers(quantize_int8(VLA(cfg)))
    for group, prefix in (("llm", "language_model."), ("denoise", "action_expert.")):
        mine = [m for n, m in layers.items() if n.startswith(prefix)]
        assert mine, group
        n = sum(m.weight_int8.numel() for m in mine)
        assert int8_weights(cfg)[group] == (n, n + sum(4 * m.scale.numel() for m in mine))


def test_verdicts_bf16_int8_only_and_no():
    cfg = get_preset("openvla-7b")  # ~15 GB of bf16 weights, ~8.6 GB with int8 LM layers
    works = stage_works(cfg, W)
    verdict = {}
    for dev in ("orin-nano-8gb", "orin-nx-16gb", "rtx4090"):
        devices = {"robot": get_device(dev), "edge": get_device("rtx4090")}
        robot = fit_report(cfg, works, devices, "bfloat16")[0]
        assert robot.role == "robot" and robot.device == dev
        assert robot.int8_weight_bytes < robot.weight_bytes
        verdict[dev] = robot.verdict
    assert verdict == {"orin-nano-8gb": "no", "orin-nx-16gb": "int8 only", "rtx4090": "fits"}


PLAN = ["plan", "--model", "openvla-7b", "--robot-device", "orin-nano-8gb"]


def test_plan_says_why_nothing_fits_naming_the_numbers(capsys):
    assert main([*PLAN, "--edge-device", "orin-nano-8gb"]) == 1  # an answer, not a traceback
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "no plan" in out.out
    reason = next(x for x in out.out.splitlines() if "reason:" in x)
    # the LM's bf16 weights + KV cache against one Orin Nano's usable 85% of 8 GB
    assert "edge orin-nano-8gb 13.63 of 6.80 GB" in reason
    assert "int8 does not fit either" in reason


def test_plan_reports_int8_only_and_json(capsys):
    argv = [*PLAN, "--edge-device", "orin-nx-16gb", "--no-accelerators", "--json"]
    assert main(argv) == 1
    r = json.loads(capsys.readouterr().out)
    assert not r["ok"] and "with weight-only int8 it fits" in r["reason"]
    assert [f["verdict"] for f in r["fit"]] == ["no", "int8 only"]
    assert main([*PLAN, "--edge-device", "rtx4090", "--json"]) == 0  # the 4090 holds it in bf16
    r = json.loads(capsys.readouterr().out)
    assert [f["verdict"] for f in r["fit"]] == ["no", "fits"] and r["latency_ms"] > 0
