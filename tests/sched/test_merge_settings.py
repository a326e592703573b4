"""`merge_settings`: how `vlarun/sched/settings_mt10.json` is regenerated from `bench accel
--table` runs. The newest measurement of a knob value wins whatever model it named; other
values stay with their own model and source; the planner reads the result back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vlarun.sched.settings_table import IDENTITY, load_settings, merge_settings

ROOT = Path(__file__).resolve().parents[2]


def _row(knob, value, model, rel):
    return {
        "knob": knob,
        "value": value,
        "models": [model],
        "relative_success": rel,
        "lower": rel - 0.05,
        "upper": 1.0,
        "source": f"test {model}",
    }


def _file(path, *rows):
    identity = [
        {"knob": "token_budget", "value": 1.0, "relative_success": 1.0, "source": "identity"}
    ]
    path.write_text(json.dumps({"_about": "a run", "settings": identity + list(rows)}))
    return path


def test_the_newest_measurement_of_a_value_replaces_the_older(tmp_path):
    old = _file(
        tmp_path / "old.json",
        _row("token_budget", 0.34, "mt10-oft", 0.98),
        _row("token_budget", 0.18, "mt10-oft", 0.97),
    )
    new = _file(tmp_path / "new.json", _row("token_budget", 0.34, "mt10p-oft", 1.0))
    table = merge_settings([old, new], "merged")
    rows = table["settings"]
    assert [(r["knob"], r["value"]) for r in rows[: len(IDENTITY)]] == list(IDENTITY.items())
    measured = {r["value"]: r["models"] for r in rows if r["source"] != "identity"}
    assert measured == {0.34: ["mt10p-oft"], 0.18: ["mt10-oft"]}
    out = tmp_path / "table.json"
    out.write_text(json.dumps(table))
    assert len(load_settings(out)) == len(IDENTITY) + 2  # the planner reads it


def test_refuses_what_is_not_a_measured_settings_table(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="holds no settings table"):
        merge_settings([tmp_path / "x.json"], "")
    bad = _file(tmp_path / "bad.json", _row("tokens", 0.3, "m", 1.0))
    with pytest.raises(ValueError, match="unknown knob 'tokens'"):
        merge_settings([bad], "")
    anon = _row("token_budget", 0.3, "m", 1.0)
    del anon["models"]
    with pytest.raises(ValueError, match="names no model"):
        merge_settings([_file(tmp_path / "anon.json", anon)], "")


def test_the_script_regenerates_the_shipped_table_from_the_committed_runs(tmp_path):
    """The command BENCHMARKS.md gives reproduces the shipped settings_mt10.json row for row."""
    shipped = json.loads((ROOT / "vlarun/sched/settings_mt10.json").read_text())
    files = shipped["_merged_from"]
    out = tmp_path / "settings.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/merge-settings.py"),
            "--out",
            str(out),
            "--about",
            shipped["_about"],
            *[str(ROOT / f) for f in files],
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    assert json.loads(out.read_text())["settings"] == shipped["settings"]


def test_a_bad_settings_table_is_refused_by_name(tmp_path):
    """`plan --settings FILE`: a missing file, non-JSON, a row without its fields: one line
    naming the file (and the row), never a KeyError."""
    with pytest.raises(FileNotFoundError, match="none.json does not exist"):
        load_settings(tmp_path / "none.json")
    (tmp_path / "x.md").write_text("# not json")
    with pytest.raises(ValueError, match=r"x.md is not JSON"):
        load_settings(tmp_path / "x.md")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="want a JSON object"):
        load_settings(tmp_path / "list.json")
    (tmp_path / "row.json").write_text(json.dumps({"settings": [{"knob": "token_budget"}]}))
    with pytest.raises(ValueError, match="row 0 lacks value, relative_success, source"):
        load_settings(tmp_path / "row.json")
