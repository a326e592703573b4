"""Measured profiles override the roofline; every plan of a tiny preset runs on this machine."""

import json

import pytest

from vlarun.cli import main
from vlarun.models.presets import get_preset
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import stage_works
from vlarun.sched.link import Link
from vlarun.sched.plans import build_space
from vlarun.sched.predictor import predict_placement
from vlarun.sched.profile import Profile
from vlarun.sched.scheduler import Scheduler
from vlarun.stages.families import Workload
from vlarun.world.predictor_check import check_host
from vlarun.world.truth import load_samples


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLARUN_CACHE_DIR", str(tmp_path))


def test_profile_command_writes_a_file_predict_uses(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = [
        "profile",
        "--model",
        "tiny-openvla,tiny-pi0",
        "--repeats",
        "2",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    ar = [e for e in r["profile"]["entries"] if e["model"] == "tiny-openvla"]
    assert {e["stage"] for e in ar} == {"vision", "prefill", "decode"}
    # One file for both presets, with every timed run and the host's peaks: what the fleet
    # simulator takes as its truth.
    samples = load_samples("tiny-pi0", out)
    assert set(samples.seconds) == {"vision", "prefill", "denoise"}
    assert all(len(x) == 2 for x in samples.seconds.values())
    assert samples.host.bf16_tflops == r["device_peaks"]["bf16_gflops"] / 1e3
    # profile and predict default to one dtype (this CPU's best), so the defaults meet
    argv = ["predict", "--model", "tiny-openvla", "--robot-device", "this-cpu"]
    assert main([*argv, "--profile", str(out), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert all(s["latency_source"] == "measured" for s in pred["stages"])
    assert pred["estimate"] == "measured" and pred["dtype"] == ar[0]["dtype"]
    medians = {e["stage"]: e["median_ms"] for e in ar}
    assert pred["latency_ms"] == pytest.approx(sum(medians.values()))


def test_predict_and_plan_use_the_cached_profile_and_say_when_there_is_none(capsys):
    """Issue 66 (1): with a fresh cache, predict and plan say their this-cpu times are a
    roofline estimate and name the command that measures them; after `vlarun profile --model
    M` (the cache's file, the same default dtype) both read it without being told."""
    predict = ["predict", "--model", "tiny-openvla", "--robot-device", "this-cpu", "--json"]
    plan = [
        "plan",
        "--model",
        "tiny-openvla",
        "--robot-device",
        "this-cpu",
        "--edge-device",
        "rtx4090",
        "--json",
    ]
    assert main(predict) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["estimate"].startswith("roofline estimate, unprofiled: run `vlarun profile")
    assert main(plan) == 0
    r = json.loads(capsys.readouterr().out)
    assert not r["profile_files"] and any("unprofiled" in n for n in r["notes"])
    assert main(["profile", "--model", "tiny-openvla", "--repeats", "1", "--json"]) == 0
    capsys.readouterr()
    assert main(predict) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["estimate"] == "measured" and after["profile_file"]
    assert main(plan) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["profile_files"] == [after["profile_file"]]
    assert not any("unprofiled" in n for n in r["notes"])


def test_measured_table_overrides_predictor_and_scheduler():
    cfg, w = get_preset("tiny-openvla"), Workload(dtype="float32")
    works = stage_works(cfg, w)
    cpu = get_device("this-cpu")
    devices = {"robot": cpu, "edge": cpu}
    prof = Profile()
    for stage, ms in (("vision", 3.0), ("prefill", 5.0), ("decode", 7.0)):
        row = {"model": cfg.name, "stage": stage, "batch": 1, "text_tokens": 24}
        prof.add("this-cpu", row | {"dtype": "float32", "median_ms": ms})
    table = prof.stage_table(cfg.name, 1, 24, "float32")
    roles = dict.fromkeys(("vision", "prefill", "decode"), "robot")
    link = Link(100.0, 2.0)
    p = predict_placement(works, roles, devices, link, dtype="float32", measured=table)
    assert p.latency_s == pytest.approx(0.015)
    space = build_space(cfg, works, devices, w, accelerators=False)
    sched = Scheduler(space, devices, slo_s=1.0, dtype="float32", measured=table)
    sc = sched.score(link)
    all_robot = [c for c in range(len(sched.k)) if not sched.edge[c].any()]
    assert sc.latency[all_robot[0]] == pytest.approx(0.015)


def test_every_plan_of_a_tiny_preset_runs_and_is_scored():
    r = check_host("tiny-openvla-oft", repeats=2, warmup=1)
    assert len(r["plans"]) == 4  # two stages: 2^2 placements
    assert all(p["measured_median_ms"] > 0 and p["predicted_ms"] > 0 for p in r["plans"])
    assert r["uncalibrated"]["n"] == 8 and r["calibrated"]["n"] == 4
    assert 0 <= r["uncalibrated"]["within_20pct"] <= 1
