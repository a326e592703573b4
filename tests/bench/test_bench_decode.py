"""`vlarun bench decode --quick` on the tiniest setting: one task, one short episode."""

import json
from pathlib import Path

import pytest

from vlarun.bench.decode import BenchDecodeOptions, format_result, run
from vlarun.cli import build_parser, command, resolve

pytest.importorskip("metaworld")
TINY_AR = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-ar"


def test_quick_bench_writes_every_field(tmp_path):
    if not (TINY_AR / "config.json").exists():
        pytest.skip("checkpoints/tiny-ar is not shipped in this checkout")
    # The teacher stands in for the distilled policy: this checks the code path, not results.
    o = BenchDecodeOptions(
        quick=True,
        distilled=str(TINY_AR),
        tasks="reach-v3",
        episodes=1,
        max_steps=8,
        sigmas="0.5",
        queries=2,
        out=str(tmp_path),
        exit_over="all,unsettled",
        max_iters=2,
        init="repeat",
        distilled_init="random",
    )
    r = run(o, progress=False)
    rows = r["rows"]
    assert [(x["method"], x["sigma"], x["exit_over"]) for x in rows] == [
        ("ar", None, None),
        ("jacobi", None, None),
        ("jacobi-exit", 0.5, "all"),
        ("jacobi-exit", 0.5, "unsettled"),
        ("distilled-exit", 0.5, "all"),
        ("distilled-exit", 0.5, "unsettled"),
        ("distilled", None, None),
    ]
    keys = {
        "method",
        "sigma",
        "tokens_per_s_mean",
        "tokens_per_s_min",
        "tokens_per_s_max",
        "control_rate_hz",
        "success_rate",
        "ci95",
        "iterations_mean",
        "speedup",
        "time_speedup",
    }
    assert all(keys <= set(x) for x in rows)
    assert rows[1]["token_agreement_with_ar"] == 1.0  # plain Jacobi is exact, never capped
    assert rows[1]["max_iters"] is None and rows[1]["iterations_max"] > 2
    assert rows[0]["init"] is None and all(x["init"] == "repeat" for x in rows[1:4])
    assert all(x["init"] == "random" for x in rows[4:])  # the distilled rows' own guess
    assert all(x["max_iters"] == 2 and x["iterations_max"] <= 2 for x in rows[2:6])
    assert rows[6]["token_agreement_with_ar"] == 1.0  # (the stand-in student is the teacher)
    assert rows[0]["speedup"] == 1.0 and rows[0]["iterations_mean"] == 15
    assert rows[0]["time_speedup"] == 1.0
    # Mean decode time and mean tokens/s are two views of the same per-query timings.
    assert all(x["decode_ms_mean"] >= 16e3 / x["tokens_per_s_mean"] * (1 - 1e-9) for x in rows)
    assert set(r["goals_by_exit_over"]) == {"all", "unsettled"}
    assert r["goals"] == r["goals_by_exit_over"]["all"]  # the first listed rule's
    assert r["goals_by_exit_over"]["unsettled"]["speedup"] == rows[5]["speedup"]
    assert set(r["goals"]) >= {
        "speedup_ge_4_5",
        "time_speedup_ge_3",
        "min_above_ar_mean",
        "success_within_3pp",
    }
    with open(r["files"]["json"]) as f:
        assert json.load(f)["rows"] == rows
    assert Path(r["files"]["plot"]).exists()
    assert "| jacobi-exit | 0.5 | unsettled |" in format_result(r)


@pytest.mark.parametrize("rules", ["", "all,all", "all,sometimes"])
def test_bad_exit_rules_are_named(rules):
    with pytest.raises(ValueError, match="exit_over"):
        BenchDecodeOptions(exit_over=rules)


@pytest.mark.parametrize("field", ["init", "distilled_init"])
def test_unknown_initial_guess_is_named(field):
    with pytest.raises(ValueError, match=field):
        BenchDecodeOptions(**{field: "zeros"})


def test_negative_iteration_cap_is_named():
    with pytest.raises(ValueError, match="max_iters"):
        BenchDecodeOptions(max_iters=-1)


def test_cli_registers_decode_and_distill():
    """Flags come from the option dataclasses (only these two commands' parsers are built, so
    the check does not depend on every other command importing)."""
    for argv, flag in ((["bench", "decode"], "--sigmas"), (["distill"], "--omega")):
        key, module, _ = resolve(argv)
        assert flag in build_parser(key, command(key, module)[0]).format_help()


def _univla(tmp_path, **kw) -> BenchDecodeOptions:
    """tiny-univla's random weights timed on two synthetic queries (no closed loop)."""
    return BenchDecodeOptions(
        policy="tiny-univla",
        distilled="",
        tasks="reach-v3",
        episodes=1,
        sigmas="0.5",
        queries=2,
        out=str(tmp_path),
        **kw,
    )


def test_bench_decode_times_the_univla_family_on_random_weights(tmp_path):
    """Issue 65, 3: UniVLA's family (VQ image ids, FAST action tokens) through the same bench:
    greedy, Jacobi (exact: every token agrees) and Jacobi + exit, labelled random weights."""
    r = run(_univla(tmp_path), progress=False)
    assert r["random_weights"] and r["max_tokens"] == 32
    rows = {x["method"]: x for x in r["rows"]}
    assert set(rows) == {"ar", "jacobi", "jacobi-exit"}
    assert rows["jacobi"]["token_agreement_with_ar"] == 1.0
    assert all(x["tokens_per_s_mean"] > 0 and x["success_rate"] is None for x in rows.values())


def test_a_preset_too_large_for_the_machine_runs_at_its_first_layers(tmp_path):
    """--llm-layers and --dtype shape a preset's random weights (speed only, labelled); on a
    trained policy they are refused in one line."""
    r = run(_univla(tmp_path, llm_layers=1, dtype="bfloat16"), progress=False)
    assert r["llm_layers"] == 1 and r["dtype"] == "bfloat16" and r["random_weights"]
    assert "1 LM layers in bfloat16" in format_result(r)
    if (TINY_AR / "config.json").exists():
        trained = BenchDecodeOptions(policy=str(TINY_AR), llm_layers=2, out=str(tmp_path))
        with pytest.raises(ValueError, match="shape a preset's random weights"):
            run(trained, progress=False)
