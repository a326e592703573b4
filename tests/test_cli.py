"""The command line: JSON contracts and one-line errors for bad input."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlarun.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "assets" / "demo_64.png")


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_openvla_7b_size_and_prefill_flops(capsys):
    r = run_json(capsys, "info", "--model", "openvla-7b")
    assert 7.4e9 < r["params"] < 7.6e9
    assert [s["name"] for s in r["stages"]] == ["vision", "prefill", "decode"]
    assert all(s["flops"] > 0 and s["bytes"] > 0 for s in r["stages"])
    assert 0.95 <= r["prefill_flops_vs_2_llm_params_tokens"] <= 1.05


@pytest.mark.parametrize(
    "preset,stages",
    [("pi0", ["vision", "prefill", "denoise"]), ("openvla-oft", ["vision", "prefill_head"])],
)
def test_info_other_families(capsys, preset, stages):
    r = run_json(capsys, "info", "--model", preset)
    assert [s["name"] for s in r["stages"]] == stages


@pytest.mark.parametrize("preset", ["tiny-openvla", "tiny-cogact"])
def test_act_prints_actions_and_stage_latency(capsys, preset):
    r = run_json(
        capsys,
        "act",
        "--policy",
        preset,
        "--image",
        DEMO,
        "--instruction",
        "open the drawer",
        "--repeats",
        "1",
    )
    assert np.asarray(r["actions"]).shape[1] == 7
    assert [s["name"] for s in r["stages"]][0] == "vision"
    assert all(s["median_ms"] > 0 for s in r["stages"])


def test_act_runs_under_an_accelerator_setting(capsys):
    """`act --setting int8` runs the quantised copy (its actions differ from the float
    model's, within int8's error) and says so; a bad setting fails before anything loads."""
    argv = ["act", "--policy", "tiny-openvla", "--image", DEMO, "--instruction", "open it"]
    plain = run_json(capsys, *argv, "--repeats", "1")
    q = run_json(capsys, *argv, "--repeats", "1", "--setting", "int8")
    assert plain["setting"] == "full" and q["setting"] == "int8"
    assert np.asarray(q["actions"]).shape == np.asarray(plain["actions"]).shape
    _one_line_error(capsys, [*argv, "--setting", "int9"], "int9")


def _one_line_error(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_bad_inputs_fail_with_one_clear_line(capsys, tmp_path):
    _one_line_error(capsys, ["info", "--model", "nope"], "nor a preset (openvla-7b")
    big = tmp_path / "big.png"
    Image.fromarray(np.zeros((100, 80, 3), np.uint8)).save(big)
    big_act = ["act", "--image", str(big), "--instruction", "x"]
    _one_line_error(capsys, big_act, "tiny-ar expects 1x128x128x3")
    npy = tmp_path / "f.npy"
    np.save(npy, np.zeros((64, 64, 3), np.float32))
    _one_line_error(capsys, ["act", "--image", str(npy), "--instruction", "x"], "uint8")
    long = ["act", "--image", DEMO, "--instruction", "go " * 100]
    _one_line_error(capsys, long, "tiny-ar allows 32")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    _one_line_error(
        capsys,
        ["act", "--image", DEMO, "--instruction", "x", "--policy", str(tmp_path)],
        "'bert' model",
    )
    _one_line_error(
        capsys,
        ["act", "--image", str(tmp_path / "none.png"), "--instruction", "x"],
        "does not exist",
    )


def test_resize_flag_accepts_other_sizes(capsys, tmp_path):
    big = tmp_path / "big.png"
    Image.fromarray(np.zeros((100, 80, 3), np.uint8)).save(big)
    r = run_json(
        capsys,
        "act",
        "--image",
        str(big),
        "--instruction",
        "x",
        "--resize",
        "--repeats",
        "1",
        "--policy",
        "tiny-openvla",  # one action per inference: the count below
    )
    assert len(r["actions"]) == 1


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "vlarun.cli", "info", "--model", "tiny-pi0", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["family"] == "flow"


def test_check_parity_json(capsys):
    r = run_json(capsys, "check-parity")
    assert r["ok"], [c for c in r["checks"] if not c["ok"]]
    names = " ".join(c["name"] for c in r["checks"])
    for needle in (
        "llama-mha",
        "llama-gqa",
        "siglip",
        "dinov2",
        "clip",
        "TokenPlan",
        "cached decode",
    ):
        assert needle in names


def test_check_parity_on_a_save_pretrained_directory(capsys, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    r = run_json(capsys, "check-parity", "--transformers-dir", str(tmp_path))
    assert r["ok"] and r["checks"][0]["max_abs_diff"] <= 1e-4


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_help_lists_every_command_without_importing_any():
    done = _python(
        "import sys\nfrom vlarun.cli import main\nmain(['--help'])\n"
        "heavy = ('torch', 'mujoco', 'metaworld', 'vlarun.sim.train')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr
    for name in ("info", "serve-edge", "bench coinfer", "calibrate-drift"):
        assert name in done.stdout


def test_info_works_without_mujoco_and_imports_only_its_command():
    # None in sys.modules makes `import mujoco` raise ImportError, as on a machine without it.
    done = _python(
        "import sys, json\nsys.modules['mujoco'] = None\nsys.modules['metaworld'] = None\n"
        "from vlarun.cli import main\n"
        "assert main(['info', '--model', 'openvla-7b', '--json']) == 0\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith('vlarun.apps')))"
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED ['vlarun.apps', 'vlarun.apps.model']" in done.stdout


def test_unknown_command_is_one_line_listing_the_valid_ones(capsys):
    assert main(["nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "valid: info, act" in err
    assert main(["bench", "nope"]) == 2
    assert "valid: engine, accel" in capsys.readouterr().err


def test_policy_names_resolve_to_shipped_policies_or_presets():
    from vlarun.policy import Policy

    assert Policy.load("tiny-ar").model.cfg.name == "tiny-ar"  # the shipped checkpoint
    assert Policy.load("tiny-oft").model.cfg.name == "tiny-oft"
    assert Policy.load("tiny-openvla-oft").norm is None  # a preset: random weights
    with pytest.raises(ValueError, match="shipped.*tiny-ar.*nor a preset.*openvla-7b"):
        Policy.load("no-such-policy")


def test_a_retired_policy_says_where_its_weights_went():
    """Issue 63, 7: superseded generations left checkpoints/; their names say how to get the
    weights back, instead of a bare refusal or a silent random-weight preset."""
    from vlarun.paths import RETIRED, RETIRED_AT, policy_dir, shipped_policies
    from vlarun.policy import Policy

    assert not set(RETIRED) & set(shipped_policies())
    restore = f"git checkout {RETIRED_AT[:12]} -- checkpoints/mt10-ar-ceed"
    with pytest.raises(ValueError, match=re.escape(restore)):
        policy_dir("mt10-ar-ceed")  # a student: no preset of that name
    with pytest.warns(UserWarning, match="mt10-oft was retired.*random weights"):
        assert Policy.load("mt10-oft").model.cfg.name == "mt10-oft"  # the preset: its shape


def test_every_command_prints_its_help(capsys):
    """--help of every command renders (a '%' in a help text or a tuple default once broke it)."""
    from vlarun.cli import BENCH, COMMANDS

    for argv in [[c] for c in COMMANDS] + [["bench", b] for b in BENCH]:
        with pytest.raises(SystemExit) as done:
            main([*argv, "--help"])
        assert done.value.code == 0, argv
        assert "usage: vlarun" in capsys.readouterr().out


def test_an_openvla_directory_without_its_tokenizer_is_refused_in_one_line(capsys, tmp_path):
    """No silent byte-level fallback: the prompt ids would not be the checkpoint's. Refused
    before any weight is read (there are none here)."""
    text = {
        "vocab_size": 32064,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "openvla", "text_config": text})
    )
    argv = ["act", "--image", DEMO, "--instruction", "open the drawer", "--policy"]
    _one_line_error(capsys, [*argv, str(tmp_path)], "no tokenizer.json")


# A machine without the optional extras: importing one of their modules fails as it would there.
_WITHOUT_EXTRAS = """
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _NotInstalled())
from vlarun.cli import main
"""


def _without_extras(blocked: set[str], body: str) -> subprocess.CompletedProcess:
    return _python(_WITHOUT_EXTRAS.format(blocked=sorted(blocked)) + body)


def test_every_command_s_help_works_without_the_optional_extras():
    from vlarun.extras import EXTRAS

    done = _without_extras(
        set(EXTRAS),
        "from vlarun.cli import BENCH, COMMANDS\nbad = []\n"
        "for argv in [[c] for c in COMMANDS] + [['bench', b] for b in BENCH]:\n"
        "    try:\n        main([*argv, '--help'])\n"
        "    except SystemExit as e:\n        bad += [] if e.code == 0 else [argv]\n"
        "    else:\n        bad.append(argv)\n"
        "print('BAD', bad)",
    )
    assert "BAD []" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [
        (["run-robot", "--max-steps", "1"], {"gymnasium", "metaworld", "mujoco"}, "sim"),
        (["eval", "--episodes", "1"], {"gymnasium", "metaworld", "mujoco"}, "sim"),
        (["fidelity"], {"gymnasium", "metaworld", "mujoco"}, "sim"),
        (["serve-policy", "--insecure", "--port", "0"], {"websockets"}, "serve"),
        (
            ["serve-edge", "--insecure", "--port", "0", "--dashboard", "0"],
            {"prometheus_client"},
            "serve",
        ),
        (["serve-edge", "--insecure", "--port", "0", "--workers", "1"], {"ray"}, "scale"),
        (["check-parity"], {"transformers"}, "parity"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(argv, blocked, extra):
    done = _without_extras(blocked, f"import sys\nsys.exit(main({argv!r}))")
    lines = [ln for ln in done.stderr.splitlines() if "WARNING: --insecure" not in ln]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert f"pip install 'vlarun[{extra}]'" in lines[0], lines


def test_version_and_act_threads(capsys):
    from vlarun import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"vlarun {__version__}"
    import torch

    before = torch.get_num_threads()
    try:
        r = run_json(
            capsys,
            "act",
            "--image",
            DEMO,
            "--resize",
            "--instruction",
            "x",
            "--repeats",
            "1",
            "--threads",
            "1",
        )
    finally:
        torch.set_num_threads(before)
    assert r["threads"] == 1


# -- one way to name a policy -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "new"),
    [
        (["act", "--image", DEMO, "--instruction", "x", "--checkpoint", "d"], "--policy"),
        (["act", "--image", DEMO, "--instruction", "x", "--preset=tiny-openvla"], "--policy"),
        (["serve-edge", "--insecure", "--preset", "tiny-openvla"], "--policy"),
        (["run-robot", "--checkpoint", "d"], "--policy"),
        (["eval", "--checkpoint", "d"], "--policy"),
        (["fidelity", "--checkpoint", "d"], "--policy"),
        (["calibrate-drift", "--checkpoint", "d"], "--policy"),
        (["serve-policy", "--checkpoint", "d"], "--policy"),
        (["bench", "coinfer", "--checkpoint", "d"], "--policy"),
        (["info", "openvla-7b"], "--model"),
        (["info", "--preset", "openvla-7b"], "--model"),
        (["profile", "--preset", "tiny-openvla"], "--model"),
        (["bench", "predictor", "--preset", "tiny-openvla"], "--model"),
        (["check-parity", "--checkpoint", "d"], "--transformers-dir"),
    ],
)
def test_a_retired_way_of_naming_a_model_fails_in_one_line_naming_the_new(capsys, argv, new):
    _one_line_error(capsys, argv, new)


def test_no_command_s_help_offers_checkpoint_or_preset(capsys):
    from vlarun.cli import BENCH, COMMANDS

    for argv in [[c] for c in COMMANDS] + [["bench", b] for b in BENCH]:
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        out = capsys.readouterr().out
        assert "--checkpoint" not in out and "--preset" not in out, argv


def test_an_unknown_policy_is_one_line_listing_the_kinds(capsys):
    argv = ["act", "--image", DEMO, "--instruction", "x", "--policy", "no-such-policy"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "checkpoint directory" in err and "shipped" in err and "tiny-ar" in err
    assert "preset" in err and "tiny-openvla" in err


def test_a_shipped_policy_and_its_preset_are_one_name_for_one_model(capsys):
    """tiny-ar is the shipped policy's name, its model's name and its shape's preset (the
    mt10-* policies were already so); the old preset names say what they became."""
    from vlarun.models.checkpoint import read_config, vla_config_from
    from vlarun.models.presets import PRESETS, get_preset
    from vlarun.paths import policy_dir, shipped_policies
    from vlarun.stages.families import param_split

    shipped = shipped_policies()
    assert {"tiny-ar", "tiny-oft", "tiny-dit", "mt10p-ar"} <= set(shipped)
    for name in shipped:
        directory = policy_dir(name)
        cfg = vla_config_from(read_config(directory), directory)
        assert cfg.name == name
        if name in PRESETS:
            assert param_split(cfg) == param_split(get_preset(name)), name
    r = run_json(capsys, "info", "--model", "tiny-ar")
    assert r["model"] == "tiny-ar" and r["action_dim"] == 4
    r = run_json(capsys, "info", "--model", str(policy_dir("tiny-ar-ceed")))  # config only
    assert r["model"] == "tiny-ar-ceed"
    with pytest.raises(ValueError, match="'mw-ar' is now 'tiny-ar'"):
        get_preset("mw-ar")


def test_act_runs_a_lerobot_directory_by_its_path(capsys, tmp_path):
    """The README's `vlarun act --policy DIR` with one image per camera and the robot state."""
    from vlarun import parity

    parity.make_lerobot_dir(tmp_path, "pi0")
    inputs = parity.lerobot_reference_inputs()
    frames = []
    for i, frame in enumerate(inputs["frames"]):
        frames.append(str(tmp_path / f"cam{i}.png"))
        Image.fromarray(frame).save(frames[-1])
    state = ",".join(f"{v:.6f}" for v in inputs["state"])
    r = run_json(
        capsys,
        "act",
        "--policy",
        str(tmp_path),
        "--image",
        ",".join(frames),
        "--instruction",
        inputs["task"],
        "--state",
        state,
        "--repeats",
        "1",
    )
    actions = np.asarray(r["actions"])
    assert actions.shape == (parity.LEROBOT_CHUNK, parity.LEROBOT_ACTION_DIM)
    assert r["policy"] == str(tmp_path) and r["unnormalized"]


