"""Weight-only int8 (transforms.int8): the packed matmul, the quantisation bound, the refusals,
action-token agreement with the float policy, and the quantised state dict."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import vlarun.transforms.int8 as int8
from vlarun.models.checkpoint import CheckpointError, save_vla
from vlarun.models.llama import PackedLinear
from vlarun.policy.base import Policy
from vlarun.transforms.int8 import Int8Linear, int8_layers, quantize_int8, quantize_weight

# Error of the int8 matmul against the float reference (x @ (Q s)ᵀ computed in fp64), as a
# fraction of sum_k |x_k| |(Q s)_nk| (the largest the sum can be): bf16 rounds the scale it is
# given (2^-9 relative) and the output (2^-9 relative); 2^-7 leaves a factor 2 for the fp32
# accumulation order. fp32: accumulation order only.
TOLERANCE = {torch.bfloat16: 2.0**-7, torch.float32: 1e-5}


def _linear(n_out: int, n_in: int, bias: bool, dtype: torch.dtype, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight[3] *= 40.0  # one channel with a much larger range: per-channel scales matter
        lin.weight[5] = 0.0  # an all-zero channel
    return lin.to(dtype)


@pytest.mark.parametrize("path", ["kernel", "dequantise"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,bias", [((1, 96), False), ((2, 7, 96), True)])
def test_int8_matmul_equals_the_dequantised_reference(monkeypatch, path, dtype, shape, bias):
    if path == "dequantise":
        monkeypatch.setattr(int8, "KERNEL", False)
    layer = Int8Linear(_linear(40, 96, bias, dtype))
    assert layer.path == path
    assert path == "dequantise" or int8.KERNEL, "torch 2.13 on the CPU has the kernel"
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (*shape[:-1], 40)
    w = layer.dequantized(torch.float64)
    ref = x.double() @ w.T
    if bias:
        ref = ref + layer.bias.double()
    bound = x.double().abs() @ w.abs().T
    assert bool(((y.double() - ref).abs() <= TOLERANCE[dtype] * bound + 1e-6).all())


def test_int8_layer_is_within_the_quantisation_error_of_the_float_layer():
    lin = _linear(40, 96, True, torch.float32)
    layer = Int8Linear(lin)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(2))
    # |x Wᵀ - x (Q s)ᵀ| <= sum_k |x_k| s_n / 2 per output channel n (plus fp32 rounding).
    bound = x.abs().sum(-1, keepdim=True) * layer.scale / 2
    err = (layer(x) - lin(x)).abs()
    assert bool((err <= bound * (1 + 1e-4) + 1e-5).all())
    assert not torch.equal(layer(x), lin(x))  # it is quantised, not a float copy


def test_per_channel_quantisation_error_bound():
    w = _linear(64, 128, False, torch.float32).weight.detach()
    q, s = quantize_weight(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (64,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127  # symmetric: -128 unused
    err = (w - q.float() * s[:, None]).abs()
    assert bool((err <= s[:, None] / 2 * (1 + 1e-6)).all())
    assert int(q[5].abs().max()) == 0 and float(s[5]) == 1.0  # zero row: exact, no 0 scale
    assert float(s[3]) > 20 * float(s[4])  # its own scale, not the layer's largest
    with pytest.raises(ValueError, match="2-D"):
        quantize_weight(torch.ones(3))


@pytest.fixture(scope="module")
def tiny_ar() -> Policy:
    return Policy.load("tiny-ar")  # the shipped, trained checkpoint: real logit margins


def test_transform_quantises_the_decoder_keeps_embedding_and_head(tiny_ar):
    model = tiny_ar.model
    q = quantize_int8(model)
    names = set(int8_layers(q))
    n = model.cfg.llm.num_layers
    assert len(names) == 7 * n and all(k.startswith("language_model.model.layers.") for k in names)
    assert isinstance(q.language_model.lm_head, nn.Linear)
    assert q.language_model.model.embed_tokens is model.language_model.model.embed_tokens
    assert q.vision_backbone is model.vision_backbone  # shared, untouched
    assert not int8_layers(model)  # the original is not patched
    head = quantize_int8(model, lm_head=True)
    assert isinstance(head.language_model.lm_head, Int8Linear)
    only_mlp = quantize_int8(model, r".*\.mlp\..*")
    assert len(int8_layers(only_mlp)) == 3 * n


def _refused(model: nn.Module, match: str, *args, **kw) -> None:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modules = dict(model.named_modules())
    with pytest.raises(ValueError, match=match) as err:
        quantize_int8(model, *args, **kw)
    assert "\n" not in str(err.value)  # one line
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    now = dict(model.named_modules())
    assert now.keys() == modules.keys() and all(now[k] is modules[k] for k in modules)


def test_refusals_change_nothing(tiny_ar):
    model = tiny_ar.model
    _refused(model, "matches no Linear", "no_such_layer")
    _refused(model, r"embed_tokens \(Embedding\)", r"language_model\.model\.embed_tokens")
    _refused(model, "matches no Linear", r"language_model\.lm_head")  # kept unless lm_head=True
    _refused(model, "matches no Linear", r"projector\..*")  # outside the LM / action head
    quantised = quantize_int8(model)
    _refused(quantised, "already quantised")
    half = Policy.from_preset("tiny-ar", dtype=torch.float16).model
    _refused(half, "bf16 / fp32 weights")


def test_refuses_a_prepacked_model():
    model = Policy.from_preset("tiny-ar").model
    mlp = model.language_model.model.layers[0].mlp
    mlp.up_proj = PackedLinear(mlp.up_proj)
    _refused(model, "prepacked")


def _greedy_tokens(policy: Policy, model: nn.Module, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    size = model.cfg.image_size
    images = torch.rand(1, 1, 3, size, size, generator=gen)
    ids = policy.text_ids("reach the goal")
    with torch.no_grad():
        return model.decode_tokens(
            model.prefill(model.build_prefix(model.encode_images(images), [ids]))
        )


def test_int8_action_tokens_agree_with_fp32(tiny_ar):
    # Measured on these 16 seeds (2026-12-03, torch 2.13 CPU): int8 agrees with fp32 on 0.871
    # of the 256 greedy action tokens; bf16 itself agrees with fp32 on 0.930. Decoding runs
    # free, so one flipped token changes the context of every later one: a per-position floor
    # of 0.8 leaves room for another CPU's kernel rounding while catching broken scales
    # (measured on the same seeds: all scales doubled agree on 0.004, each channel given its
    # neighbour's scale on 0.125).
    q = quantize_int8(tiny_ar.model)
    same = total = 0
    for seed in range(16):
        a, b = _greedy_tokens(tiny_ar, tiny_ar.model, seed), _greedy_tokens(tiny_ar, q, seed)
        same += int((a == b).sum())
        total += a.numel()
    assert total == 16 * tiny_ar.model.cfg.num_action_tokens
    assert same / total >= 0.8


def _head_output(model: nn.Module) -> torch.Tensor:
    """pi0: the actions of one inference; DiT: one noise prediction (its sampled actions are
    clipped to [-1, 1] and saturate at random weights, so they would compare nothing)."""
    gen = torch.Generator().manual_seed(0)
    if model.cfg.dit is not None:
        head = model.action_model
        cond = torch.randn(2, head.config.cond_dim, generator=gen)
        noisy = torch.randn(2, head.config.horizon, head.config.action_dim, generator=gen)
        with torch.no_grad():
            return head(noisy, torch.tensor([10, 500]), cond)
    images = torch.rand(1, 1, 3, model.cfg.image_size, model.cfg.image_size, generator=gen)
    ids = torch.randint(3, 200, (8,), generator=gen).tolist()
    noise = torch.randn(1, model.cfg.horizon, model.cfg.action_dim, generator=gen)
    return model.act(images, [ids], noise=noise)


@pytest.mark.parametrize("name", ["tiny-dit", "tiny-pi0"])
def test_action_heads_are_quantised_and_stay_close(name):
    model = Policy.from_preset(name, seed=0).model
    if model.cfg.dit is not None:  # zero-initialised output layer: give it weights to compare
        torch.nn.init.normal_(model.action_model.final_layer.linear.weight, std=0.5)
    q = quantize_int8(model)
    head = "action_model" if model.cfg.dit is not None else "action_expert"
    assert any(k.startswith(f"{head}.") for k in int8_layers(q))
    a, b = _head_output(model), _head_output(q)
    assert not torch.equal(a, b)
    # measured (seed 0): the largest error is 0.24% (pi0) and 0.9% (DiT) of the largest output
    assert (a - b).abs().max().item() <= 0.05 * a.abs().max().item()


def test_quantised_state_dict_round_trips_and_save_vla_refuses(tiny_ar, tmp_path):
    # The int8 layers' buffers are in the state dict: safetensors writes and reads them (each
    # tensor cloned: the loaded checkpoint's vision weights are views of one fused storage).
    q = quantize_int8(tiny_ar.model)
    save_file({k: v.clone() for k, v in q.state_dict().items()}, tmp_path / "int8.safetensors")
    assert {k for k in load_file(tmp_path / "int8.safetensors") if k.endswith("weight_int8")}
    other = quantize_int8(Policy.from_preset("tiny-ar", seed=1).model)
    other.load_state_dict(load_file(tmp_path / "int8.safetensors"), strict=True)
    state, loaded = q.state_dict(), other.state_dict()
    assert all(torch.equal(state[k], loaded[k]) for k in state)
    assert torch.equal(_greedy_tokens(tiny_ar, q, 0), _greedy_tokens(tiny_ar, other, 0))
    with pytest.raises(CheckpointError, match="float checkpoints"):
        save_vla(q, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_int8_is_a_setting_the_policy_takes(tiny_ar):
    from vlarun.policy.setting import AccelSetting

    s = AccelSetting.parse("triage:0.34+int8")
    assert s.weights == "int8" and s.token_budget == 0.34 and str(s) == "triage:0.34+int8"
    assert AccelSetting.from_meta(s.to_meta()) == s and s.to_meta()["weights"] == "int8"
    assert not AccelSetting(weights="int8").identity
    assert AccelSetting(weights="int8").key != AccelSetting().key
    with pytest.raises(ValueError, match="weights must be one of"):
        AccelSetting(weights="int4")
    with pytest.raises(ValueError, match="model transform"):
        AccelSetting(weights="int8").hooks("autoregressive")  # the runtime's path: refused
    fast = tiny_ar.with_setting("int8")
    assert len(int8_layers(fast.model)) == 7 * tiny_ar.model.cfg.llm.num_layers
    assert not int8_layers(tiny_ar.model) and fast.hooks is not None
    q = quantize_int8(tiny_ar.model)
    assert torch.equal(_greedy_tokens(tiny_ar, fast.model, 0), _greedy_tokens(tiny_ar, q, 0))
    size = tiny_ar.model.cfg.image_size
    frame = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    run = fast.run_stages(frame, "reach the goal")  # the stage graph runs the int8 model
    assert [t.name for t in run.timings] == ["vision", "prefill", "decode"]
    with pytest.raises(ValueError, match="already quantised"):
        fast.with_setting("int8")


def test_the_runtime_refuses_int8_rather_than_running_the_float_model():
    from vlarun.policy.setting import AccelSetting
    from vlarun.runtime.robot.agent import AgentConfig

    with pytest.raises(ValueError, match="not run by the robot / edge runtime"):
        AgentConfig(setting=AccelSetting(weights="int8"))
