"""Every method id and setting builds a policy that runs wherever a Policy does."""

import pytest
import torch

from vlarun.policy.methods import METHODS, EfficientVLAConfig, token_policy
from vlarun.sim.fidelity import Rollouts, action_fidelity, policy_candidate


def test_every_method_runs_and_full_is_exact(oft_policy, frames, actions):
    reference = actions(oft_policy, frames[:3])
    for method in METHODS:
        policy = oft_policy.with_hooks(token_policy(method, 0.25, oft_policy.calibration))
        got = actions(policy, frames[:3])
        assert got[0].shape == reference[0].shape, method
        if method == "full":
            assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
        assert policy.stats.summary()["steps"] == 3
    with pytest.raises(ValueError, match="unknown accelerator"):
        token_policy("magic")


def test_a_policy_owns_its_graph_hooks_and_statistics(oft_policy, frames, instruction):
    """One graph per prompt length, built once; with_setting gives a new policy with its own
    hooks and statistics, the original untouched; the setting's text and value are one thing;
    reset() exists on every policy."""
    from vlarun.policy.setting import AccelSetting

    n = len(oft_policy.text_ids(instruction))
    graph = oft_policy.graph(n)
    run = oft_policy.run_stages(frames[0], instruction)
    assert oft_policy.graph(n) is graph
    assert [t.name for t in run.timings] == [s.name for s in graph.stages]
    assert oft_policy.graph(n + 1) is not graph and oft_policy.hooks is None
    oft_policy.reset()  # nothing to forget, but always there
    a = oft_policy.with_setting("triage:0.25")
    b = oft_policy.with_setting(AccelSetting(token_budget=0.25))
    assert a.model is oft_policy.model and a.hooks is not b.hooks
    assert a.graph(n) is not oft_policy.graph(n)  # bound to a's hooks
    for f in frames[:3]:
        a.run_stages(f, instruction)
    assert len(a.stats.steps) == 3 and not b.stats.steps and not oft_policy.stats.steps
    assert a.stats.steps[-1].recomputed == round(0.25 * oft_policy.model.cfg.num_visual)
    a.reset()
    assert a.hooks.cache is None and len(a.stats.steps) == 3  # state forgotten, statistics kept


def test_accelerated_policy_is_a_fidelity_candidate(oft_policy, frames, actions):
    """sim.fidelity takes it unchanged: the full method has zero action error."""
    import numpy as np

    from vlarun.sim.tasks import get_task

    task = "reach-v3"
    ref = np.stack(
        [a.float().numpy() for a in actions(oft_policy, frames[:2], get_task(task).instruction)]
    )
    rollouts = Rollouts(np.stack(frames[:2]), ref, np.zeros(2, dtype=np.int64), (task,), (0,))
    full = action_fidelity(rollouts, policy_candidate(oft_policy.with_setting("full")))
    assert full["mean_abs_error"] == 0.0
    triage = action_fidelity(rollouts, policy_candidate(oft_policy.with_setting("triage:0.1")))
    assert triage["observations"] == 2


def test_efficientvla_all_parts(oft_policy, frames, actions, instruction):
    size = oft_policy.model.cfg.image_size
    ids = oft_policy.text_ids(instruction)
    calib = [(torch.rand(1, 1, 3, size, size), ids)]
    cfg = EfficientVLAConfig(tokens=0.25, layers_removed=1, mlp_sparsity=0.25)
    fast = cfg.apply(oft_policy, calib)
    actions(fast, frames[:2])
    assert fast.model.cfg.llm.num_layers == 3 and oft_policy.model.cfg.llm.num_layers == 4
    assert fast.stats.summary()["flops_ratio"] < 0.75
    with pytest.raises(ValueError, match="calibration"):
        cfg.apply(oft_policy)
    with pytest.raises(ValueError, match="denoise_cache"):
        EfficientVLAConfig(cache_interval=5).apply(oft_policy)  # OFT: no denoiser


def test_a_checkpoints_calibration_reaches_every_triage_it_builds(tmp_path):
    """calibration.json beside the weights sets TRIAGE's delta for the token policies made for
    that checkpoint, in process and from a runtime setting; a bad file fails naming the key."""
    import json
    import shutil

    from vlarun.paths import checkpoints_dir
    from vlarun.policy.base import Policy
    from vlarun.policy.setting import AccelSetting

    ckpt = tmp_path / "oft"
    shutil.copytree(checkpoints_dir() / "tiny-oft", ckpt)
    plain = Policy.from_checkpoint(ckpt)
    assert plain.calibration == {}
    assert plain.with_setting("triage:0.34").hooks.tokens.cfg.delta == 0.3
    (ckpt / "calibration.json").write_text(json.dumps({"triage": {"delta": 0.5}, "_source": "x"}))
    policy = Policy.from_checkpoint(ckpt)
    assert policy.calibration == {"triage": {"delta": 0.5}}
    for method in ("triage", "drop-all", "keep-all"):
        assert policy.with_setting(f"{method}:0.18").hooks.tokens.cfg.delta == 0.5
    hooks = AccelSetting.parse("triage:0.18").hooks("parallel", policy.calibration)
    assert hooks.tokens.cfg.delta == 0.5
    (ckpt / "calibration.json").write_text(json.dumps({"triage": {"dleta": 0.5}}))
    with pytest.raises(ValueError, match="dleta"):
        Policy.from_checkpoint(ckpt)
    (ckpt / "calibration.json").write_text(json.dumps({"fastv": {"layer": 1}}))
    with pytest.raises(ValueError, match="unknown accelerator 'fastv'"):
        Policy.from_checkpoint(ckpt)


def test_write_delta_records_the_recommendation_and_refuses_none(tmp_path):
    import json

    from vlarun.policy.base import load_calibration
    from vlarun.sim.drift_calibration import write_delta

    (tmp_path / "calibration.json").write_text(json.dumps({"triage": {"max_age": 12}}))
    write_delta(tmp_path, {"recommended_delta": 0.4, "probes": 10, "ages": [1]})
    assert load_calibration(tmp_path) == {"triage": {"max_age": 12, "delta": 0.4}}
    with pytest.raises(ValueError, match="not written"):
        write_delta(tmp_path, {"recommended_delta": 0.0, "probes": 10})


def test_jacobi_init_is_a_calibrated_word(tmp_path):
    """A distilled checkpoint's calibration names the initial Jacobi guess it was distilled
    from; early-exit settings built for it use it, others keep the paper's random guesses."""
    import json

    from vlarun.policy.base import load_calibration
    from vlarun.policy.setting import AccelSetting

    (tmp_path / "calibration.json").write_text(json.dumps({"jacobi": {"init": "repeat"}}))
    cal = load_calibration(tmp_path)
    assert AccelSetting(early_exit_sigma=0.5).hooks("autoregressive", cal).decoder.cfg.init == (
        "repeat"
    )
    assert AccelSetting(early_exit_sigma=0.5).hooks("autoregressive").decoder.cfg.init == "random"
    for bad in ("zigzag", 1, True):
        (tmp_path / "calibration.json").write_text(json.dumps({"jacobi": {"init": bad}}))
        with pytest.raises(ValueError, match=r"jacobi.init=.*one of \('random', 'repeat'\)"):
            load_calibration(tmp_path)
    (tmp_path / "calibration.json").write_text(json.dumps({"triage": {"delta": True}}))
    with pytest.raises(ValueError, match="triage.delta=True"):
        load_calibration(tmp_path)
