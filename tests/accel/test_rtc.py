"""Real-time chunking: the soft-mask schedule against the paper's definition, and the frozen
prefix of a flow and a DiT chunk equal to the previous chunk's, bit for bit."""

import math

import pytest
import torch

from vlarun.accel.rtc import RealTimeChunking, guidance_weights
from vlarun.policy.base import Policy


def test_weights_match_the_paper_at_hand_computed_points():
    # H = 10, d = 2, s = 3: frozen 0..1, soft 2..6, free 7..9; c_i = (7 - i) / 6.
    w = guidance_weights(10, 2, 3)
    assert w.dtype == torch.float64 and w.shape == (10,)
    assert w[:2].tolist() == [1.0, 1.0]
    assert w[7:].tolist() == [0.0, 0.0, 0.0]
    c_first, c_last = 5 / 6, 1 / 6  # i = d and i = H - s - 1
    assert w[2].item() == pytest.approx(c_first * (math.exp(c_first) - 1) / (math.e - 1), rel=1e-12)
    assert w[6].item() == pytest.approx(c_last * (math.exp(c_last) - 1) / (math.e - 1), rel=1e-12)
    assert w[6].item() == pytest.approx(0.01759, abs=1e-5)  # small, not zero
    assert w[2].item() == pytest.approx(0.63095, abs=1e-5)  # under 1: the soft region is soft


@pytest.mark.parametrize("h,d,s", [(16, 0, 4), (16, 5, 4), (8, 3, 5), (8, 1, 1), (50, 12, 25)])
def test_weights_decay_monotonically_and_vanish_after_the_overlap(h, d, s):
    w = guidance_weights(h, d, s)
    assert (w[:d] == 1).all()
    assert (w[h - s :] == 0).all()
    soft = w[d : h - s]
    assert ((soft > 0) & (soft < 1)).all()
    assert (soft[1:] < soft[:-1]).all()  # strictly decaying


def test_no_soft_region_when_the_delay_fills_the_overlap():
    assert guidance_weights(8, 4, 4).tolist() == [1.0] * 4 + [0.0] * 4


@pytest.mark.parametrize("h,d,s", [(8, 5, 4), (8, -1, 4), (8, 0, 0), (8, 0, 9), (0, 0, 1)])
def test_bad_schedules_are_refused(h, d, s):
    with pytest.raises(ValueError, match="must be"):
        guidance_weights(h, d, s)


# -- the hook on the two denoising families ---------------------------------------------------


@pytest.fixture(scope="module", params=["tiny-pi0", "tiny-cogact"])
def model(request):
    policy = Policy.from_preset(request.param, seed=0)
    if request.param == "tiny-cogact":
        # The DiT's output layer starts at zero (eps = 0 whatever the input): give it weights so
        # that the sample depends on what the hook did at earlier steps.
        torch.nn.init.normal_(policy.model.action_model.final_layer.linear.weight, std=0.5)
    gen = torch.Generator().manual_seed(0)
    size = policy.model.cfg.image_size
    images = [torch.rand(1, 1, 3, size, size, generator=gen) for _ in range(2)]
    return policy.model, images, [policy.text_ids("open the drawer")]


def _noise(model, seed):
    h, a = model.cfg.horizon, model.cfg.action_dim
    return torch.randn(1, h, a, generator=torch.Generator().manual_seed(seed))


class Recorder:
    """Wraps a hook and records the noise levels it was called at."""

    def __init__(self, hook):
        self.hook, self.calls = hook, []

    def __call__(self, step, x, noise, data_scale, noise_scale):
        self.calls.append((step, data_scale, noise_scale))
        return self.hook(step, x, noise, data_scale, noise_scale)


def test_frozen_prefix_equals_the_previous_chunk_bit_for_bit(model):
    model, (img0, img1), ids = model
    h = model.cfg.horizon
    d, s = 3, 3  # frozen 0..2, soft 3..4, free 5..7
    previous = model.act(img0, ids, noise=_noise(model, 1))  # (1, H, A)
    free = model.act(img1, ids, noise=_noise(model, 2))
    hook = Recorder(RealTimeChunking(previous[0], d, s, h))
    guided = model.act(img1, ids, noise=_noise(model, 2), step_hook=hook)

    assert not torch.equal(free[:, :d], previous[:, :d])  # without the hook they differ
    assert torch.equal(guided[:, :d], previous[:, :d])
    assert not torch.equal(guided[:, h - s :], previous[:, h - s :])  # the tail stays free
    # The soft region's first action (W = 0.63) moved toward the previous chunk.
    gap_free = (free[:, d] - previous[:, d]).abs().sum()
    gap_guided = (guided[:, d] - previous[:, d]).abs().sum()
    assert gap_guided < gap_free
    steps = len(hook.calls)
    assert steps == 10 and [c[0] for c in hook.calls] == list(range(steps))
    assert hook.calls[-1][1:] == (1.0, 0.0)  # the last call sits exactly on the data
    assert all(0.0 < ns < 1.0 for _, _, ns in hook.calls[:-1])


def test_no_delay_and_no_overlap_leaves_the_sample_alone(model):
    model, (_, img1), ids = model
    h = model.cfg.horizon
    previous = torch.zeros(h, model.cfg.action_dim)
    hook = RealTimeChunking(previous, 0, h, h)  # d = 0, s = H: every weight is 0
    free = model.act(img1, ids, noise=_noise(model, 2))
    assert torch.equal(model.act(img1, ids, noise=_noise(model, 2), step_hook=hook), free)


def test_the_hook_refuses_what_it_cannot_inpaint():
    with pytest.raises(ValueError, match="overlap needs 5"):
        RealTimeChunking(torch.zeros(4, 7), 2, 3, 8)  # 4 actions left, overlap 8 - 3
    with pytest.raises(ValueError, match="must be"):
        RealTimeChunking(torch.zeros(8, 7), 6, 3, 8)  # delay past the overlap
    hook = RealTimeChunking(torch.zeros(8, 7), 2, 3, 8)
    with pytest.raises(ValueError, match="expected"):
        hook(0, torch.zeros(1, 8, 6), torch.zeros(1, 8, 6), 0.5, 0.5)
    two = RealTimeChunking(torch.zeros(2, 8, 7), 2, 3, 8)  # one previous chunk per row
    with pytest.raises(ValueError, match=r"\(2, 8, 7\) expected"):
        two(0, torch.zeros(3, 8, 7), torch.zeros(3, 8, 7), 0.5, 0.5)
    ar = Policy.from_preset("tiny-openvla", seed=0)
    size = ar.model.cfg.image_size
    with pytest.raises(ValueError, match="diffusion or flow"):
        ar.model.act(torch.rand(1, 1, 3, size, size), [ar.text_ids("x")], step_hook=hook)


def test_each_row_is_frozen_to_its_own_previous_chunk_and_the_tail_is_untouched():
    gen = torch.Generator().manual_seed(3)
    previous, x, noise = (torch.randn(2, 8, 7, generator=gen) for _ in range(3))
    hook = RealTimeChunking(previous, 2, 3, 8)
    mid = hook(4, x, noise, 0.5, 0.5)
    assert torch.equal(mid[:, :2], 0.5 * previous[:, :2] + 0.5 * noise[:, :2])  # noised target
    last = hook(9, x, noise, 1.0, 0.0)
    assert torch.equal(last[:, :2], previous[:, :2])
    for out in (mid, last):
        assert torch.equal(out[:, 5:], x[:, 5:])
        assert not torch.equal(out[:, 2:5], x[:, 2:5])
