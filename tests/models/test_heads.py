"""Tests for vlarun/models/heads.py: OpenVLA tokens + norm stats, OFT L1 head, CogACT DiT/DDIM."""

import json
import math

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vlarun.models.heads import (
    ActionTokenizer,
    DiTConfig,
    DiTHead,
    L1RegressionHead,
    NormStats,
    OFTHeadConfig,
    alphas_cumprod,
    ddim_sample_loop,
    ddim_timesteps,
    empty_action_embeddings,
)


def _descend(params, loss_fn, steps: int, lr: float) -> None:
    """Plain gradient descent. (torch.optim would import torch._dynamo, ~2 s on first use.)"""
    params = list(params)
    for i in range(steps):
        for p in params:
            p.grad = None
        loss_fn(i).backward()
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad


# ----------------------------------------------------------------------------------------------
# (a) ActionTokenizer

LLAMA2_VOCAB = 32000
HALF_BIN = 1.0 / 255  # edges are 2/255 apart; a bin center is at most half that from any point


def test_tokenizer_hand_example() -> None:
    # OpenVLA: bins = linspace(-1, 1, 256), edge k at -1 + 2k/255; d = digitize(a, bins) is the
    # 1-based index of the first edge > a (256 for a == 1); id = 32000 - d.
    #   a = -1.0: edge 0 == a, edge 1 > a                  -> d = 1   -> 31999
    #   a =  0.0: a sits at 127.5 edge widths              -> d = 128 -> 31872
    #   a =  1.0: equals the last edge                     -> d = 256 -> 31744
    #   a =  0.5: 1.5 / (2/255) = 191.25 edge widths       -> d = 192 -> 31808
    #   a = -0.5: 0.5 / (2/255) = 63.75 edge widths        -> d = 64  -> 31936
    tok = ActionTokenizer(LLAMA2_VOCAB)
    ids = tok.encode(np.array([-1.0, 0.0, 1.0, 0.5, -0.5]))
    np.testing.assert_array_equal(ids, [31999, 31872, 31744, 31808, 31936])
    assert ids.dtype == np.int64
    # Decoding: center index = clip(32000 - id - 1, 0, 254); center i = -1 + (i + 0.5) * 2/255.
    #   31999 -> 0 -> -1 + 1/255; 31872 -> 127 -> 0 exactly; 31744 -> 255 clipped to 254;
    #   31808 -> 191 -> -1 + 383/255.
    expected = [-1 + 1 / 255, 0.0, -1 + 509 / 255, -1 + 383 / 255, -1 + 127 / 255]
    np.testing.assert_allclose(tok.decode(ids), expected, rtol=0, atol=1e-15)


def test_tokenizer_ids_are_the_last_256_and_out_of_range_clips() -> None:
    tok = ActionTokenizer(LLAMA2_VOCAB)
    dense = np.linspace(-1.0, 1.0, 100_001)
    ids = tok.encode(dense)
    assert set(ids.tolist()) == set(range(LLAMA2_VOCAB - 256, LLAMA2_VOCAB))
    assert tok.action_ids == range(31744, 32000)
    assert tok.action_token_begin_idx == 31743  # OpenVLA-OFT's ACTION_TOKEN_BEGIN_IDX
    np.testing.assert_array_equal(tok.encode(np.array([-7.0, 3.0])), [31999, 31744])
    # A non-action id (the model emitted text) decodes onto the nearest end bin, as in OpenVLA.
    np.testing.assert_array_equal(tok.decode(np.array([5, 32000])), tok.bin_centers[[-1, 0]])


def test_tokenizer_round_trip_lands_on_bin_centers() -> None:
    tok = ActionTokenizer(LLAMA2_VOCAB)
    a = np.random.default_rng(0).uniform(-1, 1, size=(64, 7))
    a[0, :3] = [-1.0, 1.0, 0.0]
    out = tok.decode(tok.encode(a))
    assert out.shape == a.shape and out.dtype == np.float64
    assert np.max(np.abs(out - a)) <= HALF_BIN + 1e-12
    assert np.isin(out, tok.bin_centers).all()
    np.testing.assert_allclose(tok.bin_centers, -1 + (np.arange(255) + 0.5) * 2 / 255, atol=1e-15)