def test_serve_edge_emulation_flags_reach_the_server_config():
    from vlarun.apps.runtime import ServeEdgeOptions

    o = ServeEdgeOptions(insecure=True, emulate="openvla-7b:rtx4090", time_scale=2.0)
    cfg = o.server_config()
    assert cfg.emulate.model == "openvla-7b" and cfg.emulate.device == "rtx4090"
    assert cfg.emulate.time_scale == 2.0
    assert ServeEdgeOptions(insecure=True).server_config().emulate is None
    with pytest.raises(ValueError, match="MODEL:DEVICE"):
        ServeEdgeOptions(insecure=True, emulate="openvla-7b").server_config()


def test_bench_help_lists_the_benchmarks(capsys):
    """Issue 66 (4): `vlarun bench --help` answered "unknown benchmark '--help'"."""
    from vlarun.cli import BENCH, main

    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BENCH)
    assert main(["bench"]) == 2  # no benchmark named: the list, and a usage error


def test_info_takes_a_policy_as_other_commands_do(capsys):
    """`info --policy NAME` (issue 66, 4): the flag act / eval / serve-policy use for a shipped
    policy sets info's --model; a missing one names both."""
    r = run_json(capsys, "info", "--policy", "tiny-ar")
    assert r["model"] == run_json(capsys, "info", "--model", "tiny-ar")["model"]
    with pytest.raises(SystemExit):
        main(["info"])
    assert "--model/--policy" in capsys.readouterr().err


