"""The validation table against the papers' published figures."""

import json

from vlarun.cli import main
from vlarun.world.validate import TARGETS, validation_table


def test_table_covers_triage_and_efficientvla(capsys):
    assert main(["bench", "validate", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    sources = {row["source"] for row in r["rows"]}
    assert any("TRIAGE" in s for s in sources) and any("EfficientVLA" in s for s in sources)
    assert len(r["rows"]) == len(TARGETS)
    for row in r["rows"]:
        assert row["published_ms"] > 0 and row["predicted_ms"] > 0
        if row["anchor"]:
            assert row["calibrated_ms"] is None  # anchors never score themselves


def test_token_budget_lowers_predicted_prefill():
    rows = {(r["model"], r["quantity"]): r for r in validation_table()["rows"]}
    full = rows[("openvla-7b", "prefill, full")]["predicted_ms"]
    triage = rows[("openvla-7b", "prefill, TRIAGE B=88")]["predicted_ms"]
    assert triage < full