def test_tokenizer_torch_path_matches_numpy_bitwise() -> None:
    tok = ActionTokenizer(LLAMA2_VOCAB)
    a = np.concatenate(
        [
            np.random.default_rng(1).uniform(-1.2, 1.2, 500),
            tok.bins,  # exactly on edges (float64)
            np.nextafter(tok.bins, -2),  # just below each edge
        ]
    )
    for arr in (a, a.astype(np.float32)):
        ids_t = tok.encode(torch.from_numpy(arr))
        assert isinstance(ids_t, torch.Tensor) and ids_t.dtype == torch.int64
        np.testing.assert_array_equal(ids_t.numpy(), tok.encode(arr))
        np.testing.assert_array_equal(tok.decode(ids_t).numpy(), tok.decode(tok.encode(arr)))


def test_tokenizer_from_openvla_config_and_validation() -> None:
    cfg = {"text_config": {"vocab_size": 32064}, "pad_to_multiple_of": 64, "n_action_bins": 256}
    tok = ActionTokenizer.from_openvla_config(cfg)
    assert tok.vocab_size == 32000 and tok.n_bins == 256
    with pytest.raises(ValueError, match="n_bins"):
        ActionTokenizer(100, n_bins=1)
    with pytest.raises(ValueError, match="min_action"):
        ActionTokenizer(100, min_action=1.0, max_action=-1.0)
    with pytest.raises(ValueError, match="vocab_size"):
        ActionTokenizer(100, n_bins=256)


# ----------------------------------------------------------------------------------------------
# (a) NormStats

STATS = {
    "q01": [-0.5, -1.0, 0.0, 2.0],
    "q99": [0.5, 3.0, 1.0, 2.0],
    "mask": [True, True, True, False],
    "mean": [0.0, 1.0, 0.5, 2.0],
    "std": [0.2, 1.0, 0.3, 0.0],
    "min": [-0.9, -2.0, 0.0, 2.0],
    "max": [0.9, 4.0, 1.0, 2.0],
}


def test_unnormalize_formula_and_mask_pass_through() -> None:
    ns = NormStats.from_json_dict(STATS)
    a = np.random.default_rng(2).uniform(-1, 1, size=(5, 4))
    out = ns.unnormalize(a)
    q01, q99 = np.array(STATS["q01"]), np.array(STATS["q99"])
    want = 0.5 * (a + 1) * (q99 - q01) + q01
    np.testing.assert_array_equal(out[:, :3], want[:, :3])  # bit for bit: same op order
    np.testing.assert_array_equal(out[:, 3], a[:, 3])  # mask False: untouched
    np.testing.assert_allclose(ns.unnormalize(np.array([-1.0, 1, -1, 0.3])), [-0.5, 3, 0, 0.3])
    # Torch tensors take the same path on their own device/dtype.
    out_t = ns.unnormalize(torch.from_numpy(a))
    np.testing.assert_allclose(out_t.numpy(), out, rtol=0, atol=1e-15)
    # OFT's variant: min/max bounds and a 1e-8 guard on the range.
    mm = ns.unnormalize(a, bounds="minmax", range_eps=1e-8)
    lo, hi = np.array(STATS["min"]), np.array(STATS["max"])
    np.testing.assert_array_equal(mm[:, :3], (0.5 * (a + 1) * (hi - lo + 1e-8) + lo)[:, :3])


def test_normalize_inverts_clips_and_zeroes_unused_dims() -> None:
    ns = NormStats.from_json_dict(STATS)
    a = np.random.default_rng(3).uniform(-1, 1, size=(6, 4))
    back = ns.normalize(ns.unnormalize(a))
    np.testing.assert_allclose(back[:, :3], a[:, :3], atol=1e-7)  # 1e-8 guard in denominator
    np.testing.assert_array_equal(back[:, 3], 0.0)  # min == max: OpenVLA maps unused dims to 0
    far = ns.normalize(np.array([10.0, -10.0, 0.5, 2.0]))
    np.testing.assert_allclose(far, [1.0, -1.0, 0.0, 0.0], atol=1e-7)
    with pytest.raises(ValueError, match="minmax"):
        NormStats(q01=[0.0], q99=[1.0]).unnormalize(np.zeros(1), bounds="minmax")


