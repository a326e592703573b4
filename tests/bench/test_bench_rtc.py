"""`vlarun bench rtc --quick --json`: every method at two delays on one short episode of the
shipped chunked flow policy; the rows carry the keys the issue names."""

import json

import pytest

from vlarun.bench.rtc import METHODS, BenchRtcOptions, format_result, goals, row, run
from vlarun.cli import main

KEYS = {"method", "delay_steps", "success_rate", "jerk_p99", "stalls_per_episode"}


@pytest.mark.slow  # eight short closed-loop episodes: ~20 s on a quiet 2-core CPU, 40 s loaded
def test_quick_rows_carry_the_keys(capsys, tmp_path):
    pytest.importorskip("metaworld")
    argv = [
        "bench",
        "rtc",
        "--quick",
        "--max-steps",
        "16",
        "--workers",
        "1",
        "--out",
        str(tmp_path),
        "--json",
    ]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    rows = r["rows"]
    assert [(x["method"], x["delay_steps"]) for x in rows] == [
        (m, d)
        for d in (0, 4)
        for m in METHODS  # mt10p-flow: chunks of 8, so 0 and H / 2
    ]
    assert all(set(x) >= KEYS for x in rows) and r["quick"] and r["horizon"] == 8
    by = {(x["method"], x["delay_steps"]): x for x in rows}
    assert by[("rtc", 4)]["frozen_mean"] == 4  # d = the emulated delay, every request
    assert by[("naive", 4)]["frozen_mean"] is None
    # Waiting costs the robot its ticks (4 of start-up, then 4 per chunk of 8); the
    # asynchronous methods keep acting after start-up.
    assert by[("sync", 4)]["control_rate_hz"] == 20.0 * (16 - 8) / 16
    assert by[("naive", 4)]["control_rate_hz"] == 20.0 * (16 - 4) / 16
    assert by[("sync", 4)]["stall_ticks_per_episode"] >= 4
    assert all(x["stalls_per_episode"] == 0 for x in rows if x["method"] != "sync")
    assert by[("rtc", 4)]["paired_vs_sync"]["episodes"] == 1
    assert not list(tmp_path.iterdir())  # a quick run writes no result files
    assert "| rtc | 4 |" in format_result(r)


def _episode(success: bool, jerks: list[float], stalls: int = 0, task: str = "t", seed: int = 0):
    return {
        "task": task,
        "seed": seed,
        "success": success,
        "steps": 20,
        "seam_jerk": jerks,
        "stalls": stalls,
        "stall_ticks": 2 * stalls,
        "startup_ticks": 0,
        "skipped_actions": 0,
        "frozen": [],
    }


def test_rows_pair_on_seeds_and_goals_read_the_largest_delay():
    eps = {
        ("sync", 4): [_episode(True, [1.0], stalls=1, seed=s) for s in range(4)],
        ("naive", 4): [_episode(s < 2, [2.0, 4.0], seed=s) for s in range(4)],
        ("rtc", 4): [_episode(True, [0.5, 1.0], seed=s) for s in range(4)],
        ("sync", 0): [_episode(True, [1.0], seed=s) for s in range(4)],
    }
    rows = [row(m, d, eps, 20.0) for (m, d) in eps]
    naive = rows[1]
    assert naive["success_rate"] == 0.5 and naive["paired_vs_sync"]["difference"] == -0.5
    assert naive["jerk_mean"] == 3.0 and naive["stalls_per_episode"] == 0
    assert rows[0]["control_rate_hz"] == pytest.approx(20.0 * 18 / 20)  # 2 ticks held of 20
    assert rows[0]["paired_vs_sync"] is None
    g = goals(rows)
    assert g == {
        "delay_steps": 4,
        "rtc_within_5pp_of_sync": True,
        "naive_loses_15pp": True,
        "rtc_jerk_p99_le_half_naive": True,
    }


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="unknown methods"):
        BenchRtcOptions(methods=("sync", "wait"))
    with pytest.raises(ValueError, match="delays"):
        BenchRtcOptions(delays=(-1,))


def test_a_regressed_chunk_policy_is_refused():
    pytest.importorskip("metaworld")
    with pytest.raises(ValueError, match="real-time chunking needs"):
        run(BenchRtcOptions(policy="tiny-oft", quick=True), progress=False)
