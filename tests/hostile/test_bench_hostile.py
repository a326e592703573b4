"""`vlarun bench hostile`, quick: bad options fail in one line naming the valid ones, and one
short attack on a real `serve-policy` process yields a row with every field the security
page's table reads (the full battery: tests/hostile/test_attacks_slow.py, `make test-slow`)."""

from __future__ import annotations

import pytest

from vlarun.bench.hostile import ATTACKS, BenchHostileOptions, policy_attack
from vlarun.cli import main


def test_an_unknown_attack_fails_in_one_line_naming_the_valid_ones(capsys):
    assert main(["bench", "hostile", "--attacks", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nope'" in err[0] and all(a in err[0] for a in ATTACKS)


@pytest.mark.parametrize("bad", [{"frame_mb": 0.0}, {"rest_requests": 3}, {"seconds": 0}])
def test_bad_numbers_are_refused(bad):
    with pytest.raises(ValueError):
        BenchHostileOptions(**bad)


def test_half_open_connections_row():
    pytest.importorskip("openpi_client")
    row = policy_attack("half-open", BenchHostileOptions(seconds=1.0, rest_requests=10))
    assert row["alive"] and row["server_tracebacks"] == 0
    for key in (
        "rss_idle_mb",
        "rss_peak_mb",
        "rss_after_mb",
        "legit_p50_ms",
        "legit_p99_ms",
        "rest_p50_ms",
        "rest_p99_ms",
        "legit_answered",
        "healthz_max_ms",
    ):
        assert row[key] is not None, key
    assert row["rss_peak_mb"] >= row["rss_idle_mb"] * 0.9


def test_local_input_rows_through_the_command(capsys):
    """`bench hostile --attacks npy-liar png-bomb`: each bad file is run by a fresh vlarun
    process and its row says exit 2, one stderr line, no traceback, and its peak RSS; the
    table prints them apart from the servers'."""
    import json

    pytest.importorskip("openpi_client")
    assert main(["bench", "hostile", "--attacks", "npy-liar", "png-bomb", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["attack"] for r in rows] == ["npy-liar", "png-bomb"]
    for r in rows:
        assert r["kind"] == "local" and r["exit"] == 2 and r["stderr_lines"] == 1, r
        assert not r["traceback"] and 0 < r["peak_rss_mb"] < 500 and r["met"], r
    from vlarun.bench.attacks import show

    show(
        {
            "benchmark": "b",
            "policy": "tiny-ar",
            "frame_mb": 16,
            "budget_s": 5,
            "cpu": "c",
            "rows": rows,
        }
    )
    table = capsys.readouterr().out
    assert "| local input |" in table and "| npy-liar | 2 | 1 |" in table
