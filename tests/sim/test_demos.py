"""Demo collection: safetensors shards + JSON manifest that round-trip through load_demos."""

import json

import numpy as np
import pytest

pytest.importorskip("metaworld")

from vlarun.sim.demos import (  # noqa: E402
    EVAL_SEED_OFFSET,
    MANIFEST,
    STATISTICS,
    collect,
    load_demos,
)
from vlarun.sim.demos_cli import main  # noqa: E402


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos")
    collect(["reach-v3"], 2, out, progress=False)
    return out


def test_round_trip_through_load_demos(demo_dir):
    demos = load_demos(demo_dir)
    m = demos.manifest
    assert m["task_names"] == ["reach-v3"]
    task = m["tasks"]["reach-v3"]
    assert task["episodes"] == 2 and task["failed"] == 0 and task["seeds"] == [0, 1]
    assert task["instruction"] == demos.instructions[0]
    assert m["eval_seed_offset"] == EVAL_SEED_OFFSET
    assert all(s < EVAL_SEED_OFFSET for s in task["seeds"])

    n = m["num_frames"]
    assert len(demos) == n == task["frames"] == sum(e["frames"] for e in m["episodes"])
    assert demos.images.shape == (n, 128, 128, 3) and demos.images.dtype == np.uint8
    assert demos.states.shape == (n, 4) and demos.states.dtype == np.float32
    assert demos.actions.shape == (n, 4) and demos.actions.dtype == np.float32
    assert np.all(np.abs(demos.actions) <= 1)
    for k in ("episode_index", "step_index", "task_index"):
        assert getattr(demos, k).dtype == np.int32
    assert [e["success"] for e in m["episodes"]] == [True, True]
    assert np.bincount(demos.episode_index).tolist() == [e["frames"] for e in m["episodes"]]
    first_len = m["episodes"][0]["frames"]
    assert demos.step_index[0] == 0 and demos.step_index[first_len] == 0
    assert demos.step_index[first_len - 1] == first_len - 1
    assert np.all(demos.task_index == 0)
    # Episodes are not constant: the robot moves, so frames differ.
    assert not np.array_equal(demos.images[0], demos.images[first_len - 1])


def test_statistics_in_openvla_layout(demo_dir):
    demos = load_demos(demo_dir)
    stats = demos.manifest["statistics"]
    assert json.loads((demo_dir / STATISTICS).read_text()) == stats
    action = stats["metaworld"]["action"]
    for key in ("q01", "q99", "min", "max", "mean", "std", "mask"):
        assert len(action[key]) == 4, key
    np.testing.assert_allclose(action["mean"], demos.actions.mean(0), atol=1e-6)
    np.testing.assert_allclose(action["max"], demos.actions.max(0), atol=1e-6)
    assert all(lo <= hi for lo, hi in zip(action["q01"], action["q99"], strict=True))
    assert stats["metaworld"]["num_transitions"] == len(demos)
    assert stats["metaworld"]["num_trajectories"] == 2


def test_only_safetensors_and_json_are_written(demo_dir):
    files = sorted(p.name for p in demo_dir.iterdir())
    assert MANIFEST in files and STATISTICS in files
    for name in files:
        assert name.endswith((".safetensors", ".json")), name
        head = (demo_dir / name).read_bytes()[:16]
        assert head[:1] != b"\x80", f"{name} looks like a pickle"
        if name.endswith(".safetensors"):
            header_len = int.from_bytes(head[:8], "little")
            assert 0 < header_len < 1_000_000 and head[8:9] == b"{"


def test_manifest_mismatch_is_detected(demo_dir, tmp_path):
    for p in demo_dir.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["shards"][0]["frames"] += 1
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="manifest implies"):
        load_demos(tmp_path)


def test_refuses_to_overwrite_and_eval_seeds(demo_dir, tmp_path):
    with pytest.raises(FileExistsError):
        collect(["reach-v3"], 1, demo_dir, progress=False)
    with pytest.raises(ValueError, match="EVAL_SEED_OFFSET"):
        collect(["reach-v3"], 2, tmp_path, seed_start=EVAL_SEED_OFFSET - 1, progress=False)
    with pytest.raises(ValueError, match="valid tasks"):
        collect(["fly-v3"], 1, tmp_path, progress=False)