def test_normstats_json_round_trip_and_defaults() -> None:
    ns = NormStats.from_json_dict(STATS)
    again = NormStats.from_json_dict(json.loads(json.dumps(ns.to_json_dict())))
    assert again == ns and hash(again) == hash(ns)
    assert ns.to_json_dict() == STATS
    bare = NormStats(q01=np.array([0.0, 1.0]), q99=np.array([1.0, 2.0]))
    assert bare.mask == (True, True) and bare.action_dim == 2
    assert set(bare.to_json_dict()) == {"q01", "q99", "mask"}
    with pytest.raises(ValueError, match="mask has 1 entries"):
        NormStats(q01=[0.0, 0.0], q99=[1.0, 1.0], mask=[True])
    with pytest.raises(ValueError, match="q99 < q01"):
        NormStats(q01=[1.0], q99=[0.0])
    with pytest.raises(ValueError, match="q01"):
        NormStats.from_json_dict({"mean": [0.0]})


def test_normstats_select() -> None:
    one = {"bridge_orig": {"action": STATS, "proprio": {}, "num_transitions": 10}}
    assert NormStats.select(one) == NormStats.from_json_dict(STATS)
    assert NormStats.select(one, "bridge_orig") == NormStats.from_json_dict(STATS)
    two = {"bridge_orig": {"action": STATS}, "fractal20220817_data": {"action": STATS}}
    with pytest.raises(ValueError, match="bridge_orig, fractal20220817_data"):
        NormStats.select(two)
    with pytest.raises(ValueError, match="'libero'.*bridge_orig, fractal20220817_data"):
        NormStats.select(two, "libero")
    assert NormStats.select(two, "fractal20220817_data").action_dim == 4
    with pytest.raises(ValueError, match="empty"):
        NormStats.select({})


# ----------------------------------------------------------------------------------------------
# (b) OFT head

OFT = OFTHeadConfig(llm_dim=16, action_dim=3, chunk=2, hidden_dim=32)


def test_oft_shapes_and_step_major_grouping() -> None:
    torch.manual_seed(0)
    head = L1RegressionHead(OFT)
    hidden = torch.randn(2, OFT.num_action_tokens, OFT.llm_dim)
    out = head(hidden)
    assert out.shape == (2, OFT.chunk, OFT.action_dim)
    # Tokens k*D .. k*D + D - 1 belong to chunk step k: touching token D (step 1) leaves step 0.
    poked = hidden.clone()
    poked[:, OFT.action_dim] += 1.0
    out2 = head(poked)
    assert torch.equal(out2[:, 0], out[:, 0]) and not torch.allclose(out2[:, 1], out[:, 1])
    with pytest.raises(ValueError, match="expected hidden"):
        head(hidden[:, :-1])
    emb = empty_action_embeddings(2, OFT.num_action_tokens, 16, torch.bfloat16)
    assert emb.shape == (2, 6, 16) and emb.dtype == torch.bfloat16 and not emb.any()


def test_oft_loss_decreases_on_fixed_target() -> None:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    head = L1RegressionHead(OFT)
    hidden = torch.randn(4, OFT.num_action_tokens, OFT.llm_dim, generator=g)
    target = torch.rand(4, OFT.chunk, OFT.action_dim, generator=g) * 2 - 1
    first = head.loss(hidden, target).item()
    _descend(head.parameters(), lambda _: head.loss(hidden, target), steps=40, lr=0.05)
    assert head.loss(hidden, target).item() < 0.3 * first  # seeds 0-4 reach 0.12-0.17
    # The loss is the mean absolute error, nothing else.
    assert torch.allclose(head.loss(hidden, target), (head(hidden) - target).abs().mean())


