"""Several camera views (pooled per view) and a proprio token in the prefix."""

import pytest
import torch

from vlarun.models.presets import get_preset
from vlarun.models.vla import VLA


@pytest.fixture(scope="module")
def mt10():
    torch.manual_seed(0)
    return VLA(get_preset("mt10-oft")).eval()


def test_second_view_is_pooled_to_a_quarter(mt10):
    cfg = mt10.cfg
    assert cfg.num_visual == 256 + 64 and cfg.num_state_tokens == 1
    images = torch.rand(1, 2, 3, cfg.image_size, cfg.image_size)
    visual = mt10.encode_images(images)
    assert visual.shape == (1, 320, cfg.llm.hidden_size)
    # The pooled tokens are the 2 x 2 means of the second view's unpooled tokens.
    full = mt10.projector(mt10.vision_backbone(images[:, 1].to(mt10.dtype)))  # (1, 256, d)
    grid = full.view(1, 16, 16, -1)
    mean = grid.view(1, 8, 2, 8, 2, -1).mean(dim=(2, 4)).reshape(1, 64, -1)
    torch.testing.assert_close(visual[:, 256:], mean)


def test_state_is_required_and_changes_the_actions(mt10):
    cfg = mt10.cfg
    images = torch.rand(1, 2, 3, cfg.image_size, cfg.image_size)
    ids = [[5, 6, 7]]
    with pytest.raises(ValueError, match="needs a state of shape"):
        mt10.act(images, ids)
    a = mt10.act(images, ids, state=torch.zeros(1, 4))
    b = mt10.act(images, ids, state=torch.ones(1, 4))
    assert not torch.equal(a, b)
    prefix = mt10.build_prefix(mt10.encode_images(images), ids, torch.zeros(1, 4))
    assert prefix.length == 1 + 320 + 1 + 3
    assert int(prefix.last[0]) == 320 + 1 + 3  # BOS at 0, then visual, state, text


def test_bad_view_settings_are_named():
    cfg = get_preset("mt10-ar")
    with pytest.raises(ValueError, match="view_pool has 1 entries for 2 images"):
        type(cfg)(**{**cfg.__dict__, "view_pool": (1,)})
    with pytest.raises(ValueError, match="views"):
        type(cfg)(**{**cfg.__dict__, "views": ("workspace",)})


def test_policy_from_checkpoint_normalises_state_and_takes_views(tmp_path):
    from vlarun.models.checkpoint import save_vla
    from vlarun.policy.base import Policy

    torch.manual_seed(1)
    model = VLA(get_preset("mt10-ar")).eval()
    stats = {
        "metaworld": {
            "action": {"q01": [-1.0] * 4, "q99": [1.0] * 4, "mask": [True] * 3 + [False]},
            "proprio": {"mean": [0.0, 0.6, 0.2, 0.5], "std": [0.1, 0.1, 0.1, 0.0]},
        }
    }
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-ar" / "tokenizer.json"
    save_vla(model, tmp_path / "p", norm_stats=stats, tokenizer_file=shipped)
    policy = Policy.from_checkpoint(tmp_path / "p")
    assert policy.model.cfg.views == ("workspace", "left")
    state = policy.state_tensor([0.1, 0.6, 0.2, 0.9])
    # (x - mean) / std, the gripper's zero spread floored at 0.01 and the result clipped to 5.
    torch.testing.assert_close(state, torch.tensor([[1.0, 0.0, 0.0, 5.0]]))
    views = torch.randint(0, 255, (2, 128, 128, 3), dtype=torch.uint8).numpy()
    obs = {"image": views[0], "views": views, "state": [0.0, 0.6, 0.2, 0.5]}
    image, raw_state = Policy.observation(obs)
    actions = policy.predict(image, "reach the red goal", state=raw_state)
    assert actions.shape == (4, 4)
    with pytest.raises(ValueError, match="takes the robot state"):
        policy.predict(image, "reach the red goal")


def test_layer_importance_takes_the_state_of_a_proprio_policy(mt10):
    """EfficientVLA's layer ranking on a deep proprio policy: its calibration samples carry
    the state the prefix needs; a sample without it is refused by name."""
    from vlarun.transforms.layer_prune import layer_importance, least_important

    cfg = mt10.cfg
    images = torch.rand(1, 2, 3, cfg.image_size, cfg.image_size)
    state = torch.zeros(1, cfg.proprio_dim)
    imp = layer_importance(mt10, [(images, [5, 6, 7], state), (images, [8, 9], state + 0.5)])
    assert imp.shape == (cfg.llm.num_layers,) and bool(torch.isfinite(imp).all())
    assert len(least_important(imp, 3)) == 3
    with pytest.raises(ValueError, match="takes the robot state"):
        layer_importance(mt10, [(images, [5, 6, 7])])
