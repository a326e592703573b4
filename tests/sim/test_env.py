"""MetaWorldEnv: observation contract, upright images, seeding, hidden goal, scripted experts."""

import os

import numpy as np
import pytest

pytest.importorskip("metaworld")

from vlarun.sim.env import CAMERAS, GL_BACKEND, CameraSpec, MetaWorldEnv, env_views  # noqa: E402
from vlarun.sim.tasks import METAWORLD_HORIZON, TASKS, get_task, task_names  # noqa: E402


@pytest.fixture(scope="module")
def reach():
    env = MetaWorldEnv("reach-v3", seed=0)
    yield env
    env.close()


def wood_fraction(pixels: np.ndarray) -> float:
    """Share of pixels with the table's brown wood colour (R > G > B, moderately saturated)."""
    r, g, b = pixels.reshape(-1, 3).astype(int).T
    return float(np.mean((r > g + 8) & (g > b + 8) & (r < 200) & (r - b > 25) & (r - b < 110)))


def test_registry_has_the_benchmark_tasks():
    assert len(TASKS) >= 7
    for name in ["reach-v3", "push-v3", "pick-place-v3", "drawer-open-v3", "door-open-v3"]:
        spec = get_task(name)
        assert spec.instruction and 0 < spec.max_steps <= METAWORLD_HORIZON
    assert {t.difficulty for t in TASKS.values()} == {"precise", "coarse"}
    assert type(get_task("window-open-v3").expert_policy()).__name__ == "SawyerWindowOpenV3Policy"


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match="valid tasks: .*reach-v3.*drawer-open-v3"):
        get_task("fly-v3")
    with pytest.raises(ValueError, match="reach-v3"):
        MetaWorldEnv("fly-v3")


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="camera"):
        MetaWorldEnv("reach-v3", camera="nowhere")
    with pytest.raises(ValueError, match="image_size"):
        MetaWorldEnv("reach-v3", image_size=4)
    with pytest.raises(ValueError, match="max_steps"):
        MetaWorldEnv("reach-v3", max_steps=METAWORLD_HORIZON + 1)


def test_gl_backend_is_exported():
    assert GL_BACKEND is not None
    assert os.environ["MUJOCO_GL"] == GL_BACKEND


def test_reset_and_step_shapes_and_dtypes(reach):
    obs, info = reach.reset(seed=0)
    assert set(obs) == {"image", "state"}
    assert obs["image"].shape == (128, 128, 3) and obs["image"].dtype == np.uint8
    assert obs["state"].shape == (4,) and obs["state"].dtype == np.float32
    assert reach.observation_space.contains(obs)
    assert reach.instruction == get_task("reach-v3").instruction
    assert reach.action_space.shape == (4,)
    assert np.all(reach.action_space.low == -1) and np.all(reach.action_space.high == 1)
    assert info["success"] is False and info["seed"] == 0

    obs, reward, terminated, truncated, info = reach.step(np.zeros(4, np.float32))
    assert reach.observation_space.contains(obs)
    assert isinstance(reward, float)
    assert terminated is False and truncated is False
    assert info["success"] is False and info["steps"] == 1
    # Out-of-range actions are clipped, not rejected; malformed ones are.
    reach.step(np.array([5.0, -5.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="4 finite"):
        reach.step(np.array([np.nan, 0, 0, 0]))


def test_truncates_at_max_steps():
    env = MetaWorldEnv("reach-v3", render=False, max_steps=3)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(4))
    obs, _ = env.reset(seed=0)
    assert "image" not in obs
    flags = [env.step(np.zeros(4))[3] for _ in range(3)]
    assert flags == [False, False, True]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(4))
    env.close()


