"""The static-shape decode steps equal the general forward, and have no host synchronisation."""

import copy
import dataclasses

import pytest
import torch

from vlarun.models.llama import LlamaConfig, LlamaLM
from vlarun.models.presets.tiny import tiny_openvla
from vlarun.models.static_step import (
    check_room,
    compile_steps,
    decode_one,
    expert_forward,
    iterate_logits,
    static_forward,
)
from vlarun.models.vla import VLA

CFG = LlamaConfig(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    max_positions=64,
)


@pytest.fixture(scope="module")
def lm() -> LlamaLM:
    torch.manual_seed(0)
    return LlamaLM(CFG).eval()


def _prefilled(lm: LlamaLM, lengths: list[int], max_len: int = 40):
    """A cache holding right-padded prompts of ``lengths`` and each row's next position."""
    b, p = len(lengths), max(lengths)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CFG.vocab_size, (b, p), generator=gen)
    pad = torch.arange(p)[None] < torch.tensor(lengths)[:, None]
    cache = lm.new_cache(b, max_len)
    with torch.no_grad():
        lm(lm.embed(ids), torch.arange(p), cache, pad_mask=pad)
    return cache, torch.tensor(lengths)


@pytest.mark.parametrize("lengths", [[9], [9, 6, 11]])
@pytest.mark.parametrize("t", [1, 5])
@torch.no_grad()
def test_static_forward_equals_the_general_forward(lm, lengths, t):
    """Decode (T = 1) and a Jacobi block (T = 5) at each row's own positions after a padded
    prompt: the same hidden states, and the same cache afterwards."""
    cache, nxt = _prefilled(lm, lengths)
    ref_cache = copy.deepcopy(cache)
    tokens = torch.randint(0, CFG.vocab_size, (len(lengths), t), generator=torch.Generator())
    pos = nxt[:, None] + torch.arange(t)[None]
    got = static_forward(lm, lm.embed(tokens), pos, cache)
    want = lm(lm.embed(tokens), pos, ref_cache).hidden
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in ((cache.k, ref_cache.k), (cache.v, ref_cache.v)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert torch.equal(cache.valid, ref_cache.valid)


@torch.no_grad()
def test_static_forward_honours_per_layer_validity(lm):
    """A cache whose deep layers lost pruned prompt tokens (TRIAGE): the deep layers' queries
    must not see them, exactly as in the general forward."""
    cache, nxt = _prefilled(lm, [12, 12])
    cache.valid[2:, :, 3:7] = False
    cache.layered = True
    ref_cache = copy.deepcopy(cache)
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10]])
    pos = nxt[:, None] + torch.arange(3)[None]
    got = static_forward(lm, lm.embed(tokens), pos, cache)
    want = lm(lm.embed(tokens), pos, ref_cache).hidden
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # And the mask matters: with the slots valid again the result is different.
    full, _ = _prefilled(lm, [12, 12])
    other = static_forward(lm, lm.embed(tokens), pos, full)
    assert (other - got).abs().max() > 1e-3


@torch.no_grad()
def test_a_jacobi_iteration_from_a_later_start_sees_the_earlier_slots(lm):
    """Rewriting only tokens 2..4 of a block leaves tokens 0..1's keys in the cache; the
    queries must attend to them (the general forward's partial-recompute case)."""
    cache, nxt = _prefilled(lm, [8])
    ref = copy.deepcopy(cache)
    block = torch.tensor([[3, 4, 5, 6, 7]])
    pos = nxt[:, None] + torch.arange(5)[None]
    iterate_logits(lm, cache, block, pos)
    lm(lm.embed(block), pos, ref)
    changed = torch.tensor([[50, 51, 52]])
    got = iterate_logits(lm, cache, changed, pos[:, 2:])
    want = lm.logits(lm(lm.embed(changed), pos[:, 2:], ref).hidden)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_steps_compile_as_one_graph(lm):
    """fullgraph=True turns any host sync (.item(), int(tensor), a data-dependent shape) into
    an error: the steps are capturable as CUDA graphs. The eager backend traces without
    generating code, so the test needs no compiler."""
    cache, nxt = _prefilled(lm, [9, 7])
    ref = copy.deepcopy(cache)
    tok = torch.tensor([1, 2])
    one = torch.compile(decode_one, fullgraph=True, dynamic=False, backend="eager")
    assert torch.equal(one(lm, cache, tok, nxt), decode_one(lm, ref, tok, nxt))
    block = torch.tensor([[1, 2, 3], [4, 5, 6]])
    pos = nxt[:, None] + 1 + torch.arange(3)[None]
    many = torch.compile(iterate_logits, fullgraph=True, dynamic=False, backend="eager")
    torch.testing.assert_close(many(lm, cache, block, pos), iterate_logits(lm, ref, block, pos))


