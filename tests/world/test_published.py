"""`vlarun bench published`: the published rows load with their sources, factors say where they
come from, a fitted row is never scored, and the command prints the table. The error against
the published figures is a benchmark result (BENCHMARKS.md), not asserted here."""

import json

import pytest

from vlarun.cli import main
from vlarun.world.published import PUBLISHED_FILE, load_published, prior_ms, published_table


def test_rows_load_and_each_names_its_source():
    groups, rows = load_published()
    assert {r.model for r in rows} >= {"pi0", "pi05", "smolvla"}
    assert {r.views for r in rows if r.device == "rtx4090"} == {1, 2, 3}
    for r in rows:
        assert r.source["url"].startswith("https://") and len(r.source["says"]) > 20, r.id
        assert r.group in groups and groups[r.group]["device"] == r.device


def test_prior_grows_with_camera_views():
    _, rows = load_published()
    views = {r.views: r for r in rows if r.group == "dexmal-triton" and r.model == "pi0"}
    t = {v: prior_ms(r) for v, r in views.items()}
    assert t[1]["vision"] < t[2]["vision"] < t[3]["vision"]  # one SigLIP pass per view
    assert t[1]["prefill"] < t[3]["prefill"]  # 256 more prefix tokens per view
    assert t[1]["denoise"] == pytest.approx(t[3]["denoise"], rel=0.05)  # the expert's tokens


def test_factors_fitted_on_one_row_a_priori_or_carried_over():
    r = published_table()
    groups = r["groups"]
    anchors = [x for x in r["rows"] if x["anchor"]]
    assert all(x["error_pct"] is None for x in anchors)  # a fitted row scores nothing
    for g in {x["group"] for x in anchors}:
        assert sum(x["group"] == g for x in anchors) == 1
    assert groups["apxinf-bf16"]["factor"] == groups["dexmal-triton"]["factor"]
    assert r["scored"] == len(r["rows"]) - len(anchors)


def _write(tmp_path, mutate):
    data = json.loads(PUBLISHED_FILE.read_text())
    mutate(data)
    path = tmp_path / "published.json"
    path.write_text(json.dumps(data))
    return path


def test_a_row_without_a_source_or_a_borrowed_fit_is_refused(tmp_path):
    def no_source(d):
        d["rows"][0]["source"] = {"url": "", "says": ""}

    with pytest.raises(ValueError, match="source"):
        load_published(_write(tmp_path, no_source))

    def fit_elsewhere(d):
        d["groups"]["openpi-jax"]["factor"] = {"fit": "dexmal-pi0-3v"}

    with pytest.raises(ValueError, match="not one of its rows"):
        load_published(_write(tmp_path, fit_elsewhere))


def test_command_prints_the_table(capsys, tmp_path):
    out = tmp_path / "published.json"
    assert main(["bench", "published", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    _, rows = load_published()
    assert len(
        [x for x in text.splitlines() if x.startswith(("pi0 ", "pi05 ", "smolvla "))]
    ) == len(rows)
    assert "anchor" in text and "source https://" in text and "machine: none" in text
    assert json.loads(out.read_text())["rows"][0]["source"]["url"]
    assert main(["bench", "published", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == len(rows)