@pytest.mark.parametrize("camera", ["workspace", "corner"])
def test_images_are_upright(camera):
    """The wooden table fills the bottom of the frame; the top is floor, wall or background.

    "corner" is mounted upside down in Meta-World's XML and is rotated by the env, so it checks
    that path; each check must also fail on the vertically flipped image.
    """
    env = MetaWorldEnv("reach-v3", camera=camera)
    image = env.reset(seed=0)[0]["image"]
    env.close()
    for img, upright in [(image, True), (image[::-1], False)]:
        top, bottom = wood_fraction(img[:16]), wood_fraction(img[-16:])
        assert (bottom > top + 0.1) is upright, (camera, upright, top, bottom)
    if camera == "workspace":  # default view: table right across the bottom, none at the top
        assert wood_fraction(image[-16:]) > 0.8 and wood_fraction(image[:16]) < 0.05


def test_same_seed_same_episode_other_seed_other_layout(reach):
    obs_a, info_a = reach.reset(seed=7)
    obs_b, info_b = reach.reset(seed=7)
    np.testing.assert_array_equal(obs_a["image"], obs_b["image"])
    np.testing.assert_array_equal(obs_a["state"], obs_b["state"])
    assert info_a["task_vector"] == info_b["task_vector"]

    obs_c, info_c = reach.reset(seed=8)
    # task_vector = object xyz + goal xyz; both move between seeds.
    assert np.abs(np.subtract(info_c["task_vector"], info_a["task_vector"])[:2]).max() > 1e-3
    assert not np.array_equal(obs_a["image"], obs_c["image"])


def test_the_reset_frame_draws_this_episodes_goal_not_the_last_ones(monkeypatch):
    """Meta-World moves the goal marker after its last forward pass at reset: the reset frame
    drew the previous episode's goal (every first frame until 2026-12-05). It is the frame a
    restore of the same state draws, whatever episode ran before, and the fix leaves the
    physics bitwise as it was (the expert's trajectory without the fix is the same)."""
    import mujoco

    def expert_run(env) -> np.ndarray:
        env.reset(seed=3)
        env.reset(seed=4)
        for _ in range(40):
            env.step(env.expert_action())
        return env.sim_state()

    env = MetaWorldEnv("push-v3")
    try:
        env.reset(seed=3)
        first, _ = env.reset(seed=4)
        restored = env.restore(env.sim_state())
        np.testing.assert_array_equal(first["image"], restored["image"])
        np.testing.assert_allclose(env._mw.data.site("goal").xpos, env.targets[3:], atol=1e-9)
        fixed = expert_run(env)
    finally:
        env.close()
    monkeypatch.setattr(mujoco, "mj_kinematics", lambda model, data: None)  # as before the fix
    old = MetaWorldEnv("push-v3", render=False)
    try:
        np.testing.assert_array_equal(expert_run(old), fixed)
    finally:
        old.close()


def test_constructor_seed_and_unseeded_resets_are_reproducible():
    env_a = MetaWorldEnv("push-v3", seed=5, render=False)
    env_b = MetaWorldEnv("push-v3", seed=5, render=False)
    layouts_a = [env_a.reset()[1]["task_vector"] for _ in range(2)]
    layouts_b = [env_b.reset()[1]["task_vector"] for _ in range(2)]
    assert layouts_a == layouts_b and layouts_a[0] != layouts_a[1]
    env_a.close()
    env_b.close()


def test_goal_is_not_in_the_state(reach):
    # Hand start is fixed and the goal is random: equal states under different goals means the
    # state carries no goal; Meta-World's own goal slot is zeroed too.
    states, goals = [], []
    for seed in (0, 1, 2):
        obs, info = reach.reset(seed=seed)
        states.append(obs["state"])
        goals.append(info["task_vector"][3:])
        assert np.all(reach.raw_obs[-3:] == 0)
    assert np.abs(np.subtract(goals[0], goals[1])).max() > 1e-3
    np.testing.assert_allclose(states[0], states[1], atol=1e-6)
    np.testing.assert_allclose(states[0], states[2], atol=1e-6)


@pytest.mark.parametrize("task", ["reach-v3", "drawer-open-v3"])
@pytest.mark.parametrize("seed", [0, 1])
def test_expert_succeeds_within_max_steps(task, seed):
    env = MetaWorldEnv(task, render=False)  # rendering does not change the physics
    env.reset(seed=seed)
    for _ in range(env.max_steps):
        action = env.expert_action()
        assert action.shape == (4,) and action.dtype == np.float32
        assert np.all(np.abs(action) <= 1)
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    env.close()
    assert terminated and info["success"], f"{task} seed {seed}: no success in {env.steps} steps"