@torch.no_grad()
def test_the_general_forward_would_not_compile_as_one_graph(lm):
    """Why the steps exist: the general forward syncs with the host (position checks, trimmed
    keys), so fullgraph tracing refuses it."""
    cache, nxt = _prefilled(lm, [9])

    def general(tok, pos):
        return lm(lm.embed(tok[:, None]), pos[:, None], cache).hidden

    with pytest.raises(Exception):  # noqa: B017 (dynamo's error type varies by version)
        torch.compile(general, fullgraph=True, backend="eager")(torch.tensor([1]), nxt)


@torch.no_grad()
def test_vla_greedy_decode_equals_one_general_forward_per_token():
    torch.manual_seed(0)
    model = VLA(dataclasses.replace(tiny_openvla(), chunk=2)).eval()
    gen = torch.Generator().manual_seed(3)
    images = torch.rand(
        2, model.cfg.num_images, 3, model.cfg.image_size, model.cfg.image_size, generator=gen
    )
    ids = [[5, 6, 7, 8], [9, 10]]
    prefix = model.build_prefix(model.encode_images(images), ids)
    got = model.decode_tokens(model.prefill(prefix))
    pre = model.prefill(prefix)
    lm, tok, pos = model.language_model, lm_first(model, pre), pre.next_pos.clone()
    want = [tok]
    for _ in range(model.cfg.num_action_tokens - 1):
        tok = lm.logits(lm(lm.embed(tok[:, None]), pos[:, None], pre.cache).hidden[:, -1])
        tok = tok.argmax(-1)
        want.append(tok)
        pos += 1
    assert torch.equal(got, torch.stack(want, dim=1))


def lm_first(model: VLA, pre) -> torch.Tensor:
    return model.language_model.logits(pre.last_hidden).argmax(-1)


def test_positions_past_the_cache_fail_in_one_line(lm):
    cache = lm.new_cache(1, 10)
    with pytest.raises(ValueError, match="position 10 exceeds the context"):
        check_room(cache, lm, torch.tensor([10]))
    check_room(cache, lm, torch.tensor([9]))


def test_unknown_compile_mode_is_refused():
    with pytest.raises(ValueError, match="compile mode must be one of"):
        compile_steps("fastest")


@torch.no_grad()
def test_a_dit_denoising_step_compiles_as_one_graph():
    """The diffusion family's step (one DiT forward) is static already: fullgraph tracing
    accepts it. (The DDIM loop reads its alpha table on the host, where it lives.)"""
    from vlarun.models.presets import get_preset

    torch.manual_seed(0)
    cfg = get_preset("tiny-cogact")
    head = VLA(cfg).eval().action_model
    c = head.config
    x = torch.randn(2, c.horizon, c.action_dim)
    cond = torch.randn(2, cfg.llm.hidden_size)
    t = torch.tensor([10, 10])
    step = torch.compile(lambda x, t, cond: head(x, t, cond), fullgraph=True, backend="eager")
    torch.testing.assert_close(step(x, t, cond), head(x, t, cond))
    assert head.alphas_cumprod.device.type == "cpu"  # never a device sync in the loop


@torch.no_grad()
def test_an_expert_on_a_prefix_cache_equals_one_joint_sequence(lm):
    """Attending to a prefix cache (pi0's action expert) with the suffix causal among itself
    equals one causal forward over prefix + suffix when the expert shares the weights."""
    ids = torch.randint(0, CFG.vocab_size, (1, 18), generator=torch.Generator().manual_seed(4))
    joint = lm(lm.embed(ids)).hidden[:, 12:]
    cache = lm.new_cache(1, 32)
    lm(lm.embed(ids[:, :12]), torch.arange(12), cache)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    suffix = expert_forward(lm, lm.embed(ids[:, 12:]), torch.arange(12, 18)[None], cache, causal)
    torch.testing.assert_close(suffix, joint, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_expert_branch_hook_sees_every_branch_and_can_replace_it(lm):
    cache, nxt = _prefilled(lm, [8])
    x = lm.embed(torch.randint(0, CFG.vocab_size, (1, 5), generator=torch.Generator()))
    pos = nxt[:, None] + torch.arange(5)[None]
    local = torch.ones(5, 5, dtype=torch.bool)
    calls = []

    def passthrough(layer, kind, compute):
        calls.append((layer, kind))
        return compute()

    plain = expert_forward(lm, x, pos, cache, local)
    assert torch.equal(expert_forward(lm, x, pos, cache, local, passthrough), plain)
    assert calls == [(i, k) for i in range(CFG.num_layers) for k in ("attn", "mlp")]
    zeroed = expert_forward(lm, x, pos, cache, local, lambda i, k, f: torch.zeros_like(f()))
    assert not torch.allclose(zeroed, plain)


@torch.no_grad()
def test_the_expert_step_compiles_as_one_graph(lm):
    cache, nxt = _prefilled(lm, [8, 5])
    x = lm.embed(torch.randint(0, CFG.vocab_size, (2, 5), generator=torch.Generator()))
    pos = nxt[:, None] + torch.arange(5)[None]
    local = torch.ones(5, 5, dtype=torch.bool)
    step = torch.compile(expert_forward, fullgraph=True, dynamic=False, backend="eager")
    torch.testing.assert_close(
        step(lm, x, pos, cache, local), expert_forward(lm, x, pos, cache, local)
    )


def test_a_policy_loads_with_compiled_steps_and_acts_the_same():
    """``Policy.load(..., compile_steps=MODE)`` (serve-edge / run-robot / serve-policy
    ``--compile-steps``): inductor-compiled decode steps give the eager policy's actions."""
    import numpy as np

    from vlarun.policy.base import Policy

    eager = Policy.load("tiny-openvla")
    fast = Policy.load("tiny-openvla", compile_steps="default")
    assert fast.model.steps.mode == "default" and eager.model.steps.mode == "eager"
    size = eager.model.cfg.image_size
    frame = np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)
    np.testing.assert_array_equal(
        fast.predict(frame, "open the drawer"), eager.predict(frame, "open the drawer")
    )
    with pytest.raises(ValueError, match="compile mode must be one of"):
        Policy.load("tiny-openvla", compile_steps="fast")