def test_oft_counts() -> None:
    head = L1RegressionHead(OFT)
    d_in, h, D = OFT.action_dim * OFT.llm_dim, OFT.hidden_dim, OFT.action_dim
    # norm1 + fc1 + 2 * (norm + fc) + norm2 + fc2
    want = 2 * d_in + (d_in * h + h) + 2 * (2 * h + h * h + h) + 2 * h + (h * D + D)
    assert head.num_params() == want
    with FlopCounterMode(display=False) as counter:
        head(torch.randn(5, OFT.num_action_tokens, OFT.llm_dim))
    assert head.flops(5) == counter.get_total_flops()
    with pytest.raises(ValueError, match="chunk"):
        OFTHeadConfig(llm_dim=16, action_dim=3, chunk=0, hidden_dim=32)


# ----------------------------------------------------------------------------------------------
# (c) DiT head and DDIM

DIT = DiTConfig(cond_dim=16, action_dim=3, horizon=4, hidden_size=32, num_layers=2, num_heads=4)
# Without the final clamp to [-1, 1], so that differences between samples are not clipped away.
DIT_RAW = DiTConfig(16, 3, 4, 32, 2, 4, clip_sample=False)


def _randomized_head(config: DiTConfig = DIT_RAW, seed: int = 0) -> DiTHead:
    """A head whose output depends on its input: DiT zero-inits the read-out, so fresh heads
    predict eps = 0 whatever the features are."""
    torch.manual_seed(seed)
    head = DiTHead(config)
    torch.nn.init.normal_(head.final_layer.linear.weight, std=0.1)
    return head.eval()


