"""`vlarun bench accel --quick` on the tiniest setting: one task, one short episode."""

import json

import pytest

from vlarun.bench.accel import BenchAccelOptions, format_result, run

pytest.importorskip("metaworld")


def test_quick_bench_writes_every_field(tmp_path):
    o = BenchAccelOptions(quick=True, tasks="reach-v3", episodes=1, max_steps=8, budgets="0.34",
                          methods="triage", latency_queries=2, large=False,
                          out=str(tmp_path))  # fmt: skip
    r = run(o, progress=False)
    assert {"method", "budget_fraction", "success_rate", "ci95", "action_error"} <= set(
        r["sweep"][1]
    )
    assert [s["method"] for s in r["sweep"]] == ["full", "triage"]
    assert {"method", "flops_ratio", "prefill_ms", "e2e_ms", "p99_ms"} <= set(r["latency"][0])
    assert {x["method"] for x in r["latency"]} >= {"full", "triage", "efficientvla"}
    assert next(x for x in r["latency"] if x["method"] == "full")["flops_ratio"] == 1.0
    assert [a["config"] for a in r["ablation"]] == ["none", "tokens", "cache", "layers", "all"]
    with open(r["files"]["json"]) as f:
        assert json.load(f)["sweep"] == r["sweep"]
    assert "| triage |" in format_result(r)