@pytest.mark.parametrize("preset", ["tiny-cogact", "tiny-pi0"])
def test_denoising_steps_run_through_the_model_steps_and_compile(preset):
    """A DiT / flow policy's denoising goes through ``model.steps`` (so ``compile_steps``
    reaches it): counted, and traced with fullgraph, the actions stay the eager ones."""
    import numpy as np

    from vlarun.models.static_step import DecodeSteps, dit_eps
    from vlarun.policy.base import Policy

    policy = Policy.load(preset)
    size = policy.model.cfg.image_size
    frames = np.random.default_rng(1).integers(
        0, 255, (policy.model.cfg.num_images, size, size, 3), dtype=np.uint8
    )
    image = frames if policy.model.cfg.num_images > 1 else frames[0]
    want = policy.predict(image, "open the drawer")
    calls = []

    def counted(fn):
        def run(*a):
            calls.append(fn.__name__)
            return fn(*a)

        return run

    policy.model.steps = DecodeSteps(eps=counted(dit_eps), expert=counted(expert_forward))
    np.testing.assert_array_equal(policy.predict(image, "open the drawer"), want)
    steps = {"tiny-cogact": "dit_eps", "tiny-pi0": "expert_forward"}[preset]
    assert calls and set(calls) == {steps}
    traced = {"fullgraph": True, "dynamic": False, "backend": "eager"}
    policy.model.steps = DecodeSteps(
        eps=torch.compile(dit_eps, **traced), expert=torch.compile(expert_forward, **traced)
    )
    np.testing.assert_allclose(policy.predict(image, "open the drawer"), want, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny-ar", "tiny-dit", "tiny-pi0", "tiny-oft", "tiny-smolvla"])
@torch.no_grad()
def test_the_static_prefill_acts_as_the_general_forward(name):
    """``prefill_forward`` on a prefix padded to ``PREFILL_BUCKET`` (eager here; compiled in
    tests/models/test_fused_steps.py) leaves every family's actions as the general forward's:
    causal and block masks (SmolVLA's state block), the expert on the prefix cache (pi0), the
    OFT pass over the cache, whose padded slots stay invalid."""
    from vlarun.models.static_step import prefill_forward
    from vlarun.models.vla import PREFILL_BUCKET
    from vlarun.policy.base import Policy

    policy = Policy.load(name)
    obs = policy.example_observation()

    def act() -> torch.Tensor:
        run = policy.run_stages(obs["image"], obs["instruction"], state=obs["state"])
        return torch.as_tensor(run.outputs["actions"]).clone()

    general = act()
    policy.model.steps = dataclasses.replace(policy.model.steps, prefill=prefill_forward)
    seen = []
    real = policy.model._static_prefill
    policy.model._static_prefill = lambda prefix: seen.append(prefix.length) or real(prefix)
    static = act()
    assert seen and seen[0] % PREFILL_BUCKET != 0  # the padding was exercised
    torch.testing.assert_close(static, general, rtol=0, atol=1e-6)


@torch.no_grad()
def test_a_step_that_cannot_compile_runs_eagerly_with_one_line(lm, capsys):
    """Issue 62, 1: where compiling fails (no C++ compiler, a backend that cannot lower the
    step) the step runs eagerly, said once on stderr, and the inference goes on."""
    from vlarun.models.static_step import _or_eager

    def no_compiler(gm, example_inputs):
        raise RuntimeError("no C++ compiler on this machine")

    cache, nxt = _prefilled(lm, [9])
    ref = copy.deepcopy(cache)
    tok = torch.tensor([3])
    one = _or_eager(torch.compile(decode_one, backend=no_compiler), decode_one)
    for _ in range(2):  # the second call goes straight to the eager step
        assert torch.equal(one(lm, cache, tok, nxt), decode_one(lm, ref, tok, nxt))
    err = capsys.readouterr().err
    assert err.count("vlarun: compiling decode_one failed") == 1
    assert "no C++ compiler on this machine" in err and "running it eagerly" in err
