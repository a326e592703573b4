"""Jacobi decoding of variable-length FAST codes (vlarun/accel/jacobi_window.py): plain Jacobi is
greedy decoding token for token, END included, whatever the window; the prefix cache's keys are
the ones the settled tokens would write; early exit accepts whole windows."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vlarun.accel.jacobi import JacobiConfig, JacobiDecoder, jacobi_decode, jacobi_solve
from vlarun.accel.jacobi_window import window_solve
from vlarun.models.fast_head import code_lengths
from vlarun.models.presets.tiny import tiny_pi0_fast
from vlarun.models.vla import VLA
from vlarun.policy.base import Policy

torch.set_num_threads(1)  # tiny forwards; two threads only fight on a shared machine

PROMPTS = ["pick up the cup", "open the drawer", "push the red block to the goal"]


# ---------------------------------------------------------------------------------------------
# A toy causal "LM" over a cache: each solver's iterations against a known greedy answer


class ToyLM:
    """The token after input i is ``table[y_i, (y_0 + ... + y_i) % 2]``, read from what the
    cache holds at slots 0..i: a slot left stale or never written changes the answer (or, for
    one never written, raises)."""

    def __init__(self, batch: int, length: int, vocab: int = 6, seed: int = 0, scale=8.0):
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randint(0, vocab, (vocab, 2), generator=gen)
        self.cache = torch.full((batch, length), -1)
        self.vocab, self.scale = vocab, scale

    def step(self, tokens: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        self.cache.scatter_(1, idx, tokens)
        written = (self.cache >= 0).int().cumprod(1).bool()
        assert bool(written.gather(1, idx).all()), "a query read a slot never written"
        parity = self.cache.clamp(min=0).cumsum(1).gather(1, idx) % 2
        return F.one_hot(self.table[tokens, parity], self.vocab).float() * self.scale

    def fixed_step(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        idx = start + torch.arange(tokens.shape[1]).expand_as(tokens)
        return self.step(tokens, idx)

    def greedy(self, first: torch.Tensor, length: int, end: int | None) -> torch.Tensor:
        rows = []
        for y0 in first.tolist():
            y, total = [y0], y0
            while len(y) < length and y[-1] != end:
                y.append(int(self.table[y[-1], total % 2]))
                total += y[-1]
            rows.append(y + [end] * (length - len(y)))
        out = torch.tensor(rows)
        return out[:, : int(code_lengths(out, end).max())] if end is not None else out


def _solve(toy: ToyLM, first: torch.Tensor, cfg: JacobiConfig, window: int, end, seed=0):
    b, m = toy.cache.shape
    gen = torch.Generator().manual_seed(seed)
    init = torch.randint(0, toy.vocab, (b, m), generator=gen)
    logits = F.one_hot(first, toy.vocab).float() * toy.scale
    return window_solve(logits, toy.step, init, cfg, window, end)


FIRST = torch.tensor([0, 1, 2, 3, 5])  # the last row's code is END alone


@pytest.mark.parametrize("window", [1, 2, 5, 15])
@pytest.mark.parametrize("seed", [4, 5, 0])
def test_window_equals_greedy_on_a_toy(window, seed):
    first = FIRST
    toy = ToyLM(len(first), 16, seed=seed)
    want = toy.greedy(first, 16, end=5)
    r = _solve(toy, first, JacobiConfig(), window, end=5, seed=seed)
    assert torch.equal(r.tokens, want)
    assert bool(r.converged.all()) and not bool(r.exited.any())
    lengths = code_lengths(want, 5)
    assert bool((r.iterations <= lengths - 1).all())  # never more forwards than greedy


def test_toy_codes_end_at_different_lengths():
    """The toy answers above are variable length: rows end at END, one runs to the cap."""
    toy = ToyLM(5, 16, seed=4)
    assert code_lengths(toy.greedy(FIRST, 16, end=5), 5).tolist() == [16, 2, 5, 4, 1]


def test_a_full_window_without_end_is_the_fixed_solver():
    first = torch.tensor([0, 3])
    toys = [ToyLM(2, 12, seed=4) for _ in range(2)]
    init = torch.randint(0, 6, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = F.one_hot(first, 6).float() * 8.0
    windowed = window_solve(logits, toys[0].step, init, JacobiConfig(), 11, None)
    fixed = jacobi_solve(logits, toys[1].fixed_step, init, JacobiConfig())
    assert torch.equal(windowed.trajectory, fixed.trajectory)
    assert torch.equal(windowed.iterations, fixed.iterations)
    assert torch.equal(windowed.tokens, toys[0].greedy(first, 12, None))


def test_exit_accepts_whole_windows():
    """Every proposal is certain (p ~ 1): each iteration accepts W tokens, the next forward
    writes their keys while it proposes W more, so a 16-token code takes ceil(15 / W)."""
    first = torch.tensor([0, 1])
    toy = ToyLM(2, 16, seed=0, scale=50.0)
    r = _solve(toy, first, JacobiConfig(sigma=0.9), 4, end=None)
    assert r.iterations.tolist() == [4, 4] and bool(r.exited.all())
    assert not bool(r.converged.any())
    # An unreachable sigma is plain Jacobi.
    plain = _solve(ToyLM(2, 16, seed=0), first, JacobiConfig(sigma=1.0), 4, end=5)
    assert torch.equal(plain.tokens, ToyLM(2, 16, seed=0).greedy(first, 16, end=5))


def test_iteration_cap_returns_the_state_as_it_stands():
    first = torch.tensor([0])
    r = _solve(ToyLM(1, 16, seed=0), first, JacobiConfig(max_iters=2), 1, end=None)
    assert r.iterations.tolist() == [2] and not bool(r.converged.any())
    assert r.tokens.shape == (1, 16)


# ---------------------------------------------------------------------------------------------
# On tiny-pi0-fast


@pytest.fixture(scope="module")
def preset() -> Policy:
    return Policy.from_preset("tiny-pi0-fast", seed=0)


def _prefill(policy: Policy, seed: int, n: int = 2):
    model, cfg = policy.model, policy.model.cfg
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(n, cfg.num_images, 3, cfg.image_size, cfg.image_size, generator=gen)
    text = [policy.text_ids(PROMPTS[(seed + i) % len(PROMPTS)]) for i in range(n)]
    return lambda: model.prefill(model.build_prefix(model.encode_images(images), text))


@pytest.mark.parametrize("seed", [0, 1, 2])
@torch.no_grad()
def test_plain_jacobi_is_greedy_on_tiny_pi0_fast(preset, seed):
    """Random weights with tied embeddings mostly echo the last input (so from random guesses
    each iteration settles one token): the window still has to land on greedy's tokens."""
    model, prefill = preset.model, _prefill(preset, seed)
    greedy = model.decode_tokens(prefill())
    for window, init in ((1, "random"), (None, "random"), (31, "random"), (None, "repeat")):
        r = jacobi_decode(model, prefill(), JacobiConfig(window=window, init=init, seed=seed))
        assert torch.equal(r.tokens, greedy), (window, init)
        assert bool(r.converged.all())


