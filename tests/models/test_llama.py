"""Parity of vlarun's decoder with transformers, and its cache modes against a full forward."""

import dataclasses

import pytest
import torch

from vlarun.models.llama import AttnProbe, LlamaConfig, LlamaLM, RopeScaling
from vlarun.models.static_step import expert_forward
from vlarun.models.token_plan import DeferredPlan, TokenAction, TokenPlan
from vlarun.parity import hf_llama

transformers = pytest.importorskip("transformers")

SHAPES = {
    "mha": LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=160,
        num_layers=3,
        num_heads=4,
        num_kv_heads=4,
        max_positions=128,
    ),
    "gqa": LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=160,
        num_layers=3,
        num_heads=8,
        num_kv_heads=2,
        max_positions=128,
    ),
    "mqa-llama3-rope": LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        max_positions=128,
        rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 32),
    ),
    "linear-rope": LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_positions=128,
        rope_scaling=RopeScaling("linear", 2.0),
    ),
    "gemma": LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        max_positions=128,
        rms_norm_eps=1e-6,
        mlp_act="gelu_tanh",
        gemma_norm=True,
        tie_embeddings=True,
    ),
}


def hf_model(cfg: LlamaConfig):
    return hf_llama(cfg)  # shared with `vlarun check-parity`: random weights, norms included


def ours_from(hf, cfg: LlamaConfig) -> LlamaLM:
    model = LlamaLM(cfg).eval()
    missing, unexpected = model.load_state_dict(hf.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if "lm_head" not in m or not cfg.tie_embeddings], missing
    return model


@pytest.mark.parametrize("name", list(SHAPES))
def test_logits_match_transformers(name):
    cfg = SHAPES[name]
    hf = hf_model(cfg)
    ours = ours_from(hf, cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 37))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got = ours.logits(ours(ours.embed(ids)).hidden)
    diff = (ref - got).abs().max().item()
    assert diff <= 1e-4, f"{name}: max abs diff {diff}"


def _model(name="gqa", seed=0) -> LlamaLM:
    torch.manual_seed(seed)
    return LlamaLM(SHAPES[name]).eval()


@pytest.mark.parametrize("name", ["mha", "gqa", "gemma"])
def test_prefill_then_decode_matches_full_forward(name):
    model = _model(name)
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = model(model.embed(ids)).hidden
        cache = model.new_cache(2, 64)
        pre = model(model.embed(ids[:, :12]), torch.arange(12), cache).hidden
        steps = [
            model(model.embed(ids[:, p : p + 1]), torch.tensor([p]), cache).hidden
            for p in range(12, 20)
        ]
        multi_cache = model.new_cache(2, 64)
        model(model.embed(ids[:, :12]), torch.arange(12), multi_cache)
        multi = model(model.embed(ids[:, 12:]), torch.arange(12, 20), multi_cache).hidden
    got = torch.cat([pre, *steps], dim=1)
    assert (got - full).abs().max().item() <= 1e-5
    assert (multi - full[:, 12:]).abs().max().item() <= 1e-5


def test_left_padding_matches_unpadded_row():
    model = _model()
    ids = torch.randint(0, 97, (1, 10))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    pad = torch.cat([torch.zeros(1, 4, dtype=torch.bool), torch.ones(1, 10, dtype=torch.bool)], 1)
    with torch.no_grad():
        ref = model(model.embed(ids)).hidden[:, -1]
        cache = model.new_cache(1, 32)
        got = model(model.embed(padded), torch.arange(14), cache, pad_mask=pad).hidden[:, -1]
        nxt = torch.randint(0, 97, (1, 1))
        ref2 = model(model.embed(torch.cat([ids, nxt], 1))).hidden[:, -1]
        got2 = model(model.embed(nxt), torch.tensor([14]), cache).hidden[:, -1]
    assert (ref - got).abs().max().item() <= 1e-5
    assert (ref2 - got2).abs().max().item() <= 1e-5


def test_full_token_plan_matches_plain_forward():
    model = _model()
    ids = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        plain = model(model.embed(ids), torch.arange(30), model.new_cache(2, 64)).hidden
        plan = TokenPlan.full(batch=2, vis_start=1, num_visual=20, last_shared_layer=0)
        out = model(model.embed(ids), torch.arange(30), model.new_cache(2, 64), plan=plan)
    assert out.index.shape == (2, 30)
    assert (out.hidden - plain).abs().max().item() <= 1e-5