def test_command_line(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["--tasks", "button-press-topdown-v3", "--episodes", "1", "--out", str(out)]
    main([*args, "--image-size", "32", "--seed-start", "3"])
    assert "1 episodes" in capsys.readouterr().out
    demos = load_demos(out)
    assert demos.images.shape[1:] == (32, 32, 3)
    assert demos.manifest["tasks"]["button-press-topdown-v3"]["seeds"] == [3]
    # `vlarun demos` is the same command (and refuses to overwrite in one line)
    from vlarun.cli import main as vlarun

    assert vlarun(["demos", *args]) == 2
    assert "exists" in capsys.readouterr().err
    assert vlarun(["demos", *args, "--image-size", "32", "--overwrite"]) == 0
    assert "1 episodes" in capsys.readouterr().out


def test_failed_episodes_are_replaced_and_recorded(tmp_path, monkeypatch):
    import vlarun.sim.demos as demos_module

    real = demos_module.run_expert_episode

    def seed_0_fails(env, seed, dart_noise=0.0):
        episode = real(env, seed, dart_noise)
        episode.success = episode.success and seed != 0
        return episode

    monkeypatch.setattr(demos_module, "run_expert_episode", seed_0_fails)
    m = collect(["reach-v3"], 2, tmp_path, image_size=32, progress=False)
    assert m["tasks"]["reach-v3"]["seeds"] == [1, 2]
    assert m["tasks"]["reach-v3"]["failed"] == 1
    assert [(f["seed"], f["task"]) for f in m["failures"]] == [(0, "reach-v3")]
    assert len(load_demos(tmp_path).manifest["episodes"]) == 2

    # Overwriting removes the earlier collection's shards.
    old_files = {s["file"] for s in m["shards"]}
    collect(["push-v3"], 1, tmp_path, image_size=32, progress=False, overwrite=True)
    assert not any((tmp_path / f).exists() for f in old_files)
    assert load_demos(tmp_path).manifest["task_names"] == ["push-v3"]


def test_targets_counts_per_task_and_dart_noise(tmp_path):
    """Format 2 stores object + goal targets; per-task counts override the default; DART noise
    changes what the robot executes (another trajectory) but the labels stay the expert's."""
    from vlarun.sim.demos import run_expert_episode
    from vlarun.sim.env import MetaWorldEnv

    m = collect(
        ["reach-v3", "push-v3"],
        1,
        tmp_path / "d",
        image_size=32,
        progress=False,
        episodes_for={"reach-v3": 2},
    )
    assert m["tasks"]["reach-v3"]["episodes"] == 2 and m["tasks"]["push-v3"]["episodes"] == 1
    demos = load_demos(tmp_path / "d")
    assert demos.targets is not None and demos.targets.shape == (len(demos), 6)
    assert np.isfinite(demos.targets).all() and np.abs(demos.targets).max() < 2.0  # metres
    with pytest.raises(ValueError, match="not among the tasks"):
        collect(["reach-v3"], 1, tmp_path / "e", episodes_for={"push-v3": 2}, progress=False)

    env = MetaWorldEnv("push-v3", image_size=32)
    clean = run_expert_episode(env, 5)
    noisy = run_expert_episode(env, 5, dart_noise=0.3)
    again = run_expert_episode(env, 5, dart_noise=0.3)
    env.close()
    assert not np.allclose(clean.states[5], noisy.states[5])  # the noise moved the hand
    assert np.array_equal(np.stack(noisy.states), np.stack(again.states))  # seeded
    # Every label is the expert's action at the visited state: replaying them needs no noise.
    assert all(np.abs(a).max() <= 1.0 for a in noisy.actions)


def test_frame_store_gathers_across_memory_mapped_shards(demo_dir):
    from vlarun.sim.demos import FrameStore

    demos = load_demos(demo_dir)
    store = demos.images
    assert isinstance(store, FrameStore) and len(store) == len(demos)
    full = np.asarray(store)
    idx = np.array([len(store) - 1, 0, 3, 3])
    assert np.array_equal(store[idx], full[idx]) and np.array_equal(store[2], full[2])
    joined = FrameStore.join([store, store])
    assert np.array_equal(joined[[len(store)]], full[[0]])
    with pytest.raises(IndexError):
        store[[len(store)]]


def test_dagger_labels_the_states_the_policy_visits(tmp_path):
    """DAgger: the shipped policy drives, the expert labels; with beta = 1 the expert drives
    every step, so the states are exactly the expert's own episode's."""
    from vlarun.policy.base import Policy
    from vlarun.sim.demos import run_dagger_episode, run_expert_episode
    from vlarun.sim.env import MetaWorldEnv

    policy = Policy.load("tiny-ar")
    env = MetaWorldEnv("reach-v3")
    expert = run_expert_episode(env, 7)
    mixed = run_dagger_episode(env, policy, 7, beta=1.0)
    assert np.array_equal(np.stack(mixed.states), np.stack(expert.states))
    assert np.allclose(np.stack(mixed.actions), np.stack(expert.actions))
    own = run_dagger_episode(env, policy, 7, beta=0.0)  # the policy's own states now
    env.close()
    assert own.length > 0 and len(own.images) == len(own.actions) == len(own.targets)
    m = collect(["reach-v3"], 1, tmp_path / "d", dagger_policy="tiny-ar", progress=False)
    assert m["dagger"] == {"policy": "tiny-ar", "beta": 0.0}
    assert m["tasks"]["reach-v3"]["episodes"] == 1  # kept whether or not the policy succeeded
    assert len(load_demos(tmp_path / "d")) == m["num_frames"] > 0
