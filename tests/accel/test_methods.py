"""Every method id builds a policy that runs wherever a Policy does."""

import pytest
import torch

from vlarun.policy.methods import METHODS, EfficientVLAConfig, accelerated, efficientvla
from vlarun.sim.fidelity import Rollouts, action_fidelity, policy_candidate


def test_every_method_runs_and_full_is_exact(oft_policy, frames, actions):
    reference = actions(oft_policy, frames[:3])
    for method in METHODS:
        policy = accelerated(oft_policy, method, budget_fraction=0.25)
        got = actions(policy, frames[:3])
        assert got[0].shape == reference[0].shape, method
        if method == "full":
            assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
        assert policy.summary()["steps"] == 3
    with pytest.raises(ValueError, match="unknown accelerator"):
        accelerated(oft_policy, "magic")


def test_accelerated_policy_is_a_fidelity_candidate(oft_policy, frames, actions):
    """sim.fidelity takes it unchanged: the full method has zero action error."""
    import numpy as np

    from vlarun.sim.tasks import get_task

    task = "reach-v3"
    ref = np.stack([a.float().numpy() for a in actions(oft_policy, frames[:2],
                                                       get_task(task).instruction)])  # fmt: skip
    rollouts = Rollouts(np.stack(frames[:2]), ref, np.zeros(2, dtype=np.int64), (task,), (0,))
    full = action_fidelity(rollouts, policy_candidate(accelerated(oft_policy, "full")))
    assert full["mean_abs_error"] == 0.0
    triage = action_fidelity(rollouts, policy_candidate(accelerated(oft_policy, "triage", 0.1)))
    assert triage["observations"] == 2


def test_efficientvla_all_parts(oft_policy, frames, actions, instruction):
    size = oft_policy.model.cfg.image_size
    ids = oft_policy.text_ids(instruction)
    calib = [(torch.rand(1, 1, 3, size, size), ids)]
    cfg = EfficientVLAConfig(tokens=0.25, layers_removed=1, mlp_sparsity=0.25)
    fast = efficientvla(oft_policy, cfg, calib)
    actions(fast, frames[:2])
    assert fast.model.cfg.llm.num_layers == 3 and oft_policy.model.cfg.llm.num_layers == 4
    assert fast.summary()["flops_ratio"] < 0.75
    with pytest.raises(ValueError, match="calibration"):
        efficientvla(oft_policy, cfg)
    with pytest.raises(ValueError, match="denoise_cache"):
        efficientvla(oft_policy, EfficientVLAConfig(cache_interval=5))  # OFT: no denoiser
