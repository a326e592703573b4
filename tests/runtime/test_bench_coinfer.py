"""`vlarun bench coinfer --quick`: separate edge and relay processes, every strategy, the fleet,
and the overhead measurement, with the documented JSON keys (slow: tens of seconds)."""

from __future__ import annotations

import json

import pytest

from vlarun.cli import main

ROW_KEYS = {  # the co-inference issue's row contract
    "strategy",
    "bandwidth_mbps",
    "load",
    "energy_source",
    "mean_batch",
    "control_hz",
    "latency_p50_ms",
    "latency_p99_ms",
    "slo_met_fraction",
    "actions_per_joule",
}


@pytest.mark.slow
def test_bench_coinfer_quick_json(capsys, tmp_path):
    out = tmp_path / "coinfer.json"
    assert main(["bench", "coinfer", "--quick", "--batching", "--json", "--out", str(out)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == r
    assert [x["strategy"] for x in r["rows"]] == [
        "device-only",
        "edge-only",
        "fixed-split",
        "vlarun",
    ]
    assert all(set(x) >= ROW_KEYS for x in r["rows"])
    assert r["rows"][0]["fallbacks"] == 0 and r["quick"]
    assert r["rows"][0]["mean_batch"] is None  # device-only: nothing ran on the edge
    assert r["rows"][1]["energy_source"] == "modelled"
    assert r["fleet"]["robots"] == 2 and r["fleet"]["inferences"] == 8
    assert r["runtime_overhead"]["raw_round_trip_ms"] > 0
    one = r["batching"]["max_batch_1"]
    assert one["inferences"] == 8 and one["mean_batch"] in (None, 1.0)
    assert "modelled" in r["energy_source"]
