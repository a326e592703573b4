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