# One name per concept across commands (issue 66, 4). An old spelling may stay only as a hidden,
# deprecated name that still works and says what the option is called now.
OLD_SPELLINGS = {
    "--robot",
    "--bandwidth",
    "--rtt",
    "--rtt-ms",
    "--bw-before",
    "--bw-after",
    "--drop-to",
    "--delay-ms",
    "--link-delay-ms",
    "--timeout",
}
CATALOG_DEVICES = {"--robot-device", "--edge-device"}


def _every_parser():
    """(command key, options class, parser) of every command and benchmark."""
    from vlarun.cli import BENCH, COMMANDS, build_parser, command

    keys = [*COMMANDS.items(), *((f"bench-{b}", entry) for b, entry in BENCH.items())]
    for key, (module, _) in keys:
        cls, _, _ = command(key, module)
        yield key, cls, build_parser(key, cls)


def test_every_command_spells_a_shared_concept_one_way():
    """--device is a torch device, --robot-device / --edge-device catalog devices (--edge an
    edge's endpoint), the link --link-mbps / --link-rtt-ms, every timeout in seconds (-s)."""
    import argparse

    from vlarun.config import _Deprecated

    bad = []
    for key, _, parser in _every_parser():
        visible = {}
        for action in parser._actions:
            if isinstance(action, _Deprecated):
                assert action.help == argparse.SUPPRESS, (key, action.option_strings)
                assert action.new in parser._option_string_actions, (key, action.new)
                continue
            visible |= {flag: action.help or "" for flag in action.option_strings}
        for flag, text in visible.items():
            if flag in OLD_SPELLINGS:
                bad.append(f"{key} {flag}: an old spelling, not deprecated")
            if flag == "--device" and "cuda:N" not in text:
                bad.append(f"{key} --device is not a torch device: {text}")
            if flag == "--edge" and "endpoint" not in text:
                bad.append(f"{key} --edge is not an endpoint: {text}")
            if "timeout" in flag and not flag.endswith("-s"):
                bad.append(f"{key} {flag}: a timeout without its unit")
            if "catalog device" in text and flag not in CATALOG_DEVICES:
                bad.append(f"{key} {flag}: a catalog device not named by its role")
            if "round-trip" in text and flag != "--link-rtt-ms":
                bad.append(f"{key} {flag}: a link's round trip not named --link-rtt-ms")
            if re.search(r"link bandwidth|bandwidth, Mbit/s", text) and not flag.startswith(
                "--link-mbps"
            ):
                bad.append(f"{key} {flag}: a link's bandwidth not named --link-mbps")
    assert not bad, "\n".join(bad)


