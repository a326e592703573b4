"""Real-time chunking for the autoregressive family: a forced prefix of action tokens freezes
the first d actions to the previous chunk's, and greedy decoding continues after them."""

from pathlib import Path

import pytest
import torch

from vlarun.accel.rtc import forced_action_tokens
from vlarun.models.static_step import decode_one
from vlarun.policy.base import Policy

# Token ids of two instructions of different lengths (right-padded rows decode at their own
# positions); the byte-level preset tokenizer's prompt template would not fit tiny-ar's 32.
TEXT_IDS = [[30, 41, 77, 91, 5], [120, 18, 64]]


TINY_AR = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-ar"


@pytest.fixture(scope="module", params=["preset", "checkpoint"])
def setup(request):
    """tiny-ar (chunk 4 x 4 action dims = 16 tokens): random weights from the preset, and the
    shipped trained checkpoint (which emits action tokens and reads real prompts)."""
    if request.param == "preset":
        policy = Policy.from_preset("tiny-ar", seed=0)
        text_ids = TEXT_IDS
    else:
        if not (TINY_AR / "config.json").exists():
            pytest.skip("checkpoints/tiny-ar is not shipped in this checkout")
        policy = Policy.from_checkpoint(TINY_AR)
        text_ids = [policy.text_ids(p) for p in ("reach", "push the red block to the goal")]
    model = policy.model
    assert model.cfg.chunk > 1  # a chunked preset: horizon x action_dim tokens
    cfg = model.cfg
    gen = torch.Generator().manual_seed(0)
    images = [torch.rand(2, 1, 3, cfg.image_size, cfg.image_size, generator=gen) for _ in range(2)]
    return model, images, text_ids


def _prefill(model, images, ids):
    return model.prefill(model.build_prefix(model.encode_images(images), ids))


@torch.no_grad()
def _teacher_forced_greedy(model, images, ids, forced):
    """The reference: one token at a time, each the forced id while there is one, else the
    argmax after everything before it (no parallel forward of the prefix)."""
    pre = _prefill(model, images, ids)
    lm, n, m = model.language_model, model.cfg.num_action_tokens, forced.shape[1]
    tok = forced[:, 0] if m else lm.logits(pre.last_hidden).argmax(-1)
    out, pos = [tok], pre.next_pos
    for i in range(1, n):
        nxt = decode_one(lm, pre.cache, tok, pos)
        tok = forced[:, i] if i < m else nxt
        out.append(tok)
        pos = pos + 1
    return torch.stack(out, 1)


@pytest.mark.parametrize("d", [1, 2, 3])
@torch.no_grad()
def test_forced_prefix_equals_the_previous_chunk_and_the_rest_is_greedy(setup, d):
    model, (img0, img1), ids = setup
    a = model.cfg.action_dim
    previous = model.act(img0, ids)  # (B, H, A) normalised: the chunk still executing
    forced = forced_action_tokens(model.action_tokenizer, previous, d)
    assert forced.shape == (2, d * a)
    free = model.decode_tokens(_prefill(model, img1, ids))
    assert not torch.equal(free[:, : d * a], forced)  # the prefix really overrides the model

    got_ids = model.decode_tokens(_prefill(model, img1, ids), forced)
    chunk = model.act(img1, ids, forced_tokens=forced)
    # The first d actions are the previous chunk's de-tokenised actions, exactly; the previous
    # chunk came from the same tokenizer, so they are its actions unchanged.
    detok = torch.as_tensor(model.action_tokenizer.decode(forced), dtype=torch.float32)
    assert torch.equal(chunk[:, :d], detok.view(2, d, a))
    assert torch.equal(chunk[:, :d], previous[:, :d])
    # The rest: greedy decoding continued from that prefix, token for token.
    assert torch.equal(got_ids, _teacher_forced_greedy(model, img1, ids, forced))
    assert torch.equal(chunk, model.tokens_to_actions(got_ids))


@torch.no_grad()
def test_no_prefix_is_plain_greedy_and_a_full_prefix_is_returned_as_is(setup):
    model, (_, img1), ids = setup
    n = model.cfg.num_action_tokens
    free = model.decode_tokens(_prefill(model, img1, ids))
    empty = torch.zeros(2, 0, dtype=torch.long)
    assert torch.equal(model.decode_tokens(_prefill(model, img1, ids), empty), free)
    full = torch.flip(free, dims=(1,))
    assert torch.equal(model.decode_tokens(_prefill(model, img1, ids), full), full)
    assert n == model.cfg.chunk * model.cfg.action_dim


@torch.no_grad()
def test_bad_prefixes_are_refused(setup):
    model, (_, img1), ids = setup
    n = model.cfg.num_action_tokens
    for bad in (
        torch.zeros(1, 2, dtype=torch.long),
        torch.zeros(2, n + 1, dtype=torch.long),
        torch.zeros(2, dtype=torch.long),
    ):
        with pytest.raises(ValueError, match="forced tokens must be"):
            model.decode_tokens(_prefill(model, img1, ids), bad)
    with pytest.raises(ValueError, match="delay must be in"):
        forced_action_tokens(model.action_tokenizer, torch.zeros(4, 4), 5)
    with pytest.raises(ValueError, match="previous chunk must be"):
        forced_action_tokens(model.action_tokenizer, torch.zeros(4), 1)


@torch.no_grad()
def test_a_denoising_family_refuses_forced_tokens():
    policy = Policy.from_preset("tiny-pi0", seed=0)
    size = policy.model.cfg.image_size
    with pytest.raises(ValueError, match="autoregressive"):
        policy.model.act(
            torch.rand(1, 1, 3, size, size),
            [[30, 41]],
            forced_tokens=torch.zeros(1, 4, dtype=torch.long),
        )
