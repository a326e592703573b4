"""`vlarun bench accel --quick` on the tiniest setting: one task, one short episode."""

import json

import pytest

from vlarun.bench.accel import BenchAccelOptions, format_result, run

pytest.importorskip("metaworld")


def test_quick_bench_writes_every_field(tmp_path):
    o = BenchAccelOptions(
        quick=True,
        tasks="reach-v3",
        episodes=1,
        max_steps=8,
        budgets="0.34",
        methods="triage",
        latency_queries=2,
        large=False,
        out=str(tmp_path),
    )
    r = run(o, progress=False)
    assert {"method", "budget_fraction", "success_rate", "ci95", "action_error"} <= set(
        r["sweep"][1]
    )
    assert [s["method"] for s in r["sweep"]] == ["full", "triage"]
    assert {"method", "flops_ratio", "prefill_ms", "e2e_ms", "p99_ms"} <= set(r["latency"][0])
    assert {x["method"] for x in r["latency"]} >= {"full", "triage", "efficientvla"}
    assert next(x for x in r["latency"] if x["method"] == "full")["flops_ratio"] == 1.0
    configs = [a["config"] for a in r["ablation"]]
    assert configs == ["none", "tokens", "cache", "layers", "mlp", "all"]
    with open(r["files"]["json"]) as f:
        assert json.load(f)["sweep"] == r["sweep"]
    assert "| triage |" in format_result(r)
    assert {"json", "plot", "latency_plot"} <= set(r["files"])


def test_large_shape_latency_rows_run_with_a_small_lm():
    """The ~1B row's code path (224 px, 256 visual tokens, AR head) with a 2-layer LM."""
    from vlarun.bench.accel import large_policy, latency_rows, synthetic_stream
    from vlarun.models.llama import LlamaConfig

    llm = LlamaConfig(
        vocab_size=32064,
        hidden_size=128,
        intermediate_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        max_positions=512,
    )
    policy = large_policy(llm)
    assert policy.model.cfg.num_visual == 256
    stream = synthetic_stream(224, 2, "pick up the cube")
    rows = latency_rows("small", policy, stream, 0.34, lambda m: None)
    assert [r["method"] for r in rows][:2] == ["full", "triage"]
    assert all(r["queries"] == 2 and r["p99_ms"] > 0 for r in rows)
    assert next(r for r in rows if r["method"] == "triage")["flops_ratio"] < 1.0


def test_large_dit_shape_times_efficientvla_parts_with_a_small_lm():
    """The table's ~1B CogACT-like row (a DiT head) with a 12-layer toy LM: every part builds,
    calibrated on the synthetic frames, and the all-on configuration does fewer FLOPs."""
    from vlarun.bench.accel import large_label, large_policy, synthetic_stream, time_streams
    from vlarun.bench.accel_table import _large_candidate
    from vlarun.models.llama import LlamaConfig

    llm = LlamaConfig(
        vocab_size=32064,
        hidden_size=128,
        intermediate_size=256,
        num_layers=12,
        num_heads=4,
        num_kv_heads=2,
        max_positions=512,
    )
    big = large_policy(llm, family="diffusion", dit_size="DiT-S")
    assert big.model.cfg.family == "diffusion" and "-dit (random, " in large_label(big)
    stream = synthetic_stream(224, 2, "pick up the cube")
    calib = [(big.image_tensor(f), big.text_ids(ins)) for ins, f, _ in stream]
    specs = ["full", "evla:all", "evla:mlp-activation", "evla:all-but-mlp"]
    rows = time_streams([_large_candidate(big, s, calib) for s in specs], stream)
    assert rows[0]["flops_ratio"] == 1.0 and rows[1]["flops_ratio"] < 0.6
    # Without the MLP part (and with 2 layers, not 4) it keeps more of the work than all-on.
    assert rows[1]["flops_ratio"] < rows[3]["flops_ratio"] < 1.0
    assert all(r["e2e_ms"] > 0 for r in rows)


