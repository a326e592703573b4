"""`vlarun bench roofline`: every stage of a policy against this machine's roofline, with the
cost model's FLOPs and bytes, eager and compiled side by side. Nothing here asserts a timing:
the machine running the tests is shared."""

import contextlib
import io
import json

import pytest

from vlarun.cli import main


@pytest.fixture(scope="module")
def tiny_ar(tmp_path_factory):
    """One `--json --plot` run of tiny-ar through the command line, with the compiled steps
    swapped for counted eager ones (the inductor compile itself is tested with the steps,
    tests/models/test_static_step.py): (report, decode steps run compiled, plot path)."""
    from vlarun.models.static_step import DecodeSteps, decode_one

    calls = []

    def counted(*args):
        calls.append(1)
        return decode_one(*args)

    plot = tmp_path_factory.mktemp("roofline") / "roofline.png"
    argv = [
        "bench",
        "roofline",
        "--policy",
        "tiny-ar",
        "--repeats",
        "1",
        "--threads",
        "1",
        "--plot",
        str(plot),
        "--json",
    ]
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(
            "vlarun.models.static_step.compile_steps",
            lambda mode, denoise=True: DecodeSteps(one=counted, mode=mode),
        )
        assert main(argv) == 0
    return json.loads(out.getvalue()), len(calls), plot


def test_every_stage_has_the_cost_model_s_flops_and_bytes(tiny_ar):
    from vlarun.apps.model import InfoOptions, cmd_info

    r, _, _ = tiny_ar
    info = cmd_info(InfoOptions(model="tiny-ar", text_tokens=r["text_tokens"], dtype="float32"))
    assert [s["name"] for s in r["stages"]] == [s["name"] for s in info["stages"]]
    assert [s["name"] for s in r["stages"]] == ["vision", "prefill", "decode"]
    for got, want in zip(r["stages"], info["stages"], strict=True):
        assert (got["flops"], got["bytes"]) == (want["flops"], want["bytes"]), got["name"]
    end = r["end_to_end"]
    assert end["flops"] == sum(s["flops"] for s in info["stages"])
    assert end["bytes"] == sum(s["bytes"] for s in info["stages"])


def test_the_roofline_is_the_slower_of_compute_and_memory_at_the_measured_peaks(tiny_ar):
    r, _, _ = tiny_ar
    assert r["peak_gflops"] > 0 and r["bandwidth_gbs"] > 0
    for s in r["stages"]:
        compute = s["flops"] / (r["peak_gflops"] * 1e9) * 1e3
        memory = s["bytes"] / (r["bandwidth_gbs"] * 1e9) * 1e3
        assert s["roofline_ms"] == pytest.approx(max(compute, memory))
        assert s["bound"] == ("compute" if compute >= memory else "memory")
        assert s["eager"]["ms"] > 0 and s["eager"]["ratio"] > 0
        assert s["eager"]["gflops"] > 0 and s["eager"]["gbs"] > 0
    end = r["end_to_end"]
    assert end["roofline_ms"] == pytest.approx(sum(s["roofline_ms"] for s in r["stages"]))
    assert end["eager"]["ratio"] > 0 and end["compiled"]["ratio"] > 0


def test_only_a_stage_with_a_compiled_step_gets_a_compiled_column(tiny_ar):
    r, decode_steps, _ = tiny_ar
    by_name = {s["name"]: s for s in r["stages"]}
    assert by_name["decode"]["compiled_step"] == "static_step.decode_one"
    assert by_name["decode"]["compiled"]["ratio"] > 0
    assert by_name["prefill"]["compiled_step"] == "static_step.prefill_forward"
    assert by_name["vision"]["compiled_step"] == "eager only"
    assert by_name["vision"]["compiled"] is None
    assert decode_steps > 0  # the compiled variant ran the swapped-in steps
    assert r["compile"]["ran"] and r["compile"]["max_action_diff"] == 0.0  # greedy: same tokens


