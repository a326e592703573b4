"""`vlarun pair A.json B.json`: two recorded `eval --json` runs paired episode by episode; runs
on other seeds, tasks or episode counts, or without per-seed outcomes, are refused by name."""

from __future__ import annotations

import json

import pytest

from vlarun.sim.evaluate import paired_difference
from vlarun.sim.pair_results import PairConfig, format_pair, pair


def _result(path, outcomes: dict[str, list[int]], policy="p", seeds: str = "10000..10003"):
    tasks = {
        t: {"success_rate": sum(o) / len(o), "episodes": len(o), "outcomes": o}
        for t, o in outcomes.items()
    }
    n = sum(len(o) for o in outcomes.values())
    rate = sum(sum(o) for o in outcomes.values()) / n
    path.write_text(
        json.dumps(
            {"policy": policy, "success_rate": rate, "episodes": n, "tasks": tasks, "seeds": seeds}
        )
    )
    return str(path)


def test_pairs_by_task_and_seed_as_eval_paired_with_does(tmp_path):
    a = _result(
        tmp_path / "a.json", {"reach-v3": [1, 0, 0, 1], "push-v3": [1, 1, 0, 0]}, policy="A"
    )
    b = _result(
        tmp_path / "b.json", {"push-v3": [1, 1, 1, 0], "reach-v3": [0, 1, 1, 1]}, policy="B"
    )
    r = pair(PairConfig(base=a, other=b))
    # Tasks in name order, each task's seeds in order: the same lists eval --paired-with pairs.
    want = paired_difference([1, 1, 0, 0, 1, 0, 0, 1], [1, 1, 1, 0, 0, 1, 1, 1])
    assert r["difference"] == want
    assert r["difference"]["difference"] == pytest.approx(0.25)
    assert (r["difference"]["only_base"], r["difference"]["only_other"]) == (1, 3)
    assert r["tasks"]["reach-v3"]["difference"] == pytest.approx(0.25)
    assert "B" in format_pair(r) and "reach-v3" in format_pair(r)


@pytest.mark.parametrize(
    "other, message",
    [
        ({"reach-v3": [1, 0, 0, 1]}, "different seeds"),
        ({"push-v3": [1, 0, 0, 1]}, "different tasks"),
        ({"reach-v3": [1, 0, 0]}, "3 in B"),
    ],
)
def test_refuses_runs_that_did_not_play_the_same_episodes(tmp_path, other, message):
    a = _result(tmp_path / "a.json", {"reach-v3": [1, 0, 0, 1]})
    seeds = "13000..13003" if message == "different seeds" else "10000..10003"
    b = _result(tmp_path / "b.json", other, seeds=seeds)
    with pytest.raises(ValueError, match=message):
        pair(PairConfig(base=a, other=b))


def test_refuses_results_without_outcomes_or_not_an_eval(tmp_path):
    a = _result(tmp_path / "a.json", {"reach-v3": [1, 0, 0, 1]})
    old = json.loads((tmp_path / "a.json").read_text())
    del old["tasks"]["reach-v3"]["outcomes"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="no per-seed outcomes for reach-v3"):
        pair(PairConfig(base=str(tmp_path / "old.json"), other=a))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        pair(PairConfig(base=str(tmp_path / "bad.json"), other=a))
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a `vlarun eval --json` result"):
        pair(PairConfig(base=str(tmp_path / "other.json"), other=a))
    with pytest.raises(FileNotFoundError, match="none.json is not a file"):
        pair(PairConfig(base=str(tmp_path / "none.json"), other=a))
    with pytest.raises(ValueError, match="--bootstrap"):
        PairConfig(base=a, other=a, bootstrap=10)
