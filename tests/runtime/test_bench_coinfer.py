"""`vlarun bench coinfer --quick`: separate edge and relay processes, every strategy, the fleet,
and the overhead measurement, with the documented JSON keys (slow: tens of seconds)."""

from __future__ import annotations

import json
import os

import pytest

from vlarun.cli import main

ROW_KEYS = {  # the co-inference issue's row contract
    "model",
    "emulation_violations",
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
    assert r["fleet"]["robots_as"] == "processes" and r["fleet"]["robot_peak_rss_mb"] > 50
    assert r["runtime_overhead"]["raw_round_trip_ms"] > 0
    one = r["batching"]["max_batch_1"]
    assert one["inferences"] == 8 and one["mean_batch"] in (None, 1.0)
    assert "modelled" in r["energy_source"]


@pytest.mark.slow
def test_bench_coinfer_quick_matrix_json(capsys, tmp_path):
    out = tmp_path / "matrix.json"
    argv = ["bench", "coinfer", "--quick", "--matrix", "--load-robots", "0", "1", "2"]
    assert main([*argv, "--json", "--out", str(out)]) == 0
    r = json.loads(capsys.readouterr().out)
    cells = {(x["bandwidth"], x["load"]) for x in r["rows"]}
    assert cells == {(b, load) for b in ("200", "200-50") for load in ("light", "heavy")}
    strategies = {x["strategy"] for x in r["rows"]}
    assert strategies == {
        "device-only",
        "edge-only",
        "fixed-split",
        "vlarun-placement",
        "vlarun-joint",
    }
    assert all(set(x) >= ROW_KEYS for x in r["rows"])
    heavy = [x for x in r["rows"] if x["load"] == "heavy"]
    assert all(x["load_robots"] == 2 and x["background_requests"] > 0 for x in heavy)
    assert len(r["matrix"]["cells"]) == 4 and r["plot"].endswith(".png")


def test_matrix_summary_on_hand_built_rows():
    from vlarun.bench.coinfer_matrix import parse_bandwidth, summarise_matrix

    def row(strategy, apj, slo):
        return {
            "strategy": strategy,
            "bandwidth": "50",
            "load": "light",
            "actions_per_joule": apj,
            "slo_met_fraction": slo,
        }

    rows = [
        row("device-only", 1.0, 1.0),
        row("edge-only", 3.0, 0.9),
        row("fixed-split", 2.0, 1.0),
        row("vlarun-placement", 2.5, 1.0),
        row("vlarun-joint", 2.0, 1.0),
    ]
    s = summarise_matrix(rows)
    (cell,) = s["cells"]
    # edge-only has more actions/J but misses the SLO bar: the best fixed is fixed-split.
    assert cell["best_fixed"] == "fixed-split" and cell["joint_over_best_fixed"] == 1.0
    assert cell["joint_meets_goal"] and s["cells_meeting_goal"] == 1
    assert s["joint_over_fixed_split_mean"] == 1.0 and s["joint_over_placement_mean"] == 0.8
    assert parse_bandwidth("200-50") == (200.0, 50.0) and parse_bandwidth("10") == (10.0, None)
    with pytest.raises(ValueError, match="expected Mbit/s"):
        parse_bandwidth("fast")


def test_prediction_error_counts_only_requests_that_ran_their_plan():
    from vlarun.sched.records import prediction_error, summarise

    def row(pred_ms, real_ms, pred_j, real_j, fallback=None):
        return {
            "predicted_ms": pred_ms,
            "latency_ms": real_ms,
            "predicted_j": pred_j,
            "energy_j": real_j,
            "fallback": fallback,
            "slo_met": True,
            "ran": "a@edge",
        }

    rows = [row(100, 80, 2.0, 2.5), row(90, 100, 3.0, 3.0), row(50, 400, 1.0, 9.0, "link")]
    err = prediction_error(rows)
    assert err["predicted_requests"] == 2
    assert abs(err["latency_mape_pct"] - 17.5) < 1e-9  # (25% + 10%) / 2; the fallback left out
    assert abs(err["energy_mape_pct"] - 10.0) < 1e-9
    assert prediction_error([row(None, 80, None, 2.0)])["latency_mape_pct"] is None
    summary = summarise(rows, 4)
    assert summary["latency_mape_pct"] == err["latency_mape_pct"]
    late = [*rows, {**row(100, 250, 2.0, 2.0), "slo_met": False}]  # the edge answered late
    assert summarise(rows, 4)["late_edge_answers"] == 0
    assert summarise(late, 4)["late_edge_answers"] == 1


def test_emulated_options_are_checked_before_anything_starts():
    """--utilisations needs the emulated edge's times; the pins and the scale follow --emulate."""
    from vlarun.bench.coinfer import BenchCoinferOptions, _pins, _scale, run

    with pytest.raises(ValueError, match="give --emulate"):
        run(BenchCoinferOptions(utilisations=(0.5,)))
    with pytest.raises(ValueError, match="shares in"):
        run(BenchCoinferOptions(emulate="openvla-7b", utilisations=(2.0,)))
    plain = BenchCoinferOptions(time_scale=0.3)
    emulated = BenchCoinferOptions(emulate="openvla-7b", time_scale=0.3)
    assert _scale(plain) == 1.0 and _scale(emulated) == 0.3 and _pins(plain) == {}
    pins = _pins(emulated)
    if len(os.sched_getaffinity(0)) >= 2:  # the edge alone on one CPU, everything else on another
        assert pins["edge"].isdisjoint(pins["robot"]) and pins["relay"] == pins["robot"]
    assert _pins(BenchCoinferOptions(emulate="openvla-7b", pin=False)) == {}


def test_matrix_intervals_resample_each_rows_requests():
    """With per-request energies in the rows' traces, each cell's joint / best-fixed ratio gets
    a bootstrap interval, judged only where it is tight; the oracle and feasibility per cell."""
    from vlarun.bench.coinfer_matrix import ratio_interval, summarise_matrix

    def row(strategy, joules, slo=1.0):
        trace = [[0.0, 100.0, "x@edge", None, False, j, True] for j in joules]
        return {
            "strategy": strategy,
            "bandwidth": "50",
            "load": "none",
            "slo_met_fraction": slo,
            "actions_per_joule": 4 * len(joules) / sum(joules),
            "trace": trace,
        }

    steady = [10.0, 10.1, 9.9, 10.0] * 10
    rows = [
        row("device-only", [5.0] * 40, slo=0.0),
        row("edge-only", [20.0] * 40),
        row("fixed-split", steady),
        row("vlarun-placement", steady),
        row("vlarun-joint", [x / 2 for x in steady]),
    ]
    (cell,) = summarise_matrix(rows)["cells"]
    lo, hi = cell["joint_over_best_fixed_ci95"]
    assert lo < 2.0 < hi and hi - lo < 0.1 and cell["judged"]
    assert cell["oracle"] == "vlarun-joint" and cell["feasible"]
    noisy = row("vlarun-joint", [1.0, 30.0] * 5)
    lo, hi = ratio_interval(noisy, rows[2])
    assert hi - lo > 0.5  # a few erratic requests: too wide to judge
    assert ratio_interval({"trace": []}, rows[2]) is None
    s = summarise_matrix(rows)
    assert s["joint_over_fixed_split_geomean"] == pytest.approx(2.0)


def test_the_utilisation_plot_draws_each_run(tmp_path):
    from vlarun.bench.coinfer import plot_utilisation

    runs = [
        {
            "measured_utilisation": u,
            "target_utilisation": u + 0.1,
            "robots": 8,
            "latency_mape_pct": 5.0 * u,
            "energy_mape_pct": None,
        }
        for u in (0.3, 0.6)
    ]
    png = tmp_path / "u.png"
    assert plot_utilisation({"fleet": {"utilisation": runs}}, str(png)) == str(png)
    assert png.stat().st_size > 0


@pytest.mark.slow
def test_bench_coinfer_quick_utilisation_json(capsys, tmp_path):
    """One vlarun robot, measured, through its own shaped link, beside open-loop robots (a
    process of their own; --quick keeps 2 robots in all): their counts, its per-request rows,
    the edge's utilisation."""
    out = tmp_path / "u.json"
    argv = [
        "bench",
        "coinfer",
        "--quick",
        "--utilisations",
        "0.5",
        "--emulate",
        "openvla-7b",
        "--robot-device",
        "orin-agx-32gb",
        "--edge-device",
        "rtx4090",
        "--time-scale",
        "0.3",
        "--control-hz",
        "1.2",
    ]
    assert main([*argv, "--json", "--out", str(out)]) == 0
    r = json.loads(capsys.readouterr().out)
    (u,) = r["fleet"]["utilisation"]
    assert u["measured_robots"] == 1 and u["background"]["robots"] == u["robots"] - 1 >= 1
    assert u["background"]["sent"] >= 2
    assert u["background"]["answered"] + u["background"]["late"] == u["background"]["sent"]
    assert len(u["requests"]) == 4 and 0 < u["measured_utilisation"] < 1
    assert all(x["link_mbps"] < 100 for x in u["requests"])  # the shaped 60, not loopback's


def test_restore_runs_are_summarised_per_shift_on_the_emulated_clock():
    from vlarun.bench.coinfer import restore_summary

    def row(again, handoffs):
        return {
            "link_timeline": {
                "drop_s": 25.0,
                "restore_s": 50.0,
                "left_edge_after_drop_ms": 2000.0,
                "edge_again_after_restore_ms": again,
                "handoffs": handoffs,
            }
        }

    s = restore_summary([row(1400.0, 0), row(900.0, 1)], (0.0, 1.0), 0.3)
    assert s["edge_again_after_restore_ms"] == 1400.0  # the first run's, as before
    assert [r["shift_s"] for r in s["runs"]] == [0.0, 1.0]
    assert s["runs"][1]["edge_again_after_restore_emulated_ms"] == pytest.approx(270.0)
    assert s["worst_edge_again_emulated_ms"] == pytest.approx(420.0) and s["handoffs"] == 1
    never = restore_summary([row(None, 0)], (0.0,), 1.0)
    assert never["worst_edge_again_emulated_ms"] is None
