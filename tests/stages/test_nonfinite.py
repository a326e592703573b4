"""A policy never moves a robot on a NaN: non-finite or malformed state is refused in one line,
and a graph whose weights or input make a non-finite action raises instead of returning it."""

import numpy as np
import pytest
import torch

from vlarun.cli import main
from vlarun.policy import Policy
from vlarun.stages.graph import NonFiniteActions

# mt10w-flow reads the state twice: its proprio token and (pi0-style) nowhere else; mt10p-oft
# through the proprio token only. Both returned +nan actions for a NaN state (issue 45; found on
# mt10-oft, retired since, whose state path mt10p-oft shares).
POLICIES = ["mt10w-flow", "mt10p-oft"]


@pytest.fixture(scope="module", params=POLICIES)
def policy(request):
    return Policy.load(request.param)


def _frames(policy):
    cfg = policy.model.cfg
    return [np.zeros((cfg.image_size, cfg.image_size, 3), np.uint8)] * cfg.num_images


@pytest.mark.parametrize(
    "state,needle",
    [
        ([np.nan, 0, 0, 0], "entry 0 is nan"),
        ([0, 0, np.inf, 0], "entry 2 is inf"),
        (np.array(["2026-01-01"] * 4, dtype="datetime64[D]"), "must be numbers, got dtype"),
        (np.array(["a", "b", "c", "d"]), "must be numbers"),
        (np.zeros(1000, np.float32), "reads a state of 4 numbers, got 1000"),
        (np.zeros(3, np.float32), "reads a state of 4 numbers, got 3"),
    ],
)
def test_bad_state_is_refused_before_anything_runs(policy, state, needle):
    with pytest.raises(ValueError, match=needle):
        policy.predict(_frames(policy), "reach the goal", state=state)


def test_a_finite_state_still_acts(policy):
    actions = policy.predict(_frames(policy), "reach the goal", state=np.zeros(4, np.float32))
    assert np.isfinite(actions).all()


def test_non_finite_actions_are_never_returned(policy):
    """Weights that overflow (a diverged checkpoint): the stage that makes the actions raises,
    naming itself."""
    broken = Policy.load(policy.model.cfg.name)
    with torch.no_grad():
        for p in broken.model.language_model.parameters():
            p.fill_(float("nan"))
    with pytest.raises(NonFiniteActions, match="produced non-finite actions"):
        broken.predict(_frames(broken), "reach the goal", state=np.zeros(4, np.float32))


def test_act_refuses_a_nan_state_in_one_line(capsys, tmp_path):
    frame = tmp_path / "f.npy"
    np.save(frame, np.zeros((128, 128, 3), np.uint8))
    argv = [
        "act",
        "--policy",
        "mt10w-flow",
        "--image",
        f"{frame},{frame}",
        "--instruction",
        "reach the goal",
        "--state",
        "nan,0,0,0",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "must be finite" in err, err
