"""The servers as their own processes under `vlarun bench hostile`'s attacks, each asserting
the bounds docs/security.md states (marked slow: `make test-slow`). Loopback only; every
attack bounded in count and time; each starts and stops its own server. The attacks are the
benchmark's own (one of each): this checks what the table in docs/security.md reports.

Bounds: the server stays up and logs no traceback; peak RSS at most idle + the per-connection
cap x the connections the attack holds (+ a margin for the model's own working memory);
/healthz under 1 s throughout; a legitimate client answered (actions, or "busy" at once)
within the time budget; nothing from the server's internals reaches a client."""

from __future__ import annotations

import pytest

pytest.importorskip("openpi_client")

from vlarun.bench.hostile import BenchHostileOptions, edge_attack, policy_attack  # noqa: E402
from vlarun.runtime import openpi  # noqa: E402

pytestmark = pytest.mark.slow
O = BenchHostileOptions(frame_mb=2.0, budget_s=5.0, seconds=4.0, rest_requests=10)
PER_CONN_MB = openpi.ServeLimits(max_frame=int(O.frame_mb * 2**20)).per_connection_bytes / 2**20
MARGIN_MB = 96  # the model's activations, thread stacks, allocator slack
# connections each attack holds at once (+1: the legitimate client)
CONNECTIONS = {
    "pipeline": 6,
    "churn": 1,
    "flood16": 16,
    "flood50": openpi.ServeLimits().max_connections,
    "largest": 1,
    "half-open": 0,
    "fuzz": 1,
    "npscalar": 6,
    "key-hold": openpi.ServeLimits().max_connections // 2,
}


@pytest.mark.parametrize("attack", list(CONNECTIONS))
def test_serve_policy_holds_under(attack):
    row = policy_attack(attack, O)
    print(row)
    assert row["alive"] and row["server_tracebacks"] == 0, row
    bound = row["rss_idle_mb"] + (CONNECTIONS[attack] + 1) * PER_CONN_MB + MARGIN_MB
    assert row["rss_peak_mb"] <= bound, (row["rss_peak_mb"], bound)
    assert row["healthz_max_ms"] < 1000, row["healthz_max_ms"]
    # answered (actions or busy at once) within the budget, + 1 s for a loaded test machine
    assert row["legit_requests"] > 0 and row["legit_p99_ms"] < 1e3 * (O.budget_s + 1.0), row
    if attack == "fuzz":
        assert "0 leaked internals" in row["result"], row["result"]
    if attack == "key-hold":  # one key holds its share, never the other key's
        assert "16 held, 24 refused busy" in row["result"], row["result"]
        assert row["legit_answered"] == row["legit_requests"], row
    if attack == "npscalar":  # refused in one line or busy, never built and answered
        assert row["result"].endswith(" 0 answered"), row["result"]
        assert " 0 refused in one line" not in row["result"], row["result"]


def test_a_robot_keeps_its_share_of_the_edge_beside_16_flooding_identities():
    row = edge_attack(O)
    print(row)
    assert row["alive"] and row["server_tracebacks"] == 0, row
    assert row["legit_answered"] >= row["legit_fair_share"] - 1, row
