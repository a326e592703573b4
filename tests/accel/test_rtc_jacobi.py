"""Real-time chunking under Jacobi decoding (and its early exit): the forced prefix of action
tokens that freezes the first d actions is written, not iterated on, and Jacobi solves only the
free tokens after it, so the frozen actions come out verbatim and plain Jacobi's output is
greedy's after the same prefix."""

import numpy as np
import pytest
import torch

from vlarun.accel.jacobi import JacobiConfig, JacobiDecoder, jacobi_decode, make_decoder
from vlarun.accel.rtc import RTCRequest, forced_action_tokens
from vlarun.models.vla import PrefillResult
from vlarun.policy.base import Policy

# Token ids of three instructions of different lengths (right-padded rows decode at their own
# positions); the byte-level preset tokenizer's prompt template would not fit tiny-ar's 32.
TEXT_IDS = [[30, 41, 77, 91, 5], [120, 18, 64], [7, 8, 9, 10]]


@pytest.fixture(scope="module")
def setup():
    """tiny-ar with random weights (chunk 4 x 4 action dims = 16 tokens), two batches of
    frames: the previous chunk's and the new one's."""
    torch.set_num_threads(1)
    model = Policy.from_preset("tiny-ar", seed=0).model
    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    shape = (len(TEXT_IDS), 1, 3, cfg.image_size, cfg.image_size)
    return model, [torch.rand(*shape, generator=gen) for _ in range(2)]


def _prefill(model, images):
    return model.prefill(model.build_prefix(model.encode_images(images), TEXT_IDS))


@pytest.mark.parametrize("init", ["random", "repeat"])
@pytest.mark.parametrize("m", [1, 5, 8, 14, 15, 16])
@torch.no_grad()
def test_jacobi_after_a_forced_prefix_is_greedy_after_it(setup, m, init):
    """Jacobi's fixed point is greedy's, with a prefix too; from m = n - 1 on nothing is left
    to iterate (one free token comes from the prefix's forward, none when m = n)."""
    model, (img0, img1) = setup
    n = model.cfg.num_action_tokens
    forced = model.decode_tokens(_prefill(model, img0))[:, :m]  # another frame's tokens
    greedy = model.decode_tokens(_prefill(model, img1), forced)
    r = jacobi_decode(model, _prefill(model, img1), JacobiConfig(init=init), forced=forced)
    assert torch.equal(r.tokens, greedy)
    assert torch.equal(r.tokens[:, :m], forced)
    assert r.converged.all() and not r.exited.any()
    assert (r.iterations <= max(n - m - 1, 0)).all()
    # The forced tokens stand in every state from the start; each token is fixed once.
    assert (r.trajectory[:, :, :m] == forced[:, None]).all()
    assert torch.equal(r.trajectory[:, -1], r.tokens)
    assert (r.fixed.sum(1) == n).all() and (r.fixed[:, 0] >= m).all()


DECODERS = {
    "jacobi": JacobiConfig(),
    "jacobi-previous": JacobiConfig(init="previous"),
    "exit": JacobiConfig(sigma=1e-6),  # every row exits at its first iteration
    "exit-unsettled": JacobiConfig(sigma=1e-6, exit_over="unsettled"),
}


@pytest.mark.parametrize("name", list(DECODERS))
@pytest.mark.parametrize("d", [1, 2, 3])
@torch.no_grad()
def test_the_first_d_actions_are_the_previous_chunks_under_jacobi(setup, name, d):
    model, (img0, img1) = setup
    a = model.cfg.action_dim
    previous = model.act(img0, TEXT_IDS)  # (B, H, A) normalised: the chunk still executing
    forced = forced_action_tokens(model.action_tokenizer, previous, d)
    decoder = JacobiDecoder(DECODERS[name])
    for _ in range(2):  # the second call: "previous" starts from the first one's output
        ids = decoder.decode(model, _prefill(model, img1), forced)
        chunk = model.tokens_to_actions(ids)
        assert torch.equal(ids[:, : d * a], forced)
        assert torch.equal(chunk[:, :d], previous[:, :d])
        r = decoder.last
        if DECODERS[name].sigma is not None:  # the exit rule ran on the free tokens alone
            assert r.exited.all() and (r.iterations == 1).all()
        else:
            assert torch.equal(ids, model.decode_tokens(_prefill(model, img1), forced))
    step = decoder.steps[-1]
    assert step.tokens == model.cfg.num_action_tokens and len(step.iterations) == 3


@pytest.mark.parametrize("method", ["ar", "jacobi", "jacobi-exit"])
def test_the_freeze_runs_under_a_token_decoder_through_the_stages(method):
    """The head stage hands the request's forced prefix to the setting's decoder (it refused
    a token decoder before), across the wire codec too."""
    policy = Policy.load("tiny-ar", seed=0)  # the shipped checkpoint (H = 4)
    fast = policy.with_hooks(decoder=make_decoder(method, sigma=0.3))
    h, size = policy.model.cfg.horizon, policy.model.cfg.image_size
    frame = lambda v: np.full((size, size, 3), v, np.uint8)  # noqa: E731
    previous = fast.run_stages(frame(40), "open the drawer").outputs["actions"][0].numpy()
    queued = previous[1:]  # 3 actions still queued
    rtc = RTCRequest.build(queued, h, latency_s=0.09, period_s=0.05)  # d = 2
    assert rtc.delay == 2
    run = fast.run_stages(frame(200), "open the drawer", serialize=True, rtc=rtc)
    np.testing.assert_array_equal(run.outputs["actions"][0].numpy()[:2], queued[:2])


def test_a_fast_code_takes_no_forced_prefix_under_jacobi():
    """Refused before anything runs (no prefill needed: the prefix's shape is all it reads)."""
    model = Policy.load("tiny-pi0-fast", seed=0).model
    pre = PrefillResult(None, torch.zeros(1, model.cfg.llm.hidden_size), torch.zeros(1).long())
    with pytest.raises(ValueError, match="FAST"):
        jacobi_decode(model, pre, forced=torch.zeros(1, 2, dtype=torch.long))
