"""Shared fixtures: a random-weight tiny policy and a short stream of slowly changing frames."""

import numpy as np
import pytest
import torch

from vlarun.policy.base import Policy

INSTRUCTION = "push the red block to the goal"


@pytest.fixture(scope="module")
def oft_policy() -> Policy:
    """tiny-oft (64 visual tokens, 4 layers) with random weights: its actions depend on every
    token, which is all these tests need."""
    return Policy.from_preset("tiny-openvla-oft", seed=0)


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    """Six 64 px frames: a fixed random background and a white block moving down."""
    rng = np.random.default_rng(0)
    background = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    out = []
    for t in range(6):
        f = background.copy()
        f[8 + 4 * t : 20 + 4 * t, 10:30] = 255
        out.append(f)
    return out


def _actions(policy, frames, instruction: str = INSTRUCTION) -> list[torch.Tensor]:
    return [policy.run_stages(f, instruction).outputs["actions"][0] for f in frames]


@pytest.fixture
def actions():
    """``actions(policy, frames, instruction=...)``: each frame's normalised action chunk."""
    return _actions


@pytest.fixture
def instruction() -> str:
    return INSTRUCTION
