"""RDT-1b: the cross-attending DiT head runs and its FLOP count is exact; the preset has the
published shape, its stages and packets, and refuses to become an executable policy."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vlarun.models.presets import get_preset
from vlarun.models.rdt_head import RDTConfig, RDTHead
from vlarun.models.vla import VLA
from vlarun.stages.families import Workload, build_graph, param_split

TINY = RDTConfig(
    hidden_size=32,
    num_layers=4,
    num_heads=4,
    horizon=6,
    action_dim=5,
    lang_dim=24,
    img_dim=16,
    img_tokens=18,
    state_dim=8,
    steps=3,
)


def _inputs(b: int = 2, lang: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    c = TINY
    return (
        torch.randn(b, lang, c.lang_dim, generator=g),
        torch.randn(b, c.img_tokens, c.img_dim, generator=g),
        torch.randn(b, c.action_dim, generator=g),
        torch.randn(b, c.horizon, c.action_dim, generator=g),
    )


def _head(seed: int = 0) -> RDTHead:
    torch.manual_seed(seed)
    head = RDTHead(TINY).eval()
    with torch.no_grad():  # the released init zeroes nothing we rely on; make every path live
        for p in head.parameters():
            p.normal_(0, 0.2)
    return head


def test_the_flop_count_is_what_torch_counts():
    head, (lang, img, state, noise) = _head(), _inputs(b=2, lang=7)
    # The math attention kernel is made of matmuls torch counts (the fused CPU one is not).
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        head.sample(lang, img, state, noise)
    assert counter.get_total_flops() == head.flops(2, 7)


def test_sampling_is_a_deterministic_chunk_that_reads_every_condition():
    head, (lang, img, state, noise) = _head(), _inputs()
    with torch.no_grad():
        out = head.sample(lang, img, state, noise)
        assert out.shape == noise.shape and torch.isfinite(out).all()
        assert torch.equal(out, head.sample(lang, img, state, noise))
        for changed in ((lang + 1, img, state), (lang, img + 1, state), (lang, img, state + 1)):
            assert not torch.allclose(out, head.sample(*changed, noise))


def test_a_masked_language_token_changes_nothing():
    head, (lang, img, state, noise) = _head(), _inputs(b=1, lang=5)
    mask = torch.tensor([[True, True, True, False, False]])
    other = lang.clone()
    other[:, 3:] = torch.randn(1, 2, TINY.lang_dim)
    with torch.no_grad():
        a = head.sample(lang, img, state, noise, lang_mask=mask)
        b = head.sample(other, img, state, noise, lang_mask=mask)
    torch.testing.assert_close(a, b)


def test_bad_shapes_are_named():
    head, (lang, img, state, noise) = _head(), _inputs()
    with pytest.raises(ValueError, match="image"):
        head.sample(lang, img[:, :-1], state, noise)
    with pytest.raises(ValueError, match="num_heads"):
        RDTConfig(
            hidden_size=30,
            num_layers=1,
            num_heads=4,
            horizon=2,
            action_dim=2,
            lang_dim=4,
            img_dim=4,
            img_tokens=4,
        )
    with pytest.raises(ValueError, match="unified"):
        RDTConfig(
            hidden_size=32,
            num_layers=1,
            num_heads=4,
            horizon=2,
            action_dim=200,
            lang_dim=4,
            img_dim=4,
            img_tokens=4,
        )


def test_the_preset_has_rdt_1bs_published_shape():
    """REFERENCE.md: DiT 28 L, hidden 2048, 32 heads, chunk 64, SigLIP So400m image tokens,
    T5-XXL language features, 5 steps, state/action dim 128; the paper calls the head 1.2B."""
    cfg = get_preset("rdt-1b")
    split = param_split(cfg)
    assert 1.15e9 < split["head"] < 1.25e9
    assert 4.6e9 < split["llm"] < 4.9e9  # T5-v1.1-XXL's encoder
    assert cfg.num_visual == 6 * 27 * 27 and cfg.horizon == 64 and cfg.action_dim == 128
    with pytest.raises(ValueError, match="no executable RDT"):
        VLA(cfg)


def test_its_stages_carry_the_image_features_to_the_head():
    cfg, w = get_preset("rdt-1b"), Workload(text_tokens=32)
    graph = build_graph(cfg, w=w)
    assert [s.name for s in graph.stages] == ["vision", "prefill", "denoise"]
    vision, encoder, head = graph.stages
    features = 4374 * 1152 * 2  # bf16 SigLIP features
    assert vision.out_bytes == features
    assert encoder.in_bytes > features and encoder.out_bytes > features  # carried through
    assert head.in_bytes >= features + 32 * 4096 * 2
    assert head.out_bytes == 64 * 128 * 4 and head.cost.passes == 5
    # the head's cross-attention re-projects 4374 image tokens in 14 blocks every pass
    assert head.cost.flops > 5 * 14 * 2 * 4374 * 2 * 2048 * 2048
    # the encoder reads the text alone: ~2 x params x tokens
    ratio = encoder.cost.flops / (2 * cfg.llm.num_params() * 32)
    assert 0.9 < ratio < 1.1


def test_a_preset_whose_parts_disagree_is_refused():
    import dataclasses

    cfg = get_preset("rdt-1b")
    with pytest.raises(ValueError, match="image tokens"):
        dataclasses.replace(cfg, num_images=3)
    with pytest.raises(ValueError, match="fit the head"):
        dataclasses.replace(cfg, max_text_tokens=2000)
    with pytest.raises(ValueError, match="rdt's alone"):
        dataclasses.replace(get_preset("pi0"), connector="none")
