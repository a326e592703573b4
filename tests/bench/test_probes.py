"""The measurement commands (`vlarun bench compile | load | cpu | floor | paired |
side-by-side`) parse as documented; the cheap ones run."""

import json

import pytest

from vlarun.cli import build_parser, command, main, parse_into, resolve


def _options(argv: list[str]):
    key, module, rest = resolve(argv)
    cls, _, _ = command(key, module)
    return parse_into(cls, build_parser(key, cls).parse_args(rest))


def test_side_by_side_takes_the_command_after_a_double_dash():
    o = _options(
        [
            "bench",
            "side-by-side",
            "abc123",
            "--runs",
            "2",
            "--",
            "vlarun",
            "bench",
            "engine",
            "--quick",
            "--json",
        ]
    )
    assert o.rev == "abc123" and o.runs == 2 and not o.json
    assert tuple(o.command) == ("vlarun", "bench", "engine", "--quick", "--json")


def test_side_by_side_lists_every_leaf_two_runs_differ_in_but_their_timings():
    from vlarun.bench.side_by_side import differences

    old = {"rows": [{"plan": "edge", "n": 3, "p": 0.1}], "wall_s": 1.0, "notes": ["a"]}
    assert differences(old, json.loads(json.dumps(old)), ("wall_s",)) == []
    new = {"rows": [{"plan": "robot", "n": 3, "p": 0.1 + 1e-12}, {}], "wall_s": 9.0, "x": 1}
    assert differences(old, new, ("wall_s",)) == [
        "/notes: only old",
        "/rows: 1 -> 2 items",
        "/rows[0]/plan: 'edge' -> 'robot'",
        "/x: only new",
    ]
    assert "/wall_s: 1.0 -> 9.0" in differences(old, new)
    o = _options(["bench", "side-by-side", "HEAD~1", "--identical", "--", "vlarun", "plan"])
    assert o.identical and "wall_s" in o.ignore


def test_options_are_checked_before_anything_runs(capsys):
    assert main(["bench", "compile", "--parts", "kernels"]) == 2
    assert "unknown parts ['kernels']" in capsys.readouterr().err
    assert main(["bench", "floor", "--parts", "tcp"]) == 2
    with pytest.raises(SystemExit):
        _options(["bench", "load"])  # the directory is required


def test_floor_relay_hop(capsys):
    assert main(["bench", "floor", "--n", "20", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["relay"]
    assert r["n"] == 20 and r["relayed_ms"] > 0 and r["direct_ms"] > 0


def _table(outcomes: dict[str, list[int]]) -> dict:
    keys = [["reach-v3", s] for s in range(len(outcomes["full"]))]
    return {"table": [{"config": c, "keys": keys, "outcomes": o} for c, o in outcomes.items()]}


def test_paired_lead_of_one_row_over_another_tables_rows(tmp_path, capsys):
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "lead.json"
    a.write_text(json.dumps(_table({"full": [1, 0, 1, 1], "triage:0.18": [1, 1, 1, 1]})))
    b.write_text(json.dumps(_table({"full": [1, 0, 1, 1], "fastv:0.18": [0, 0, 1, 1]})))
    assert main(["bench", "paired", str(a), "triage:0.18", str(b), "--out", str(out)]) == 0
    assert "triage:0.18 minus fastv:0.18" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["shared_episodes"] == 4 and r["minus"]["fastv:0.18"]["difference"] == 0.5
    b.write_text(json.dumps(_table({"full": [0, 0, 1, 1], "fastv:0.18": [0, 0, 1, 1]})))
    assert main(["bench", "paired", str(a), "triage:0.18", str(b)]) == 2
    assert "not the same runs" in capsys.readouterr().err