@torch.no_grad()
def test_plain_jacobi_stops_at_end_where_greedy_does():
    """tiny-pi0-fast with an untied LM head (random outputs that vary); END is set to a token
    greedy writes mid-code in one row, so that row's code ends there and the other's does not."""
    torch.manual_seed(1)
    base = tiny_pi0_fast()
    model = VLA(dataclasses.replace(base, llm=dataclasses.replace(base.llm, tie_embeddings=False)))
    policy = dataclasses.replace(Policy.from_preset("tiny-pi0-fast"), model=model.eval())
    prefill = _prefill(policy, 1)
    free = model.decode_tokens(prefill())  # the cap's 32 tokens, no END among them
    end = int(free[0, 3])
    assert end not in base.fast.lm_range(1024) and end not in free[0, :3].tolist()
    assert end not in free[1].tolist()
    model.cfg = dataclasses.replace(
        base, llm=model.cfg.llm, fast=dataclasses.replace(base.fast, end_id=end)
    )
    greedy = model.decode_tokens(prefill())
    assert code_lengths(greedy, end).tolist() == [4, 32]
    for window in (1, 4, None, 31):
        for seed in (0, 1):
            r = jacobi_decode(model, prefill(), JacobiConfig(window=window, seed=seed))
            assert torch.equal(r.tokens, greedy), window


def test_decoder_hook_gives_the_plain_policys_actions(preset):
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    plain = preset.predict(image, PROMPTS[0])
    jac = preset.with_hooks(decoder=JacobiDecoder(JacobiConfig(init="previous")))
    for _ in range(2):  # the second call starts from the first call's code
        np.testing.assert_array_equal(jac.predict(image, PROMPTS[0]), plain)
    summary = jac.hooks.decoder.summary()
    assert summary["steps"] == 2 and summary["converged_fraction"] == 1.0
    fast = preset.with_setting("exit:0.5")
    assert fast.predict(image, PROMPTS[0]).shape == (8, 7)