def test_reuse_and_prune_plan_semantics():
    """Reusing a token whose input did not change equals recomputing it; pruning equals
    removing the token from deep layers only."""
    model = _model()
    ids = torch.randint(0, 97, (1, 24))
    vis = slice(2, 14)
    with torch.no_grad():
        cache = model.new_cache(1, 64)
        first = model(model.embed(ids), torch.arange(24), cache).hidden
        decisions = torch.zeros(1, 12, dtype=torch.int8)
        decisions[0, :6] = TokenAction.REUSE
        plan = TokenPlan(vis.start, decisions, last_shared_layer=1)
        out = model(model.embed(ids), torch.arange(24), cache, plan=plan)
        assert out.hidden.shape[1] == 24 - 6
        assert (out.hidden[:, -1] - first[:, -1]).abs().max().item() <= 1e-5
        # Prune 4 tokens: the last token's output changes (they vanish from deep layers).
        decisions = torch.zeros(1, 12, dtype=torch.int8)
        decisions[0, 8:] = TokenAction.PRUNE
        pruned = model(
            model.embed(ids), torch.arange(24), cache, plan=TokenPlan(vis.start, decisions, 1)
        )
        assert (pruned.hidden[:, -1] - first[:, -1]).abs().max().item() > 1e-4
        assert not cache.valid[2:, 0, 10:14].any() and cache.valid[:2, 0, 10:14].all()


def test_deferred_plan_equals_the_same_plan_given_upfront():
    """A plan decided after the shared layers (from that call's probe) runs exactly like the
    same plan passed in advance; decide() sees the shallow probe of this very call."""
    model = _model()
    ids = torch.randint(0, 97, (1, 24))
    decisions = torch.zeros(1, 12, dtype=torch.int8)
    decisions[0, :4], decisions[0, 8:] = TokenAction.REUSE, TokenAction.PRUNE
    probe = AttnProbe(layer=1, query_index=torch.tensor([23]), key_start=2, key_end=14)
    seen = []

    def decide(result):
        seen.append(result)
        return TokenPlan(2, decisions, last_shared_layer=1)

    with torch.no_grad():
        outs = []
        for plan in (TokenPlan(2, decisions, 1), DeferredPlan(1, decide)):
            cache = model.new_cache(1, 64)
            model(model.embed(ids), torch.arange(24), cache)
            outs.append(model(model.embed(ids), torch.arange(24), cache, plan=plan, probe=probe))
    assert (outs[0].hidden - outs[1].hidden).abs().max().item() == 0.0
    assert len(seen) == 1 and seen[0].probs.shape[2:] == (1, 12)
    assert (seen[0].probs - outs[0].probe.probs).abs().max().item() == 0.0
    with pytest.raises(ValueError, match="last_shared_layer"):
        bad = DeferredPlan(0, decide)
        model(model.embed(ids), torch.arange(24), model.new_cache(1, 64), plan=bad)


def test_tokens_pruned_from_deep_layers_stay_invisible_to_later_calls():
    """After a plan prunes tokens from the deep layers, a later call on the same cache (decode,
    an OFT head, a flow expert's prefix) must not see their stale deep K/V: validity differs by
    layer, so the mask must too."""
    model = _model()
    ids = torch.randint(0, 97, (1, 24))
    decisions = torch.zeros(1, 12, dtype=torch.int8)
    decisions[0, 4:] = TokenAction.PRUNE
    nxt = model.embed(torch.randint(0, 97, (1, 1)))
    outs = []
    with torch.no_grad():
        for scramble in (False, True):
            cache = model.new_cache(1, 64)
            model(model.embed(ids), torch.arange(24), cache)
            model(model.embed(ids), torch.arange(24), cache, plan=TokenPlan(2, decisions, 1))
            if scramble:  # garbage in the pruned slots of the deep layers must change nothing
                cache.k[2:, :, :, 6:14] = torch.randn_like(cache.k[2:, :, :, 6:14])
                cache.v[2:, :, :, 6:14] = torch.randn_like(cache.v[2:, :, :, 6:14])
            outs.append(model(nxt, torch.tensor([24]), cache).hidden)
            own = torch.ones(1, 1, dtype=torch.bool)
            prefix_out = expert_forward(model, nxt, torch.tensor([[24]]), cache, own)
            outs.append(prefix_out)
    assert (outs[0] - outs[2]).abs().max().item() <= 1e-6
    assert (outs[1] - outs[3]).abs().max().item() <= 1e-6


