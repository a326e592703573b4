"""pi0-FAST's head (vlarun/models/fast_head.py): a chunk's FAST code forced through the model's
decode path comes back within the tokenizer's round-trip bound; greedy decoding stops at END;
malformed codes decode to openpi's all-zero chunk and are counted."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from vlarun.models.checkpoint import load_vla, save_vla
from vlarun.models.fast_head import (
    FastConfig,
    FastHead,
    code_lengths,
    code_mask,
    pad_after_end,
    smooth_chunks,
    synthetic_fast_tokenizer,
)
from vlarun.models.presets.tiny import tiny_pi0_fast
from vlarun.models.static_step import DecodeSteps
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy

torch.set_num_threads(1)  # tiny forwards; two threads only fight on a shared machine


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_preset("tiny-pi0-fast", seed=0)


def _inputs(policy: Policy, n: int = 1, seed: int = 0):
    cfg = policy.model.cfg
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(n, cfg.num_images, 3, cfg.image_size, cfg.image_size, generator=gen)
    text = [policy.text_ids(p) for p in ("pick up the cup", "open the drawer wide")[:n]]
    return images, text


def test_a_code_forced_through_the_decode_path_comes_back_within_the_bound(policy):
    model, head = policy.model, policy.model.fast_head
    tok, failures = head.tokenizer, head.failures
    bound = 0.5 * math.sqrt(tok.action_horizon) / tok.scale  # per entry (fast_tokens.py)
    chunks = smooth_chunks(2, tok.action_horizon, tok.action_dim, seed=123)  # not fitted on
    codes = [head.encode(c) for c in chunks]
    assert all(
        c[-1] == model.cfg.fast.end_id and len(c) <= model.cfg.fast.max_tokens for c in codes
    )
    longest = max(len(c) for c in codes)
    forced = torch.tensor([c + [c[-1]] * (longest - len(c)) for c in codes])  # END-padded
    images, text = _inputs(policy, 2)
    actions = model.act(images, text, forced_tokens=forced)  # (2, T, D)
    assert actions.shape == (2, tok.action_horizon, tok.action_dim)
    for got, want in zip(actions.double().numpy(), chunks, strict=True):
        err = np.abs(got - want).max()
        assert 0 < err <= bound + 1e-6, (err, bound)
    assert head.failures == failures


def test_greedy_stops_when_every_row_has_written_end(policy):
    """Scripted steps: row 0 writes END as its 3rd token, row 1 as its 5th; decoding stops
    there (4 one-token forwards, not the cap's 31) and row 0 is END after its END."""
    model = policy.model
    end = model.cfg.fast.end_id
    fast_ids = model.cfg.fast.lm_range(model.cfg.llm.vocab_size)
    script = torch.tensor(
        [[fast_ids.start, end, 700, 701, 702], [fast_ids.start, 600, 601, end, 9]]
    )
    calls = []

    def one(lm, cache, tok, pos):
        calls.append(len(calls))
        return script[:, len(calls) - 1]

    images, text = _inputs(policy, 2)
    scripted = dataclasses.replace(model.steps, one=one)
    model.steps = scripted
    try:
        with torch.no_grad():
            pre = model.prefill(model.build_prefix(model.encode_images(images), text))
            ids = model.decode_tokens(pre)
    finally:
        model.steps = DecodeSteps()
    first = int(model.language_model.logits(pre.last_hidden)[1].argmax())
    assert len(calls) == 4
    assert ids.shape == (2, 5)
    assert ids[0, 2:].tolist() == [end, end, end]  # row 0's END, then END
    assert ids[1, 1:].tolist() == [fast_ids.start, 600, 601, end] and int(ids[1, 0]) == first
    assert code_lengths(ids, end).tolist() == [3, 5]


def test_malformed_codes_decode_to_zeros_and_are_counted():
    tok = synthetic_fast_tokenizer(8, 7, 512)
    cfg = FastConfig(vocab_size=512, max_tokens=32, end_id=2)
    head = FastHead(cfg, 1024, tok, 8, 7)
    code = head.encode(smooth_chunks(1, 8, 7, seed=5)[0])
    good = head.decode(code)
    assert np.abs(good).max() > 0 and head.failures == 0
    zeros = np.zeros((8, 7))
    bad = {
        "a byte id before END": [code[0], 100, *code[1:]],
        "a token short": code[:-2] + [code[-1]],
        "no END, cut at the cap": code[:-1] * 3,
        "END first": [code[-1]],
    }
    for name, ids in bad.items():
        np.testing.assert_array_equal(head.decode(ids), zeros, err_msg=name)
    assert head.failures == len(bad)
    assert np.array_equal(head.decode(code + [700, 5]), good)  # what follows END is ignored
    # LeRobot's relaxed decoding: a short code is padded with zero (high) frequencies
    relaxed = FastHead(dataclasses.replace(cfg, relaxed=True), 1024, tok, 8, 7)
    short = relaxed.decode(code[:-2] + [code[-1]])
    assert relaxed.failures == 0 and np.abs(short - good).max() < np.abs(good).max()


def test_fast_ids_sit_below_the_skipped_ids_and_end_stays_outside():
    cfg = FastConfig(vocab_size=2048, max_tokens=256, end_id=1, skip_tokens=128)
    ids = cfg.lm_range(257152)  # PaliGemma's vocabulary: openpi's 257151 - 128 - id
    assert (ids.stop - 1, ids.start) == (257152 - 1 - 128 - 0, 257152 - 1 - 128 - 2047)
    with pytest.raises(ValueError, match="end_id"):
        FastConfig(vocab_size=512, max_tokens=32, end_id=600).check_compatible(1024)
    with pytest.raises(ValueError, match="do not fit"):
        FastConfig(vocab_size=2000, max_tokens=32, end_id=2).check_compatible(1024)
    with pytest.raises(ValueError, match="decode_tokens"):
        dataclasses.replace(tiny_pi0_fast(), decode_tokens=0)
    with pytest.raises(ValueError, match="codes 8 x 6"):
        VLA(tiny_pi0_fast()).set_fast_tokenizer(synthetic_fast_tokenizer(8, 6, 512))


def test_pad_after_end_and_code_lengths():
    ids = torch.tensor([[5, 2, 7, 8], [5, 6, 7, 8], [2, 9, 2, 9]])
    assert code_lengths(ids, 2).tolist() == [2, 4, 1]
    assert pad_after_end(ids, 2).tolist() == [[5, 2, 2, 2], [5, 6, 7, 8], [2, 2, 2, 2]]
    assert code_mask(ids, 2).int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_the_synthetic_vocabulary_is_deterministic_and_near_the_expected_length():
    a, b = synthetic_fast_tokenizer(8, 7, 512), synthetic_fast_tokenizer(8, 7, 512, seed=0)
    assert a is not b and a.bpe.to_str() == b.bpe.to_str()
    lengths = [len(a.encode(c)) for c in smooth_chunks(50, 8, 7, seed=9)]
    assert abs(np.mean(lengths) - tiny_pi0_fast().decode_tokens) <= 3, np.mean(lengths)


def test_a_checkpoint_carries_its_fast_vocabulary(policy, tmp_path):
    path = save_vla(policy.model, tmp_path / "fast")
    assert (path / "fast_tokenizer" / "tokenizer.json").is_file()
    loaded, _ = load_vla(path)
    assert loaded.fast_head.tokenizer.bpe.to_str() == policy.model.fast_head.tokenizer.bpe.to_str()
    code = torch.tensor([policy.model.fast_head.encode(smooth_chunks(1, 8, 7, seed=1)[0])])
    assert torch.equal(loaded.tokens_to_actions(code), policy.model.tokens_to_actions(code))


def test_policy_predicts_a_chunk(policy):
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    actions = policy.predict(image, "pick up the cup")
    assert actions.shape == (8, 7) and np.isfinite(actions).all()