def _parsed(key: str, argv: list[str]):
    from vlarun.config import parse_into

    for k, cls, parser in _every_parser():
        if k == key:
            return parse_into(cls, parser.parse_args(argv))
    raise KeyError(key)


def test_an_old_option_name_still_works_and_says_its_new_one_in_one_line(capsys):
    new = [
        "plan",
        "--model",
        "tiny-ar",
        "--robot-device",
        "this-cpu",
        "--edge-device",
        "rtx4090",
        "--link-mbps",
        "100",
        "--link-rtt-ms",
        "3",
    ]
    old = [
        "plan",
        "--model",
        "tiny-ar",
        "--robot",
        "this-cpu",
        "--edge",
        "rtx4090",
        "--bandwidth",
        "100",
        "--rtt",
        "3",
    ]
    a, b = run_json(capsys, *new), run_json(capsys, *old)
    assert a["placement"] == b["placement"] and a["latency_ms"] == b["latency_ms"]
    assert main([*old, "--json"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all("deprecated, use --" in line for line in err), err
    assert "--rtt is deprecated, use --link-rtt-ms" in err[-1]
    # A one-way delay was half the round trip: the old name converts.
    o = _parsed("run-robot", ["--link-delay-ms", "5"])
    assert o.link_rtt_ms == 10.0
    assert "use --link-rtt-ms (in its units: --link-rtt-ms 10)" in capsys.readouterr().err
    assert _parsed("bench-coinfer", ["--delay-ms", "1", "--drop-to", "20"]).link_rtt_ms == 2.0
    assert _parsed("ping", ["--edge", "tcp://h:1", "--timeout", "0.5"]).timeout_s == 0.5
    fleet = _parsed("fleet", ["--robot", "orin-nano-8gb", "--bw-before", "90", "--rtt-ms", "7"])
    assert (fleet.robot, fleet.bw_before, fleet.rtt_ms) == ("orin-nano-8gb", 90.0, 7.0)
    capsys.readouterr()
    # predict's --device was a catalog id; a torch device there says what to give instead.
    assert main(["predict", "--model", "tiny-ar", "--device", "cpu"]) == 2
    assert "--robot-device this-cpu" in capsys.readouterr().err
    assert main(["plan", "--model", "tiny-ar", "--edge-device", "rtx4090"]) == 2
    assert "required: --robot-device" in capsys.readouterr().err


def test_act_runs_the_trained_policy_the_other_commands_default_to():
    """`act` defaulted to tiny-openvla, a preset of random weights, while eval, serve-policy,
    serve-edge and run-robot defaulted to tiny-ar."""
    defaults = {
        key: next(f.default for f in dataclasses.fields(cls) if f.name == "policy")
        for key, cls, _ in _every_parser()
        if key in ("act", "eval", "serve-policy", "serve-edge", "run-robot")
    }
    assert len(set(defaults.values())) == 1, defaults
    assert (ROOT / "checkpoints" / defaults["act"] / "model.safetensors").is_file()