def test_reuse_without_cache_is_refused():
    model = _model()
    ids = torch.randint(0, 97, (1, 16))
    decisions = torch.full((1, 8), int(TokenAction.REUSE), dtype=torch.int8)
    with pytest.raises(ValueError, match="no cached K/V"):
        model(
            model.embed(ids),
            torch.arange(16),
            model.new_cache(1, 32),
            plan=TokenPlan(1, decisions, 0),
        )


def test_probe_matches_explicit_attention():
    cfg = SHAPES["gqa"]
    hf = hf_model(cfg)
    ours = ours_from(hf, cfg)
    ids = torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_attentions=True).attentions[1]  # (B, H, T, T)
        probe = AttnProbe(layer=1, query_index=torch.tensor([18, 19]), key_start=2, key_end=12)
        out = ours(ours.embed(ids), torch.arange(20), ours.new_cache(1, 32), probe=probe)
    assert out.probe.probs.shape == (1, 8, 2, 10)
    assert out.probe.values.shape == (1, 2, 10, cfg.hd)
    diff = (out.probe.probs - ref[:, :, 18:20, 2:12]).abs().max().item()
    assert diff <= 1e-5, diff


def test_skip_layers_equals_model_without_them():
    model = _model("mha")
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        skipped = model(model.embed(ids), skip_layers=frozenset({1})).hidden
        fewer_model = LlamaLM(dataclasses.replace(model.cfg, num_layers=2)).eval()
        state = {
            k.replace("layers.2.", "layers.1."): v
            for k, v in model.state_dict().items()
            if "layers.1." not in k
        }
        fewer_model.load_state_dict(state)
        fewer = fewer_model(fewer_model.embed(ids)).hidden
    assert (skipped - fewer).abs().max().item() <= 1e-6


def test_context_overflow_is_a_clear_error():
    model = _model()
    with pytest.raises(ValueError, match="exceeds the context"):
        model(model.embed(torch.zeros(1, 4, dtype=torch.long)), torch.arange(200, 204))


@pytest.mark.parametrize("name", ["gqa", "gemma"])
def test_prepacked_matches_plain(name):
    from vlarun.models.llama import PackedLinear

    model = _model(name)
    packed = _model(name).prepack()
    assert any(isinstance(m, PackedLinear) for m in packed.modules())
    assert set(packed.state_dict()) == set(model.state_dict())
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        c1, c2 = model.new_cache(2, 64), packed.new_cache(2, 64)
        a = model.logits(model(model.embed(ids), torch.arange(20), c1).hidden)
        b = packed.logits(packed(packed.embed(ids), torch.arange(20), c2).hidden)
        a2 = model.logits(model(model.embed(ids[:, :1]), torch.tensor([20]), c1).hidden)
        b2 = packed.logits(packed(packed.embed(ids[:, :1]), torch.tensor([20]), c2).hidden)
    assert (a - b).abs().max().item() <= 1e-4
    assert (a2 - b2).abs().max().item() <= 1e-4


def test_sdpa_fast_paths_only_when_the_mask_allows(monkeypatch):
    import vlarun.models.attn_context as attn_context

    seen, orig = [], attn_context.sdpa_mask

    def spy(mask):
        out = orig(mask)
        seen.append((out[0] is None, out[1]))
        return out

    monkeypatch.setattr(attn_context, "sdpa_mask", spy)
    model = _model()
    ids = torch.randint(0, 97, (1, 12))
    pad = torch.ones(1, 12, dtype=torch.bool)
    pad[0, :3] = False
    with torch.no_grad():
        cache = model.new_cache(1, 32)
        model(model.embed(ids), torch.arange(12), cache)  # plain prefill: is_causal, no mask
        model(model.embed(ids[:, :1]), torch.tensor([12]), cache)  # decode: all keys visible
        model(model.embed(ids), torch.arange(12), model.new_cache(1, 32), pad_mask=pad)
    assert seen == [(True, True), (True, False), (False, False)]
