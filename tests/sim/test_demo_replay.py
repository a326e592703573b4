"""Demonstrations as a committed manifest: states saved, frames rendered again elsewhere."""

import json

import numpy as np
import pytest

pytest.importorskip("metaworld")

from vlarun.sim.demo_replay import REPLAY, render_manifest, save_manifest  # noqa: E402
from vlarun.sim.demos import MANIFEST, collect, load_demos  # noqa: E402
from vlarun.sim.demos_cli import main  # noqa: E402


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A two-camera DART collection, and its manifest directory as it would be committed."""
    root = tmp_path_factory.mktemp("replay")
    collect(
        ["pick-place-v3", "reach-v3"],
        2,
        root / "demos",
        image_size=64,
        extra_cameras=("wrist",),
        dart_noise=0.2,
        progress=False,
    )
    save_manifest(root / "demos", root / "manifest")
    return root


def test_a_manifest_renders_the_collection_again(committed, tmp_path):
    rendered = render_manifest(committed / "manifest", tmp_path / "out", workers=1, progress=False)
    a, b = load_demos(committed / "demos"), load_demos(tmp_path / "out")
    assert a.manifest["tasks"] == b.manifest["tasks"]
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.episode_index, b.episode_index)
    np.testing.assert_allclose(a.states, b.states, atol=1e-6)
    np.testing.assert_allclose(a.targets, b.targets, atol=1e-6)
    pixels = np.asarray(a.images) != np.asarray(b.images)
    assert pixels.mean() < 0.005, f"{pixels.mean():.4f} of pixels differ"
    assert rendered["fingerprint"]["probes"] == 8  # two per episode
    assert rendered["fingerprint"]["worst_diff"] < 2.0


def test_the_committed_files_are_small_and_carry_no_pixels(committed):
    frames = load_demos(committed / "demos").manifest["num_frames"]
    size = (committed / "manifest" / REPLAY).stat().st_size
    assert size < 400 * frames, f"{size} bytes for {frames} frames"
    manifest = json.loads((committed / "manifest" / MANIFEST).read_text())
    assert manifest["replay"]["frames"] == frames and manifest["dart_noise"] == 0.2
    with np.load(committed / "manifest" / REPLAY, allow_pickle=False) as z:
        assert not any(k.endswith("images") for k in z.files)


def test_a_manifest_that_does_not_match_the_rendering_is_refused(committed, tmp_path):
    """Another seed for an episode: it would render another scene; the error names the task."""
    bad = tmp_path / "bad"
    bad.mkdir()
    manifest = json.loads((committed / "manifest" / MANIFEST).read_text())
    for ep in manifest["episodes"]:
        if ep["task"] == "pick-place-v3":
            ep["seed"] += 500
    (bad / MANIFEST).write_text(json.dumps(manifest))
    (bad / REPLAY).write_bytes((committed / "manifest" / REPLAY).read_bytes())
    with pytest.raises(ValueError, match="pick-place-v3: reset.seed=50.. does not give"):
        render_manifest(bad, tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out" / MANIFEST).exists()


def test_the_command_line_renders_with_a_progress_bar(committed, tmp_path, capsys):
    main(
        [
            "--from-manifest",
            str(committed / "manifest"),
            "--out",
            str(tmp_path / "o"),
            "--workers",
            "2",
        ]
    )
    out = capsys.readouterr()
    assert "probe frames match the committed fingerprints" in out.out
    assert "rendering" in out.err
    with pytest.raises(SystemExit):
        main(
            [
                "--from-manifest",
                str(committed / "manifest"),
                "--out",
                str(tmp_path / "o2"),
                "--tasks",
                "reach-v3",
            ]
        )
    assert "drop --tasks" in capsys.readouterr().err


def test_a_renderer_that_does_not_match_is_refused_before_the_set_is_rendered(committed, tmp_path):
    """The probes are rendered alone first: fingerprints 10 levels off (another renderer) stop
    the command before a single shard is written, naming the task and the difference."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / MANIFEST).write_text((committed / "manifest" / MANIFEST).read_text())
    with np.load(committed / "manifest" / REPLAY, allow_pickle=False) as replay:
        arrays = dict(replay)
    thumbs = arrays["reach-v3.probe_thumbs"].astype(np.int16) + 10
    arrays["reach-v3.probe_thumbs"] = np.clip(thumbs, 0, 255).astype(np.uint8)
    np.savez_compressed(bad / REPLAY, **arrays)
    with pytest.raises(ValueError, match=r"reach-v3: rendered frames differ .* by \d+\.\d+ levels"):
        render_manifest(bad, tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out").exists()  # nothing was rendered, not even the folder
    with pytest.raises(FileNotFoundError, match="no manifest.json in .*none"):
        render_manifest(tmp_path / "none", tmp_path / "out")
