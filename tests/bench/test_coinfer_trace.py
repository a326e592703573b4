"""Traces for bench coinfer --trace, and the summary against the best static strategy."""

import json

import pytest

from vlarun.bench.coinfer_trace import summarise_trace
from vlarun.world.traces import load_trace


def test_shipped_traces_load_and_bad_ones_are_refused(tmp_path):
    t = load_trace("wifi-drive")
    assert t["bandwidth_mbps"][0] == [0, 200] and t["seconds"] == 60
    assert load_trace("steps")["bandwidth_mbps"][-1] == [48, 200]
    with pytest.raises(ValueError, match="nor one of steps, wifi-drive"):
        load_trace("tunnel")
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"seconds": 5, "bandwidth_mbps": [[1, 10]]}))
    with pytest.raises(ValueError, match=r"\[\[0, Mbit/s\]"):
        load_trace(str(bad))
    bad.write_text(json.dumps({"seconds": 5, "bandwidth_mbps": [[0, 10], [9, 5]]}))
    with pytest.raises(ValueError, match="outlast"):
        load_trace(str(bad))


def _row(name, apj, on_time, n=100):
    return {
        "strategy": name,
        "actions_per_joule": apj,
        "slo_met_fraction": on_time,
        "inferences": n,
    }


def test_the_best_static_is_the_most_efficient_one_on_time():
    rows = [
        _row("device-only", 0.10, 0.80),
        _row("edge-only", 0.05, 1.0),
        _row("fixed-split", 0.04, 1.0),
        _row("device-only@triage:0.34", 0.11, 0.995),
        _row("vlarun-placement", 0.06, 1.0),
        _row("vlarun-joint", 0.132, 0.99),
    ]
    s = summarise_trace(rows)
    assert s["best_static"] == "device-only@triage:0.34"  # device-only misses too often
    assert s["joint_over_best_static"] == pytest.approx(1.2)
    assert s["goal_met"] and s["joint_slo_met_ci95"][0] < 0.99 < s["joint_slo_met_ci95"][1]
    assert "not computed" in s["oracle"]
