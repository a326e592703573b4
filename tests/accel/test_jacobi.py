"""Jacobi decoding over the prefix KV cache reproduces greedy decoding token for token."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from vlarun.accel.jacobi import (
    JacobiConfig,
    JacobiDecoder,
    held_action,
    jacobi_decode,
    make_decoder,
)
from vlarun.models.presets.tiny import tiny_openvla
from vlarun.models.tokenizer import load_tokenizer
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy

TINY_AR = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-ar"
PROMPTS = [
    "push the red block to the goal",
    "open the drawer",
    "press the button from the top",
    "reach",
]


@pytest.fixture(scope="module")
def chunked_openvla() -> Policy:
    """tiny-openvla with random weights and an action chunk of 4 x 7 = 28 tokens."""
    torch.manual_seed(0)
    model = VLA(dataclasses.replace(tiny_openvla(), chunk=4)).eval()
    return Policy(model, load_tokenizer(None, model.cfg.llm.vocab_size))


@pytest.fixture(scope="module")
def tiny_ar() -> Policy:
    if not (TINY_AR / "config.json").exists():
        pytest.skip("checkpoints/tiny-ar is not shipped in this checkout")
    return Policy.from_checkpoint(TINY_AR)


def _batch(policy: Policy, n: int, seed: int):
    """Random images and prompts of different lengths (right-padded prefixes)."""
    cfg = policy.model.cfg
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(n, cfg.num_images, 3, cfg.image_size, cfg.image_size, generator=gen)
    ids = [policy.text_ids(PROMPTS[i % len(PROMPTS)]) for i in range(n)]
    return images, ids


def _prefill(model: VLA, images, ids):
    return model.prefill(model.build_prefix(model.encode_images(images), ids))


@pytest.mark.parametrize("which", ["chunked_openvla", "tiny_ar"])
@pytest.mark.parametrize("init", ["random", "repeat"])
@torch.no_grad()
def test_jacobi_equals_greedy_at_batch_above_one(which, init, request):
    policy = request.getfixturevalue(which)
    model = policy.model
    for seed in range(2):
        images, ids = _batch(policy, 3, seed)
        assert len({len(t) for t in ids}) > 1  # rows really sit at different positions
        greedy = model.decode_tokens(_prefill(model, images, ids))
        r = jacobi_decode(model, _prefill(model, images, ids), JacobiConfig(init=init, seed=seed))
        assert torch.equal(r.tokens, greedy)
        assert r.converged.all() and not r.exited.any()
        n = model.cfg.num_action_tokens
        assert (r.iterations >= 1).all() and (r.iterations <= n - 1).all()
        # Every token is fixed exactly once; the trajectory ends at the output.
        assert (r.fixed.sum(1) == n).all()
        assert torch.equal(r.trajectory[:, -1], r.tokens)
        if init == "repeat":  # the initial guess is y_1 (from the prefill) repeated
            assert (r.trajectory[:, 0] == r.tokens[:, :1]).all()


@torch.no_grad()
def test_each_row_equals_decoding_it_alone(chunked_openvla):
    model = chunked_openvla.model
    images, ids = _batch(chunked_openvla, 3, 7)
    batched = jacobi_decode(model, _prefill(model, images, ids)).tokens
    for r in range(3):
        alone = jacobi_decode(model, _prefill(model, images[r : r + 1], ids[r : r + 1])).tokens
        assert torch.equal(alone[0], batched[r])


@torch.no_grad()
def test_iteration_cap_limits_forwards(chunked_openvla):
    model = chunked_openvla.model
    images, ids = _batch(chunked_openvla, 2, 1)
    r = jacobi_decode(model, _prefill(model, images, ids), JacobiConfig(max_iters=2))
    assert (r.iterations <= 2).all() and r.trajectory.shape[1] <= 3


def test_accelerated_policy_with_decoders_matches_plain_policy(tiny_ar):
    image = np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8)
    want = tiny_ar.run_stages(image, "open the drawer").outputs["action_ids"]
    for method in ("ar", "jacobi"):
        fast = tiny_ar.with_hooks(decoder=make_decoder(method))
        for _ in range(2):  # the second call reuses the policy's cache
            got = fast.run_stages(image, "open the drawer").outputs["action_ids"]
            assert torch.equal(got, want)
        s = fast.hooks.decoder.summary()
        assert s["steps"] == 2 and s["converged_fraction"] == 1.0
        assert s["tokens_per_s_min"] > 0
        hist = s["iterations_histogram"]  # rows that took 1, 2, ... iterations
        assert sum(hist) == 2 and len(hist) == s["iterations_max"] and hist[-1] > 0
    exit_fast = tiny_ar.with_hooks(decoder=make_decoder("jacobi-exit", 0.5))
    assert exit_fast.predict(image, "open the drawer").shape == (4, 4)
    assert exit_fast.hooks.decoder.name == "jacobi-exit@0.5"


def test_held_action_repeats_the_last_action():
    chunk = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])  # 3 steps x 2 dims
    assert held_action(chunk, 2).tolist() == [[5, 6, 5, 6, 5, 6], [11, 12, 11, 12, 11, 12]]


@torch.no_grad()
def test_warm_start_from_the_previous_chunk(tiny_ar):
    """init="previous": the first call of an episode starts from random ids, later calls from
    the previous output's last action held; the output is still greedy's (no exit)."""
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, (128, 128, 3), dtype=np.uint8) for _ in range(3)]
    warm = tiny_ar.with_hooks(decoder=JacobiDecoder(JacobiConfig(init="previous")))
    cold = tiny_ar.with_hooks(decoder=JacobiDecoder(JacobiConfig()))
    for _ in range(2):  # reset starts each episode afresh
        warm.reset()
        cold.reset()
        previous = None
        for image in images:
            got = warm.run_stages(image, "open the drawer").outputs["action_ids"]
            want = cold.run_stages(image, "open the drawer").outputs["action_ids"]
            assert torch.equal(got, want)  # exact either way
            start = warm.hooks.decoder.last.trajectory[:, 0]
            if previous is None:  # the episode's first call: the seeded random guess
                assert torch.equal(start, cold.hooks.decoder.last.trajectory[:, 0])
            else:
                held = held_action(previous, tiny_ar.model.cfg.action_dim)
                assert torch.equal(start[:, 1:], held[:, 1:])  # y_1 comes from the prefill
            previous = got


def test_decoder_needs_an_autoregressive_policy():
    with pytest.raises(ValueError, match="autoregressive"):
        Policy.from_preset("tiny-openvla-oft").with_hooks(decoder=JacobiDecoder())


def test_jacobi_composes_with_a_token_policy(tiny_ar):
    """TRIAGE reuses last step's cache; Jacobi on top still returns greedy's tokens."""
    from vlarun.policy.methods import token_policy

    rng = np.random.default_rng(1)
    base = rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)
    frames = [np.roll(base, 3 * t, axis=0) for t in range(3)]
    greedy = tiny_ar.with_hooks(token_policy("triage", 0.25))
    jacobi = tiny_ar.with_hooks(token_policy("triage", 0.25), decoder=JacobiDecoder())
    for f in frames:
        want = greedy.run_stages(f, "open the drawer").outputs["action_ids"]
        got = jacobi.run_stages(f, "open the drawer").outputs["action_ids"]
        assert torch.equal(got, want)
    s = jacobi.stats.summary()
    assert s["pruned"] + s["reused"] > 0  # the plan did act


@pytest.mark.parametrize("name", ["tiny-univla", "mt10p-llava"])
@torch.no_grad()
def test_jacobi_is_exact_on_the_univla_and_llava_families(name):
    """Issue 65, 3: Jacobi over the prefix cache is greedy, token for token, at batch 3 on
    UniVLA's family (VQ image ids, FAST tokens; random weights) and on the trained LLaVA-VLA
    shape (CLIP tower, 20 bin tokens)."""
    from vlarun.paths import shipped_policies

    if name.startswith("mt10p") and name not in shipped_policies():
        pytest.skip(f"{name} is not shipped in this checkout")
    policy = Policy.load(name)
    model, cfg = policy.model, policy.model.cfg
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(3, cfg.num_images, 3, cfg.image_size, cfg.image_size, generator=gen)
    ids = [policy.text_ids(p) for p in PROMPTS[:3]]
    state = torch.zeros(3, cfg.proprio_dim) if cfg.proprio_dim else None

    def prefill():
        if cfg.vq is not None:  # UniVLA: the vision stage's output is image ids
            visual = model.embed_image_ids(model.image_ids(images))
        else:
            visual = model.encode_images(images)
        return model.prefill(model.build_prefix(visual, ids, state))

    greedy = model.decode_tokens(prefill())
    r = jacobi_decode(model, prefill(), JacobiConfig(init="repeat"))
    assert torch.equal(r.tokens, greedy) and r.converged.all()
