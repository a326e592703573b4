"""The README's Python snippet runs as printed on every checkpoint format (issue 45, 4: it
failed for every LeRobot type, which takes two cameras)."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from vlarun import parity

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if 'Policy.load("path/to/checkpoint"' in b)


@pytest.mark.parametrize("kind", ["pi0", "pi05", "smolvla", "pi0_fast", "tiny-ar", "mt10w-flow"])
def test_the_readme_snippet_runs_on_every_format(kind, tmp_path, capsys):
    target = kind
    if kind in ("pi0", "pi05", "smolvla", "pi0_fast"):
        parity.make_lerobot_dir(tmp_path, kind)
        target = str(tmp_path)
    scope: dict = {}
    exec(_snippet().replace("path/to/checkpoint", target), scope)  # noqa: S102
    policy, actions = scope["policy"], scope["actions"]
    assert actions.dtype == np.float32 and actions.shape == policy.action_shape
    assert np.isfinite(actions).all()
    assert len(policy.cameras) == policy.model.cfg.num_images
    assert policy.action_units == "robot units"
    printed = capsys.readouterr().out
    assert str(policy.action_shape) in printed


def test_a_lerobot_directory_without_its_processors_says_so(tmp_path):
    """Without policy_postprocessor.json the actions are not robot units: said once at load,
    and in the label `act` prints (it said "(robot units)")."""
    from vlarun.policy import Policy

    parity.make_lerobot_dir(tmp_path, "pi0")
    (tmp_path / "policy_postprocessor.json").unlink()
    (tmp_path / "policy_preprocessor.json").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = Policy.load(str(tmp_path))
    said = " | ".join(str(w.message) for w in caught)
    assert "no policy_postprocessor.json statistics: actions stay normalised" in said
    assert "no policy_preprocessor.json statistics: the state goes in un-normalised" in said
    assert policy.action_units == "normalised [-1, 1]: no statistics"