def test_alphas_cumprod_closed_forms() -> None:
    T = 100
    ab = alphas_cumprod(T, "squaredcos_cap_v2")
    assert ab.dtype == torch.float64 and ab.shape == (T,)

    # The product of 1 - beta_i = f((i+1)/T) / f(i/T) telescopes to f((t+1)/T) / f(0), with
    # f(s) = cos((s + 0.008)/1.008 * pi/2)^2, as long as no beta hits the 0.999 cap; only the
    # last one does (f(1) ~ 0), where diffusers and guided-diffusion both use 1 - 0.999.
    def f(s: float) -> float:
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    closed = torch.tensor([f((t + 1) / T) / f(0) for t in range(T - 1)], dtype=torch.float64)
    torch.testing.assert_close(ab[:-1], closed, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(ab[-1], ab[-2] * 0.001, rtol=1e-12, atol=0)

    # Linear: DDPM's betas 1e-4 .. 0.02 over 1000 steps, rescaled by 1000/T.
    lin = alphas_cumprod(50, "linear")
    betas = [20 * (1e-4 + (0.02 - 1e-4) * i / 49) for i in range(50)]
    torch.testing.assert_close(lin, torch.tensor(np.cumprod([1 - b for b in betas])))
    with pytest.raises(ValueError, match="unknown beta schedule"):
        alphas_cumprod(10, "cosine")


def test_ddim_timesteps() -> None:
    # diffusers "leading" spacing, timesteps = arange(steps) * (T // steps), reversed; equal to
    # CogACT's stride rule whenever steps divides T.
    for steps in (2, 4, 5, 10, 20, 25, 50, 100):
        leading = (np.arange(steps) * (100 // steps))[::-1].tolist()
        assert ddim_timesteps(100, steps) == leading
    assert ddim_timesteps(100, 10) == [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]
    assert ddim_timesteps(100, 100) == list(range(99, -1, -1))
    # Where they differ, CogACT takes the smallest stride s with len(range(0, T, s)) == steps.
    assert ddim_timesteps(100, 7) == [90, 75, 60, 45, 30, 15, 0]
    assert ddim_timesteps(100, 3) == [68, 34, 0]
    assert ddim_timesteps(100, 1) == [50]
    with pytest.raises(ValueError, match="valid step counts: .*34, 50, 100"):
        ddim_timesteps(100, 40)
    with pytest.raises(ValueError, match="unreachable|not reachable"):
        DiTConfig(16, 3, 4, 32, 2, 4, ddim_steps=40)


@pytest.mark.parametrize("steps", [1, 7, 10, 100])
@pytest.mark.parametrize("clip", [False, True])
def test_ddim_recovers_x0_with_an_oracle_denoiser(steps: int, clip: bool) -> None:
    # If the denoiser returns the exact noise that x_t holds relative to a known x0,
    # eps = (x_t - sqrt(a_t) x0) / sqrt(1 - a_t), then every DDIM step predicts x0 exactly and
    # x_prev = sqrt(a') x0 + sqrt(1 - a') eps stays on the same deterministic trajectory; the last
    # step (a' = 1) returns x0 itself, from any starting noise and any number of steps.
    ab = alphas_cumprod(100)
    g = torch.Generator().manual_seed(steps)
    x0 = torch.rand(3, 4, 2, generator=g, dtype=torch.float64) * 2 - 1
    noise = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
    seen: list[int] = []

    def oracle(x: torch.Tensor, t: torch.Tensor, step: int) -> torch.Tensor:
        assert step == len(seen) and t.shape == (3,) and t.dtype == torch.long
        seen.append(int(t[0]))
        a = ab[t].view(-1, 1, 1)
        return (x - a.sqrt() * x0) / (1 - a).sqrt()

    out = ddim_sample_loop(oracle, noise, ab, ddim_timesteps(100, steps), clip_denoised=clip)
    assert seen == ddim_timesteps(100, steps)
    torch.testing.assert_close(out, x0, rtol=0, atol=1e-10)


def test_dit_shapes_and_zero_init_closed_form() -> None:
    torch.manual_seed(0)
    head = DiTHead(DIT).eval()
    B = 2
    noisy, cond = torch.randn(B, DIT.horizon, DIT.action_dim), torch.randn(B, DIT.cond_dim)
    eps = head(noisy, torch.tensor([0, 99]), cond)
    assert eps.shape == (B, DIT.horizon, DIT.action_dim)
    assert not eps.any()  # DiT's zero-initialized read-out
    # With eps = 0 every DDIM step rescales: x0 = x / sqrt(a), x_prev = sqrt(a') x0, so the
    # chain telescopes to noise / sqrt(alpha_bar(first visited timestep)).
    unclipped = DiTHead(DIT_RAW)
    noise = torch.randn(B, DIT.horizon, DIT.action_dim)
    want = noise / math.sqrt(alphas_cumprod(100)[90].item())
    torch.testing.assert_close(unclipped.sample(cond, noise=noise), want)
    assert head.sample(cond, noise=noise).abs().max() <= 1.0  # clip_sample (CogACT's np.clip)
    with pytest.raises(ValueError, match="expected noisy"):
        head(noisy[:, :2], torch.tensor([0, 1]), cond)


def test_dit_sample_is_deterministic_given_noise() -> None:
    head = _randomized_head()
    cond = torch.randn(2, DIT.cond_dim)
    noise = torch.randn(2, DIT.horizon, DIT.action_dim)
    a = head.sample(cond, noise=noise)
    assert a.shape == (2, DIT.horizon, DIT.action_dim)
    assert torch.equal(a, head.sample(cond, noise=noise))
    assert not torch.allclose(a, head.sample(cond, noise=torch.randn_like(noise)))
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(head.sample(cond, generator=g1), head.sample(cond, generator=g2))
    assert not torch.allclose(head.sample(cond, steps=5, noise=noise), a)


def test_feature_cache_hook() -> None:
    head = _randomized_head()
    cond = torch.randn(2, DIT.cond_dim)
    noise = torch.randn(2, DIT.horizon, DIT.action_dim)
    plain = head.sample(cond, noise=noise)

    calls: list[tuple[int, int, str]] = []

    def pass_through(step, layer, kind, compute):
        calls.append((step, layer, kind))
        return compute()

    assert torch.equal(head.sample(cond, noise=noise, feature_cache=pass_through), plain)
    want_calls = [(s, i, k) for s in range(10) for i in range(2) for k in ("attn", "mlp")]
    assert calls == want_calls

    class FreezeAtStep0:
        """Computes every branch at step 0 and reuses it for all later steps."""

        def __init__(self) -> None:
            self.store: dict[tuple[int, str], torch.Tensor] = {}
            self.computed = 0

        def __call__(self, step, layer, kind, compute):
            if step == 0:
                self.store[(layer, kind)] = compute()
                self.computed += 1
            return self.store[(layer, kind)]

    frozen = FreezeAtStep0()
    cached = head.sample(cond, noise=noise, feature_cache=frozen)
    assert frozen.computed == 2 * DIT.num_layers  # nothing recomputed after step 0
    assert cached.shape == plain.shape and not torch.allclose(cached, plain)


def test_dit_training_reduces_loss_on_a_fixed_batch() -> None:
    torch.manual_seed(0)
    head = DiTHead(DIT)
    g = torch.Generator().manual_seed(0)
    actions = torch.rand(8, DIT.horizon, DIT.action_dim, generator=g) * 2 - 1
    cond = torch.randn(8, DIT.cond_dim, generator=g)

    def eval_loss() -> float:  # same timesteps and noise every time
        with torch.no_grad():
            return head.loss(actions, cond, generator=torch.Generator().manual_seed(123)).item()

    first = eval_loss()

    def train_loss(i: int) -> torch.Tensor:  # fresh timesteps and noise each step
        return head.loss(actions, cond, generator=torch.Generator().manual_seed(i))

    _descend(head.parameters(), train_loss, steps=60, lr=0.05)
    assert eval_loss() < 0.7 * first  # seeds 0-4 reach 0.35-0.54


def test_dit_classifier_free_guidance() -> None:
    cfg = DiTConfig(16, 3, 4, 32, 2, 4, cfg_dropout=0.5, clip_sample=False)
    head = _randomized_head(cfg)
    cond = torch.randn(2, cfg.cond_dim)
    noise = torch.randn(2, cfg.horizon, cfg.action_dim)
    assert torch.equal(
        head.sample(cond, noise=noise, cfg_scale=1.0), head.sample(cond, noise=noise)
    )
    guided = head.sample(cond, noise=noise, cfg_scale=1.5)
    assert guided.shape == noise.shape and not torch.allclose(
        guided, head.sample(cond, noise=noise)
    )
    head.loss(torch.zeros(4, 4, 3), torch.randn(4, 16), torch.Generator().manual_seed(0)).backward()
    assert head.z_embedder.uncondition.grad is not None  # dropped conditions train it
    with pytest.raises(ValueError, match="cfg_dropout"):
        _randomized_head().sample(cond, cfg_scale=1.5)


def test_dit_counts_and_checkpoint_names() -> None:
    head = DiTHead(DIT)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        head.sample(torch.randn(3, DIT.cond_dim), steps=5)  # math SDPA: attention as bmm
    assert head.flops(3, 5) == counter.get_total_flops()
    assert head.flops(3, 5, cfg=True) == 2 * head.flops(3, 5)
    assert head.num_params() == sum(p.numel() for p in head.parameters())

    big = DiTConfig.cogact("DiT-B")
    assert (big.horizon, big.hidden_size, big.num_layers, big.num_heads) == (16, 768, 12, 12)
    assert (big.num_train_timesteps, big.ddim_steps, big.beta_schedule) == (
        100,
        10,
        "squaredcos_cap_v2",
    )
    with torch.device("meta"):
        keys = set(DiTHead(big).state_dict())
    for key in (
        "x_embedder.linear.weight",
        "t_embedder.mlp.0.weight",
        "t_embedder.mlp.2.weight",
        "z_embedder.linear.weight",
        "z_embedder.uncondition",
        "positional_embedding",
        "blocks.11.attn.qkv.weight",
        "blocks.11.attn.proj.weight",
        "blocks.11.mlp.fc1.weight",
        "blocks.11.mlp.fc2.weight",
        "final_layer.linear.weight",
    ):
        assert key in keys, key
    with pytest.raises(ValueError, match="divisible"):
        DiTConfig(16, 3, 4, 30, 2, 4)
    with pytest.raises(ValueError, match="cfg_dropout"):
        DiTConfig(16, 3, 4, 32, 2, 4, cfg_dropout=1.0)
