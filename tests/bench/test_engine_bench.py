"""The engine benchmark runs end to end on the tiny shape and reports an honest comparison."""

import json

import pytest

pytest.importorskip("transformers")

from vlarun.bench import engine  # noqa: E402
from vlarun.models.device import bf16_is_fast  # noqa: E402

CASE_KEYS = {
    "name": str,
    "dtype": str,
    "params": int,
    "prefill_tokens": int,
    "prefill_ms_vlarun": float,
    "prefill_ms_hf": float,
    "prefill_speedup": float,
    "decode_ms_per_token_vlarun": float,
    "decode_ms_per_token_hf": float,
    "decode_speedup": float,
    "prefill_gflops": float,
    "peak_gflops": float,
    # This machine's two limits, for each phase, beside the ratios to transformers.
    "prefill_peak_fraction": float,
    "prefill_floor_fraction": float,
    "decode_peak_fraction": float,
    "decode_floor_fraction": float,
    "mem_read_gbs": float,
    "tokens_match": bool,
}


@pytest.fixture(scope="module")
def tiny_result() -> dict:
    # Few repetitions: this checks the schema and honesty; the speed is the benchmark's job.
    return engine.run(quick=True, shapes=("tiny",), repeats=2, warmup=0)


def test_schema_and_honesty(tiny_result):
    result = json.loads(json.dumps(tiny_result))  # must be JSON-serialisable as is
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["threads"] == machine["cores"]
    assert machine["torch"] and machine["date"] and machine["cpu"]
    cases = result["cases"]
    ran = {(c["name"], c["dtype"]) for c in cases}
    skipped = {(s["shape"], s["dtype"]) for s in result["skipped"]}
    # bf16 is skipped exactly where this CPU emulates it (then the result says why).
    assert ran | skipped == {("tiny", "bf16"), ("tiny", "fp32")} and not ran & skipped
    assert ("tiny", "fp32") in ran
    assert (("tiny", "bf16") in skipped) == (not bf16_is_fast())
    for case in cases:
        for key, kind in CASE_KEYS.items():
            assert isinstance(case[key], kind), (key, case[key])
        for key in (
            "prefill_ms_vlarun",
            "prefill_ms_hf",
            "decode_ms_per_token_vlarun",
            "decode_ms_per_token_hf",
            "prefill_gflops",
            "peak_gflops",
            "mem_read_gbs",
            "prefill_peak_fraction",
            "prefill_floor_fraction",
            "decode_peak_fraction",
            "decode_floor_fraction",
        ):
            assert case[key] > 0, (key, case[key])
        assert case["prefill_ms_vlarun_p90"] >= case["prefill_ms_vlarun"]
        # (The speedups are the producer's own division; restating it here could not fail.
        # What can: both engines timed the same computation, checked below by the tokens.)
        assert case["decode_hf_variant"] in case["hf_variants"]
        assert case["params"] == engine.SHAPES["tiny"].num_params()
        # Same weights, same greedy tokens: the speed comparison is between equal computations.
        check = ("logits_err_vlarun", "logits_err_hf", "logits_tolerance", "tokens")
        assert case["tokens_match"], {k: case[k] for k in check}
        if case["dtype"] == "fp32":
            assert case["logits_err_vlarun"] <= 1e-3
        assert len(case["tokens"]["vlarun"]) == engine.DECODE_TOKENS + 1


def test_int8_runner_is_timed_beside_the_float_one(tiny_result):
    for case in tiny_result["cases"]:
        q = case["int8"]
        assert q["decode_ms_per_token"] > 0 and q["prefill_ms"] > 0
        assert 0 <= q["tokens_agree"] <= q["tokens"] == engine.DECODE_TOKENS + 1
        # Its floor reads fewer bytes than the float model's: the int8 layers are 1 byte each.
        assert q["decode_bytes_per_token"] < case["decode_bytes_per_token"]
        assert "vlarun-int8" not in case["hf_variants"]  # never compared as transformers


def test_a_compiled_runner_runs_the_model_s_decode_steps(monkeypatch):
    """compiled=True (full runs) adds vlarun with the fused decode step: here swapped for a
    counted eager step (the inductor compile itself: tests/models/test_fused_steps.py), so
    the case checks it is the step that runs, timed and compared with eager's tokens."""
    from vlarun.models.static_step import DecodeSteps, decode_one

    calls = []

    def counted(*args):
        calls.append(1)
        return decode_one(*args)

    monkeypatch.setattr(
        "vlarun.models.static_step.compile_steps",
        lambda mode, denoise=False: DecodeSteps(one=counted, mode=mode),
    )
    case = engine.bench_case("tiny", "fp32", repeats=1, warmup=0, compiled=True)
    c = case["compiled"]
    assert calls and c["mode"] == "fused" and c["decode_ms_per_token"] > 0
    assert c["tokens_agree"] == engine.DECODE_TOKENS + 1  # the same step, eagerly: identical
    assert "vlarun-fused" not in case["hf_variants"]
    assert "x eager" in engine.format_table({"machine": _machine(), "cases": [case]})


