"""TRIAGE's drift diagnostic: the probe procedure on a tiny backbone, and the delta rule."""

from vlarun.sim.drift_calibration import (
    DriftCalibrationConfig,
    format_calibration,
    probe_stream,
    summarise_probes,
)


def _probe(drift, age, delta):
    return {"drift": drift, "age": age, "importance_level": 0, "delta": delta}


def test_recommended_delta_is_the_edge_below_which_reuse_never_loses():
    probes = [_probe(0.05, a, -0.01 - 0.001 * i) for a in (1, 5) for i in range(5)]
    probes += [_probe(0.25, a, -0.02 + 0.001 * i) for a in (1, 5) for i in range(5)]
    probes += [_probe(0.4, 1, 0.01 + 0.001 * i) for i in range(5)]  # reuse worse
    probes += [_probe(0.8, 1, -0.01 - 0.001 * i) for i in range(5)]  # above a bad bin: ignored
    r = summarise_probes(probes)
    assert r["recommended_delta"] == 0.3  # bin [0.1, 0.2) is empty and does not break the run
    assert [b["n"] for b in r["bins"]] == [10, 0, 10, 5, 5]
    assert r["bins"][0]["by_age"]["5"]["n"] == 5 and r["bins"][3]["reuse_no_worse"] is False
    # One cache age above zero is enough to stop the run.
    probes[0:5] = [_probe(0.05, 1, 0.02 + 0.001 * i) for i in range(5)]
    assert summarise_probes(probes)["recommended_delta"] == 0.0
    assert "recommended delta" in format_calibration(summarise_probes(probes))


def test_calibration_plot_is_written(tmp_path):
    from vlarun.sim.drift_calibration import plot_calibration

    probes = [
        _probe(d, a, (d - 0.3) * 0.1 + 0.001 * i)
        for d in (0.05, 0.25, 0.4, 0.8)
        for a in (1, 5)
        for i in range(3)
    ]
    r = summarise_probes(probes) | {"policy": "x/mt10-oft"}
    plot_calibration(r, str(tmp_path / "drift.png"))
    assert (tmp_path / "drift.png").stat().st_size > 1000


def test_probe_stream_runs_reuse_and_prune_probes(oft_policy, frames, instruction):
    cfg = DriftCalibrationConfig(ages="1,2", probe_tokens=8)
    probes = probe_stream(oft_policy, instruction, frames[:3], cfg.age_list, cfg)
    # Step 1: age 1; step 2: ages 1 and 2; nine (drift x importance) cells each.
    assert len(probes) == 27
    assert {p["age"] for p in probes} == {1, 2}
    assert all(p["drift"] >= 0 for p in probes)
    # A probe on an unchanged frame: reusing is exact, so it can only help.
    same = probe_stream(oft_policy, instruction, [frames[0]] * 2, [1], cfg)
    assert all(p["drift"] < 1e-5 and p["delta"] <= 1e-6 for p in same)
