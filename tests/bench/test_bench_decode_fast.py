"""`vlarun bench decode --policy tiny-pi0-fast`: a preset's random weights, timed on synthetic
frames (no closed loop), its variable-length FAST codes counted query by query."""

from vlarun.bench.decode import BenchDecodeOptions, format_result, run


def test_a_fast_preset_is_timed_without_a_closed_loop():
    o = BenchDecodeOptions(policy="tiny-pi0-fast", distilled="", sigmas="0.5", queries=2, out=None)
    r = run(o, progress=False)
    rows = r["rows"]
    assert r["random_weights"]
    assert [x["method"] for x in rows] == ["ar", "jacobi", "jacobi-exit"]
    assert all(x["success_rate"] is None and x["episodes"] == 0 for x in rows)
    assert rows[1]["token_agreement_with_ar"] == 1.0  # plain Jacobi is greedy's code
    assert rows[1]["tokens_mean"] == rows[0]["tokens_mean"] <= r["max_tokens"]
    assert rows[1]["iterations_max"] <= rows[0]["iterations_max"]
    assert r["goals"]["success_within_3pp"] is None
    text = format_result(r)
    assert "random weights" in text and "| n/a |" in text and "at most 32" in text


def test_a_student_of_another_shape_is_not_compared():
    from vlarun.bench.decode import same_shape
    from vlarun.policy.base import Policy

    fast, pi0 = Policy.from_preset("tiny-pi0-fast"), Policy.from_preset("tiny-openvla")
    assert same_shape(fast, fast) and not same_shape(pi0, fast)