def _machine() -> dict:
    return {
        "cpu": "c",
        "threads": 1,
        "torch": "t",
        "transformers": "t",
        "omp_wait_policy": None,
        "date": "d",
    }


def test_int8_decode_bytes_are_the_twins_own():
    import torch

    from vlarun.transforms.int8 import int8_layers

    cfg = engine.SHAPES["tiny"]
    hf, ours = engine.build_pair(cfg, torch.float32)
    twin = engine.int8_twin(hf, cfg, torch.float32)
    layers = int8_layers(twin)
    assert len(layers) == 7 * cfg.num_layers  # q, k, v, o, gate, up, down in every layer
    int8 = sum(m.weight_int8.numel() + 4 * m.scale.numel() for m in layers.values())
    as_float = 4 * sum(m.weight_int8.numel() for m in layers.values())
    saved = engine.decode_bytes_per_token(cfg, torch.float32, 10) - engine.int8_decode_bytes(
        cfg, torch.float32, 10
    )
    assert saved == as_float - int8
    ids = torch.randint(0, cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():  # close to the float model (per-channel int8 of std-0.02 weights)
        a = ours.logits(ours(ours.embed(ids)).hidden)
        b = twin.logits(twin(twin.embed(ids)).hidden)
    # Four quantised layers: ~0.9% of the logits' spread on average, the worst of 384,000
    # logits 5-6% (three seeds); a wrong scale is ~100%.
    err = (a - b).abs()
    assert err.mean() < 0.03 * a.std() and err.max() < 0.15 * a.std()


def test_table_renders_every_case(tiny_result):
    table = engine.format_table(tiny_result)
    rows = [line for line in table.splitlines() if line.startswith("| tiny")]
    assert len(rows) == len(tiny_result["cases"])
    assert "tokens match" in table
    for s in tiny_result["skipped"]:
        assert f"Skipped: tiny {s['dtype']}" in table


def test_unknown_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown shape"):
        engine.make_plan(quick=True, shapes=("huge",))


def test_limit_fractions_against_hand_numbers():
    # 2 GFLOP in 20 ms is 100 GFLOP/s: a quarter of a 400 GFLOP/s peak.
    assert engine.limit_fractions(2e9, 1e9, 20.0, 400.0, 10.0)["peak_fraction"] == pytest.approx(
        0.25
    )
    # 1 GB at 10 GB/s takes 100 ms: a 400 ms step is at a quarter of that floor.
    assert engine.limit_fractions(2e9, 1e9, 400.0, 400.0, 10.0)["floor_fraction"] == (
        pytest.approx(0.25)
    )


def test_decode_bytes_are_weights_plus_kv():
    cfg = engine.SHAPES["tiny"]
    one = engine.decode_bytes_per_token(cfg, engine.DTYPES["bf16"], context=1)
    two = engine.decode_bytes_per_token(cfg, engine.DTYPES["bf16"], context=2)
    # One more cached position adds its K and V in every layer, 2 bytes each.
    assert two - one == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.hd * 2
    assert one > 2 * (cfg.num_params() - 2 * cfg.vocab_size * cfg.hidden_size)


def test_profile_names_where_each_runner_spends_its_time():
    """`bench engine --profile` at the tiny shape: both runners' prefill and decode are
    profiled, their matmuls found under either kernel's name (vlarun's prepacked oneDNN
    linears are not aten ops), and the kinds add up to no more than the profiled wall time."""
    from vlarun.bench.engine import format_profile, profile_case

    p = profile_case("tiny", "fp32", top=5)
    assert set(p["runners"]) == {"vlarun", "hf-static"}
    for phases in p["runners"].values():
        for v in phases.values():
            kinds = v["self_ms_by_kind"]
            assert kinds.get("matmul", 0) > 0, kinds
            assert sum(kinds.values()) <= v["wall_ms"] * 1.05 + 1.0
            assert len(v["top_ops"]) == 5
    assert "| vlarun | prefill |" in format_profile(p)
