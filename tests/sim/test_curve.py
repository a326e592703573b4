"""The training curve: a stretch's saved state is exported, evaluated per family on the curve's
held-out seeds and appended as points that survive the machine (committed with the state)."""

import pytest

pytest.importorskip("metaworld")

from vlarun.sim.curve import CURVE_FILE, record_stretch  # noqa: E402
from vlarun.sim.demos import collect  # noqa: E402
from vlarun.sim.train import TrainConfig, train  # noqa: E402


def test_a_stretch_adds_one_point_per_family_and_a_plot(tmp_path):
    collect(["reach-v3"], 1, tmp_path / "demos", progress=False)
    run = tmp_path / "run"
    train(
        TrainConfig(
            demos=str(tmp_path / "demos"),
            out=str(run),
            steps=2,
            batch=2,
            warmup=1,
            precision="fp32",
        )
    )
    points = record_stretch(run, episodes=2, workers=1, tasks=("reach-v3",))
    assert {p["policy"] for p in points} == {"tiny-ar", "tiny-oft", "tiny-dit"}
    assert all(p["samples"] == 4 and p["step"] == 2 and 0 <= p["success"] <= 1 for p in points)
    assert all(list(p["tasks"]) == ["reach-v3"] and p["episodes_per_task"] == 2 for p in points)
    lines = (run / CURVE_FILE).read_text().splitlines()
    assert len(lines) == 3 and (run / "curve.png").stat().st_size > 1000