def test_cameras_render_upright_sized_frames():
    names = task_names()
    assert "workspace" in CAMERAS
    env = MetaWorldEnv(names[0], image_size=64, camera="topview")
    assert env.reset(seed=0)[0]["image"].shape == (64, 64, 3)
    env.close()


def test_gl_selection_respects_env_and_names_packages(monkeypatch):
    import vlarun.sim.env as env_module

    monkeypatch.setattr(env_module, "_probe_backend", lambda backend: f"{backend} unavailable")
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert env_module.select_gl_backend() == "osmesa"  # set by the user: no probing
    monkeypatch.delenv("MUJOCO_GL")
    with pytest.raises(RuntimeError, match="libegl1.*libosmesa6"):
        env_module.select_gl_backend()


def test_extra_cameras_give_stacked_views():
    env = MetaWorldEnv("reach-v3", image_size=32, extra_cameras=("left",))
    obs, _ = env.reset(seed=0)
    assert obs["views"].shape == (2, 32, 32, 3)
    assert np.array_equal(obs["views"][0], obs["image"])
    assert not np.array_equal(obs["views"][1], obs["image"])  # a different camera
    env.close()
    with pytest.raises(ValueError, match="unknown camera 'nope'"):
        MetaWorldEnv("reach-v3", extra_cameras=("nope",))


def test_wrist_camera_rides_with_the_hand():
    """The wrist view follows the hand (its image changes as the hand moves while the static
    workspace view of the same scene barely does), and the training targets are object + goal."""
    env = MetaWorldEnv("reach-v3", image_size=64, extra_cameras=("wrist",))
    obs, _ = env.reset(seed=3)
    first = obs["views"].astype(np.int16)
    targets = env.targets
    assert targets.shape == (6,) and targets.dtype == np.float32
    assert np.allclose(targets[3:], env._mw._get_pos_goal(), atol=1e-6)  # the goal, not zeros
    for _ in range(15):
        obs, *_ = env.step(np.array([1.0, 0.0, 0.0, 0.0], np.float32))  # sweep the hand sideways
    moved = np.abs(obs["views"].astype(np.int16) - first).mean(axis=(1, 2, 3))
    assert moved[1] > moved[0] > 0, moved  # the wrist view changes more than the workspace's
    camera = env._cameras[1][0]  # its target is a fixed offset from the hand, wherever that is
    hand = env._mw.data.body("hand").xpos
    assert np.allclose(camera.lookat, hand + np.array(CAMERAS["wrist"].lookat))
    env.close()
    with pytest.raises(ValueError, match="free cameras only"):
        CameraSpec("corner", follow="hand")


def test_goal_in_state_appends_the_goal_the_targets_carry():
    # The labelled goal-in-state variant (mt10g): hand state, then the goal xyz, from the same
    # simulator call as the training targets, so training and evaluation see one goal.
    env = MetaWorldEnv("reach-v3", goal_in_state=True, render=False)
    plain = MetaWorldEnv("reach-v3", render=False)
    try:
        goals = []
        for seed in (0, 1):
            obs, info = env.reset(seed=seed)
            ref, _ = plain.reset(seed=seed)
            assert obs["state"].shape == (7,) and env.observation_space["state"].shape == (7,)
            np.testing.assert_array_equal(obs["state"][:4], ref["state"])
            np.testing.assert_array_equal(obs["state"][4:], env.targets[3:])
            assert env.observation_space["state"].contains(obs["state"])
            goals.append(obs["state"][4:])
        assert np.abs(goals[0] - goals[1]).max() > 1e-3
    finally:
        env.close()
        plain.close()


def test_env_views_build_the_state_a_policy_was_trained_on():
    from vlarun.models.presets import get_preset

    assert env_views(get_preset("mt10g-ar"))["goal_in_state"] is True
    assert "goal_in_state" not in env_views(get_preset("mt10p-ar"))