def test_triage_lead_is_paired_per_budget():
    from vlarun.bench.accel_table import triage_leads

    def row(config, outcomes):
        return {"group": "tokens", "config": config, "outcomes": outcomes}

    rows = [
        row("full", [1, 1, 1, 1]),
        row("triage:0.07", [1, 1, 0, 1]),
        row("fastv:0.07", [0, 1, 0, 0]),
        row("fastv:0.34", [1, 1, 1, 1]),
    ]
    triage_leads(rows, 200)
    lead = rows[2]["triage_lead"]
    assert lead["difference"] == 0.5 and lead["only_other"] == 2 and lead["only_base"] == 0
    assert "triage_lead" not in rows[3]  # no TRIAGE at 34% to pair with
    assert "triage_lead" not in rows[0] and "triage_lead" not in rows[1]


def test_part_runs_get_their_own_file_and_the_command_line(tmp_path, monkeypatch):
    """A sweep-only run must not overwrite a later latency-only run's file (and vice versa),
    and the result names the command line that produced it."""
    import sys

    from vlarun.bench.accel import write_results

    monkeypatch.setattr(sys, "argv", ["/x/.venv/bin/vlarun", "bench", "accel", "--parts", "sweep"])
    from vlarun.config import invoked_command

    assert invoked_command("fallback") == "vlarun bench accel --parts sweep"
    base = {"quick": False, "date": "2026-11-30T06:00", "sweep": [], "latency": []}
    a = write_results(base | {"options": {"parts": "sweep"}}, tmp_path)
    b = write_results(base | {"options": {"parts": "latency,ablation"}}, tmp_path)
    c = write_results(base | {"options": {"parts": "sweep,latency,ablation"}}, tmp_path)
    assert a["json"].endswith("accel_sweep_2026-11-30.json")
    assert b["json"].endswith("accel_latency-ablation_2026-11-30.json")
    assert c["json"].endswith("accel_2026-11-30.json")
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert invoked_command("fallback") == "fallback"


def test_table_pairs_every_row_with_full_and_writes_a_settings_file_plan_reads(tmp_path):
    """The paired table on the tiny policies: every row runs full compute's episodes, its
    difference is the paired one, fidelity is measured on full's recorded observations, and
    the settings file it writes is read by the plan space with an accuracy floor."""
    from vlarun.sched.plans import setting_grid
    from vlarun.sched.settings_table import load_settings

    o = BenchAccelOptions(
        table=True,
        policy="tiny-oft",
        ar_policy="tiny-ar",
        tasks="reach-v3",
        episodes=2,
        max_steps=8,
        configs="triage:0.34,int8,exit:0.5",
        workers=1,
        latency_queries=3,
        large=False,
        bootstrap=200,
        out=str(tmp_path),
    )
    r = run(o, progress=False)
    rows = {(x["group"], x["config"]): x for x in r["table"]}
    assert set(rows) == {
        ("tokens", "full"),
        ("tokens", "triage:0.34"),
        ("tokens", "int8"),
        ("decode", "full"),
        ("decode", "exit:0.5"),
    }
    for x in rows.values():
        d = x["difference"]
        assert x["episodes"] == d["episodes"] == 2
        full = rows[(x["group"], "full")]
        assert d["difference"] == pytest.approx(x["success_rate"] - full["success_rate"])
        assert set(x["tasks"]) == {"reach-v3"}
    assert len(rows[("tokens", "full")]["keys"]) == 2
    assert all(len(x["outcomes"]) == 2 for x in rows.values())
    triage = rows[("tokens", "triage:0.34")]
    assert triage["action_error"] > 0 and triage["flops_ratio"] < 1.0
    assert 0.0 <= triage["reused_share"] <= 1.0
    assert rows[("tokens", "full")]["action_error"] == 0.0
    assert rows[("tokens", "int8")]["action_error"] > 0  # the int8 weights ran, not full's
    assert {t["config"] for t in r["timing"]} == {"full", "triage:0.34", "int8", "exit:0.5"}
    text = format_result(r)
    assert "| tokens | triage:0.34 |" in text and "paired diff" in text
    settings = load_settings(r["files"]["settings"])
    measured = [s for s in settings if s.source != "identity"]
    assert {(s.knob, s.value) for s in measured} <= {
        ("token_budget", 0.34),
        ("weights", "int8"),
        ("early_exit_sigma", 0.5),
    }
    for s in measured:
        assert s.lower <= s.relative_success <= s.upper
    grid, _ = setting_grid("parallel", settings, measured[0].models[0] if measured else None)
    assert grid
    with pytest.raises(ValueError, match="unknown method"):
        run(BenchAccelOptions(table=True, configs="nope:0.3", workers=1, out=None), progress=False)
