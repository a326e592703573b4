"""EfficientVLA transforms: DiT feature cache and LM layer pruning."""

import pytest
import torch

from vlarun.accel.feature_cache import EveryNStepsCache, every_n_steps
from vlarun.policy.base import Policy
from vlarun.transforms.layer_prune import layer_importance, least_important, prune_layers


@pytest.fixture(scope="module")
def dit_policy() -> Policy:
    policy = Policy.from_preset("tiny-cogact", seed=0)
    # DiT's output layer starts at zero (eps = 0 whatever the input); give it weights so that
    # cached features visibly change the result.
    torch.nn.init.normal_(policy.model.action_model.final_layer.linear.weight, std=0.5)
    return policy


def _sample(policy, cache=None):
    head = policy.model.action_model
    cond = torch.randn(2, head.config.cond_dim, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(
        2, head.config.horizon, head.config.action_dim, generator=torch.Generator().manual_seed(2)
    )
    return head.sample(cond, noise=noise, feature_cache=cache)


def test_feature_cache_interval_one_equals_no_cache(dit_policy):
    cache = EveryNStepsCache(1)
    assert torch.equal(_sample(dit_policy, cache), _sample(dit_policy))
    assert cache.reused == 0


def test_feature_cache_every_five_steps_computes_two_of_ten(dit_policy):
    cache = every_n_steps(5)()
    out = _sample(dit_policy, cache)
    layers = dit_policy.model.action_model.config.num_layers
    assert cache.computed == 2 * 2 * layers and cache.reused == 8 * 2 * layers
    assert not torch.equal(out, _sample(dit_policy))
    with pytest.raises(ValueError):
        every_n_steps(0)


def _samples(policy, n=2):
    gen = torch.Generator().manual_seed(0)
    size = policy.model.cfg.image_size
    ids = policy.text_ids("pick up the cube")
    return [(torch.rand(1, 1, 3, size, size, generator=gen), ids) for _ in range(n)]


def test_pruning_zero_layers_equals_the_full_model(dit_policy):
    images, ids = _samples(dit_policy, 1)[0]
    same = prune_layers(dit_policy.model, [])
    noise = torch.randn(1, 8, 7)
    a = dit_policy.model.act(images, [ids], noise=noise)
    b = same.act(images, [ids], noise=noise)
    assert torch.equal(a, b)


def test_pruned_model_equals_skipping_those_layers_and_leaves_the_original(dit_policy):
    model = dit_policy.model
    images, ids = _samples(dit_policy, 1)[0]
    pruned = prune_layers(model, [0, 2])
    assert pruned.cfg.llm.num_layers == 2 and len(pruned.language_model.model.layers) == 2
    assert model.cfg.llm.num_layers == 4 and len(model.language_model.model.layers) == 4
    with torch.no_grad():
        prefix = model.build_prefix(model.encode_images(images), [ids])
        skipped = model.language_model(
            prefix.embeds, pad_mask=prefix.pad, skip_layers=frozenset({0, 2})
        ).hidden
        fewer = pruned.language_model(prefix.embeds, pad_mask=prefix.pad).hidden
    assert (skipped - fewer).abs().max().item() <= 1e-6
    assert pruned.language_model.model.layers[0] is model.language_model.model.layers[1]


def test_layer_importance_ranks_an_identity_layer_last(dit_policy):
    model = prune_layers(dit_policy.model, [])  # a copy whose layer 1 we can neutralise
    imp = layer_importance(model, _samples(dit_policy))
    assert imp.shape == (4,) and bool((imp >= -1e-6).all())
    layer = model.language_model.model.layers[1]
    saved = layer.self_attn.o_proj.weight.clone(), layer.mlp.down_proj.weight.clone()
    try:
        with torch.no_grad():
            layer.self_attn.o_proj.weight.zero_()  # layer 1 now returns its input
            layer.mlp.down_proj.weight.zero_()
        imp = layer_importance(model, _samples(dit_policy))
        assert imp[1].abs().item() <= 1e-6
        assert least_important(imp, 1) == (1,)
    finally:
        with torch.no_grad():
            layer.self_attn.o_proj.weight.copy_(saved[0])
            layer.mlp.down_proj.weight.copy_(saved[1])
    with pytest.raises(ValueError):
        least_important(imp, 4)


def test_mlp_sparsity_zero_is_identity_and_keeps_the_strongest_channels(dit_policy):
    from vlarun.transforms.mlp_sparsity import channel_scores, sparsify_mlp

    model = dit_policy.model
    images, ids = _samples(dit_policy, 1)[0]
    noise = torch.randn(1, 8, 7)
    same = sparsify_mlp(model, 0.0)
    assert torch.equal(same.act(images, [ids], noise=noise), model.act(images, [ids], noise=noise))
    sparse = sparsify_mlp(model, 0.25)
    width = model.cfg.llm.intermediate_size
    assert sparse.cfg.llm.intermediate_size == width - width // 4
    assert model.language_model.model.layers[0].mlp.gate_proj.weight.shape[0] == width
    layer = model.language_model.model.layers[0].mlp
    weakest = int(channel_scores(layer).argmin())
    kept = sparse.language_model.model.layers[0].mlp.gate_proj.weight
    assert not (kept == layer.gate_proj.weight[weakest]).all(dim=1).any()
    assert sparse.act(images, [ids], noise=noise).shape == (1, 8, 7)


def test_flow_expert_feature_cache(frames):
    """The same hook on a pi0-style action expert: interval 1 is exact, 5 computes 2 of 10."""

    policy = Policy.from_preset("tiny-pi0", seed=0)
    frame = frames[0]
    plain = policy.with_hooks().run_stages(frame, "open the drawer").outputs["actions"]
    made = []

    def factory(interval):
        def make():
            made.append(EveryNStepsCache(interval))
            return made[-1]

        return make

    one = policy.with_hooks(denoise_cache=factory(1)).run_stages(frame, "open the drawer")
    assert torch.equal(one.outputs["actions"], plain)
    five = policy.with_hooks(denoise_cache=factory(5)).run_stages(frame, "open the drawer")
    layers = policy.model.cfg.flow.expert.num_layers
    assert made[-1].computed == 2 * 2 * layers and made[-1].reused == 8 * 2 * layers
    assert not torch.equal(five.outputs["actions"], plain)


def test_activation_scores_are_mean_abs_activation_times_down_norm(dit_policy):
    """The activation score of a channel is what it adds on the data: checked against the MLP
    recomputed by hand from its inputs, and the channel it ranks lowest is the one removed."""
    from vlarun.transforms.mlp_sparsity import activation_scores, sparsify_mlp

    model = dit_policy.model
    samples = _samples(dit_policy, 2)
    mlp = model.language_model.model.layers[1].mlp
    inputs = []
    hook = mlp.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    try:
        scores = activation_scores(model, samples)
    finally:
        hook.remove()
    acts, count = 0.0, 0
    for (images, ids), x in zip(samples, inputs, strict=True):
        keep = model.build_prefix(model.encode_images(images), [ids]).pad
        h = torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)
        acts = acts + h.float().abs()[keep].sum(dim=0)
        count += int(keep.sum())
    want = acts / count * mlp.down_proj.weight.float().norm(dim=0)
    assert len(scores) == model.cfg.llm.num_layers
    assert torch.allclose(scores[1], want, rtol=1e-4, atol=1e-7)
    sparse = sparsify_mlp(model, 0.25, "activation", samples)
    kept = sparse.language_model.model.layers[1].mlp.gate_proj.weight
    weakest, strongest = int(scores[1].argmin()), int(scores[1].argmax())
    assert not (kept == mlp.gate_proj.weight[weakest]).all(dim=1).any()
    assert (kept == mlp.gate_proj.weight[strongest]).all(dim=1).any()
    with pytest.raises(ValueError, match="calibration"):
        sparsify_mlp(model, 0.25, "activation")
    with pytest.raises(ValueError, match="must be one of"):
        sparsify_mlp(model, 0.25, "prunenet", samples)
