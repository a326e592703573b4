"""Behaviour cloning: a few steps run, resume from the saved state, and export loadable VLAs."""

import json

import numpy as np
import pytest
import torch

from vlarun.models.checkpoint import load_vla
from vlarun.models.policy import Policy
from vlarun.sim.bc_model import joint_mask
from vlarun.sim.demos import collect
from vlarun.sim.train import TrainConfig, _chunks, random_shift, train


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos")
    collect(["reach-v3"], 2, out, image_size=128, progress=False)
    return out


def test_train_resume_and_export(tmp_path, demos):
    cfg = TrainConfig(demos=str(demos), out=str(tmp_path / "run"), steps=2, batch=2,
                      save_every=1, log_every=1, warmup=1)  # fmt: skip
    first = train(cfg)
    assert first["step"] == 2
    again = train(TrainConfig(**{**cfg.__dict__, "steps": 3}))
    assert again["step"] == 3  # resumed from step 2, not from 0
    log = [json.loads(line) for line in (tmp_path / "run" / "train.log").read_text().splitlines()]
    assert [e["step"] for e in log] == [1, 2, 3]
    for name in ("tiny-ar", "tiny-oft", "tiny-dit"):
        path = tmp_path / "run" / "export" / name
        assert {"model.safetensors", "config.json", "tokenizer.json", "README.md",
                "dataset_statistics.json"} <= {p.name for p in path.iterdir()}  # fmt: skip
        policy = Policy.from_checkpoint(path)
        image = np.zeros((128, 128, 3), np.uint8)
        actions = policy.predict(image, "reach the goal")
        assert actions.shape == (4, 4) and np.isfinite(actions).all()
    model, stats = load_vla(tmp_path / "run" / "export" / "tiny-ar")
    assert "metaworld" in stats and model.cfg.action_dim == 4


def test_chunks_repeat_the_last_action_of_each_episode():
    actions = np.arange(5, dtype=np.float32)[:, None]
    episode = np.array([0, 0, 0, 1, 1])
    got = _chunks(actions, episode, 3)[:, :, 0]
    assert got.tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]


def test_joint_mask_isolates_the_heads():
    m = joint_mask(prefix_len=3, n=3)  # prompt 3 | AR 2 | OFT 3
    assert m[:3, :3].equal(torch.ones(3, 3, dtype=torch.bool).tril())
    assert m[3:5, 3:5].equal(torch.ones(2, 2, dtype=torch.bool).tril()) and m[3:5, :3].all()
    assert m[5:, 5:].all() and m[5:, :3].all() and not m[5:, 3:5].any()
    assert not m[:5, 5:].any()


def test_random_shift_moves_content_within_bounds():
    img = torch.zeros(1, 3, 16, 16)
    img[:, :, 8, 8] = 1.0
    out = random_shift(img, 2, torch.Generator().manual_seed(0))
    ys, xs = torch.nonzero(out[0, 0] == 1.0, as_tuple=True)
    assert out.shape == img.shape and len(ys) == 1 and abs(int(ys) - 8) <= 2
    assert abs(int(xs) - 8) <= 2