def test_the_report_round_trips_through_json_and_prints(tiny_ar, capsys):
    from vlarun.bench.roofline import show

    r, _, plot = tiny_ar
    assert json.loads(json.dumps(r)) == r
    show(r)
    out = capsys.readouterr().out
    assert r["cpu"] in out and "AVX" in r["cpu"] and "AMX" in r["cpu"]
    assert all(s["name"] in out for s in r["stages"]) and "eager only" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_stage_without_a_compiled_step_says_eager_only():
    """OFT: its vision has no compiled step; its one head stage compiles the prefill (the
    parallel head pass stays eager) and says so. --no-compiled: every stage eager only."""
    from vlarun.bench.roofline import BenchRooflineOptions, run

    r = run(BenchRooflineOptions(policy="tiny-oft", repeats=1, threads=1, compiled=False))
    assert [s["name"] for s in r["stages"]] == ["vision", "prefill_head"]
    assert all(s["compiled"] is None for s in r["stages"])
    assert not r["compile"]["ran"] and r["end_to_end"]["compiled"] is None
    assert r["stages"][0]["compiled_step"] == "eager only"
    assert r["stages"][1]["compiled_step"].startswith("static_step.prefill_forward")
    assert r["compile"]["note"] == "not asked (--no-compiled)"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--policy", "no-such-policy"], "'no-such-policy'"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--threads", "-1"], "--threads must be >= 0"),
        (["--setting", "triage:2"], "token_budget must be in (0, 1]"),
    ],
)
def test_bad_options_fail_in_one_line_naming_them(capsys, argv, needle):
    assert main(["bench", "roofline", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_a_setting_runs_the_accelerated_policy_against_the_full_model_s_roofline():
    """--setting int8: the quantised model runs (its layers are Int8Linear), the roofline and
    the stage costs stay the full-compute model's, and the report names the setting."""
    from vlarun.bench import roofline
    from vlarun.bench.roofline import BenchRooflineOptions, run
    from vlarun.transforms.int8 import int8_layers

    ran = []
    measure = roofline.measure

    def spy(policy, obs, repeats, compiled_steps=None):
        ran.append(len(int8_layers(policy.model)))
        return measure(policy, obs, repeats, compiled_steps)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(roofline, "measure", spy)
        plain = run(BenchRooflineOptions(policy="tiny-ar", repeats=1, threads=1, compiled=False))
        q = run(
            BenchRooflineOptions(
                policy="tiny-ar", repeats=1, threads=1, compiled=False, setting="int8"
            )
        )
    assert ran[0] == 0 and ran[1] > 0
    assert plain["setting"] == "plain" and q["setting"] == "int8"
    assert [s["flops"] for s in q["stages"]] == [s["flops"] for s in plain["stages"]]


def test_llm_layers_runs_a_preset_at_fewer_layers_of_the_same_shape():
    """--llm-layers: the preset's LM with fewer decoder layers (a model too large for the
    machine, per layer): the costed prefill shrinks with the depth, the report says of how many;
    a shipped policy (trained weights) or a depth out of range is refused in one line."""
    from vlarun.bench.roofline import BenchRooflineOptions, run
    from vlarun.models.presets import get_preset
    from vlarun.policy.base import Policy

    whole = get_preset("tiny-openvla").llm.num_layers
    r = run(
        BenchRooflineOptions(
            policy="tiny-openvla", repeats=1, threads=1, compiled=False, llm_layers=1
        )
    )
    assert (r["llm_layers"], r["llm_layers_of"]) == (1, whole)
    full = run(BenchRooflineOptions(policy="tiny-openvla", repeats=1, threads=1, compiled=False))
    assert full["llm_layers_of"] is None and full["llm_layers"] == whole
    prefill = {x["name"]: x["flops"] for x in r["stages"]}["prefill"]
    assert prefill < {x["name"]: x["flops"] for x in full["stages"]}["prefill"]
    with pytest.raises(ValueError, match="keep 1..") as e:
        Policy.from_preset("tiny-openvla", llm_layers=whole + 1)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(ValueError, match="takes a preset"):
        run(BenchRooflineOptions(policy="checkpoints/tiny-ar", repeats=1, llm_layers=1))
