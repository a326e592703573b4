"""`vlarun bench hostile`: every attack, one row each: those on the openpi policy server and
the insecure edge (``bench.hostile``), those on an edge with authorized keys
(``bench.hostile_edge``). The two attack modules share their kit one way (hostile_edge reads
hostile's); the command that runs both lives here, above them."""

from __future__ import annotations

import json
import sys

from vlarun.bench.hostile import (
    EDGE_ATTACKS,
    SECURE_EDGE_ATTACKS,
    BenchHostileOptions,
    edge_attack,
    policy_attack,
)
from vlarun.bench.hostile_edge import secure_edge_attack
from vlarun.bench.hostile_local import LOCAL_ATTACKS, local_attack, show_rows


def run(o: BenchHostileOptions) -> dict:
    try:
        import openpi_client  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "bench hostile needs openpi-client: pip install --no-deps "
            "openpi-client websockets dm-tree"
        ) from None
    from vlarun.bench.engine import machine_info

    attacks = ("pipeline", "largest") if o.quick else o.attacks
    if o.quick:
        o = BenchHostileOptions(
            **{
                **o.__dict__,
                "seconds": min(o.seconds, 4.0),
                "rest_requests": min(o.rest_requests, 20),
            }
        )
    rows = []
    for name in attacks:
        if name in SECURE_EDGE_ATTACKS:
            new = secure_edge_attack(name, o)
        elif name in LOCAL_ATTACKS:
            new = [local_attack(name, o.policy)]
        else:
            new = [edge_attack(o) if name in EDGE_ATTACKS else policy_attack(name, o)]
        for row in new:
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)  # kept if a later one hangs
    return {
        "benchmark": "servers under attack (own processes, loopback)",
        "policy": o.policy,
        "frame_mb": o.frame_mb,
        "budget_s": o.budget_s,
        "cpu": machine_info()["cpu"],
        "rows": rows,
    }


def show(r: dict) -> None:
    print(
        f"{r['benchmark']}: {r['policy']}, frames {r['frame_mb']:g} MiB, budget "
        f"{r['budget_s']:g} s; {r['cpu']}"
    )
    print(
        "| attack | result | RSS idle / peak / after (MB) | back within 10% | "
        "legit p50 / p99 during (ms) | at rest | legit answered | alive |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for w in (w for w in r["rows"] if w.get("kind") != "local"):
        back = "never" if w["rss_back_s"] is None else f"{w['rss_back_s']:.1f} s"
        p50, p99 = w["legit_p50_ms"], w["legit_p99_ms"]
        during = "-" if p50 is None else f"{p50:.0f} / {p99:.0f}"
        print(
            f"| {w['attack']} | {w['result']} | {w['rss_idle_mb']:.0f} / "
            f"{w['rss_peak_mb']:.0f} / {w['rss_after_mb']:.0f} | {back} | {during} | "
            f"{w['rest_p50_ms']:.0f} / {w['rest_p99_ms']:.0f} | "
            f"{w['legit_answered']}/{w['legit_requests']} | {w['alive']} |"
        )
    show_rows([w for w in r["rows"] if w.get("kind") == "local"])


OPTIONS = {"bench-hostile": BenchHostileOptions}
RUN = {"bench-hostile": run}
SHOW = {"bench-hostile": show}
