"""The CPU's compiled steps (``static_step`` mode ``fused``: inductor, frozen weights, its C++
GEMM templates and C++ wrapper) act exactly as the eager steps, per family: the same greedy
tokens for the autoregressive decode and a CEED student's Jacobi window, denoised actions within
1e-5 for the DiT and the flow expert (issue 62, 1). Real compilation (a C++ compiler runs), so
each case costs seconds to tens of seconds the first time; inductor caches it on disk."""

from __future__ import annotations

import pytest
import torch

from vlarun.models.static_step import FUSED, compile_steps
from vlarun.policy.base import Policy


def _actions(policy: Policy, obs: dict) -> torch.Tensor:
    run = policy.run_stages(obs["image"], obs["instruction"], state=obs["state"])
    return torch.as_tensor(run.outputs["actions"]).clone()


@pytest.mark.parametrize("name", ["tiny-ar", "tiny-ar-ceed", "tiny-dit", "tiny-pi0"])
def test_fused_steps_act_as_the_eager_ones(name):
    torch.set_num_threads(1)  # the same kernels whatever the machine's core count
    policy = Policy.load(name)
    obs = policy.example_observation()
    eager = _actions(policy, obs)
    before = policy.model.steps
    policy.model.steps = compile_steps(FUSED, denoise=True)
    try:
        fused = [_actions(policy, obs) for _ in range(2)]  # compiled, then the cached graph
    finally:
        policy.model.steps = before
    assert policy.model.steps.mode == "eager"
    for got in fused:
        if policy.model.cfg.family == "autoregressive":
            assert torch.equal(got, eager), (got - eager).abs().max()
        else:
            torch.testing.assert_close(got, eager, rtol=0, atol=1e-5)
