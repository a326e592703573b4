"""Parity of vlarun.models.vit against Hugging Face SigLIP / DINOv2 / CLIP (tiny random models,
CPU)."""

import pytest
import torch
from safetensors.torch import load_file

from vlarun.models.vit import (
    IGNORED_HF_PREFIXES,
    FusedVisionBackbone,
    Projector,
    SingleVisionBackbone,
    ViTConfig,
    ViTEncoder,
    canonical_hf_state_dict,
    hf_to_timm_vit,
    openvla_vision_configs,
    siglip_to_clip_vit,
    timm_to_hf_vit,
)

transformers = pytest.importorskip("transformers")

TOL = 1e-4
CLIP_TOL = 1e-5  # issue 65's bound for LLaVA's tower features (fp32)
TINY = dict(
    image_size=32, patch_size=8, hidden_size=64, num_layers=3, num_heads=4, intermediate_size=128
)


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """HF inits biases to 0, layer scale to 1 and mask tokens to 0; randomise every parameter so
    a swapped or dropped weight cannot hide."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def hf_siglip() -> torch.nn.Module:
    torch.manual_seed(0)  # HF's own init draws from the global RNG
    cfg = transformers.SiglipVisionConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
    )
    return _perturb(transformers.SiglipVisionModel(cfg))


def hf_dinov2(registers: int = 0) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = dict(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        mlp_ratio=2,
    )
    if registers:
        cfg = transformers.Dinov2WithRegistersConfig(num_register_tokens=registers, **kw)
        return _perturb(transformers.Dinov2WithRegistersModel(cfg))
    return _perturb(transformers.Dinov2Model(transformers.Dinov2Config(**kw)))


def hf_clip(image_size: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.CLIPVisionConfig(
        image_size=image_size,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
    )
    return _perturb(transformers.CLIPVisionModel(cfg))


def hf_tower(kind: str, registers: int = 0) -> torch.nn.Module:
    return {"siglip": hf_siglip, "clip": hf_clip}.get(kind, lambda: hf_dinov2(registers))()


def ours(kind: str, registers: int = 0, **kw) -> ViTEncoder:
    return ViTEncoder(ViTConfig(kind=kind, num_registers=registers, **TINY, **kw)).eval()


def pixels(batch: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    return (a.float() - b.float()).abs().max().item()


def check_parity(hf: torch.nn.Module, model: ViTEncoder, prefix: int) -> None:
    x = pixels()
    with torch.no_grad():
        ref = hf(pixel_values=x, output_hidden_states=True)
        states = model.hidden_states(x)
        assert len(states) == len(ref.hidden_states)
        for i, (a, b) in enumerate(zip(states, ref.hidden_states, strict=True)):
            assert diff(a, b) <= TOL, f"hidden_states[{i}] max abs diff {diff(a, b):.3g}"
        d_last = diff(model.last_hidden_state(x), ref.last_hidden_state)
        d_feat = diff(model(x), ref.hidden_states[-2][:, prefix:])
    print(f"{type(hf).__name__}: last_hidden_state {d_last:.3g}, hidden_states[-2] {d_feat:.3g}")
    assert d_last <= TOL, f"last_hidden_state max abs diff {d_last:.3g}"
    assert d_feat <= TOL, f"forward vs hidden_states[-2] max abs diff {d_feat:.3g}"


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_siglip_parity(attn):
    hf, model = hf_siglip(), ours("siglip")
    hf.set_attn_implementation(attn)  # eager: HF's own matmul/softmax, not the kernel we call
    model.load_state_dict(hf.state_dict(), strict=True)
    check_parity(hf, model, prefix=0)
    assert next(iter(model.state_dict())).startswith("vision_model.")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("registers", [0, 4])
def test_dinov2_parity(registers, attn):
    hf, model = hf_dinov2(registers), ours("dinov2", registers)
    hf.set_attn_implementation(attn)
    model.load_state_dict(hf.state_dict(), strict=True)
    check_parity(hf, model, prefix=1 + registers)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("size", [32, 48])
def test_clip_parity(size, attn):
    """LLaVA's tower: every hidden state, the pooled CLS (the only use of post_layernorm) and
    LLaVA-1.5's features (hidden_states[-2] without CLS) at two image sizes, within 1e-5."""
    hf = hf_clip(size)
    hf.set_attn_implementation(attn)
    model = ViTEncoder(ViTConfig(kind="clip", **dict(TINY, image_size=size))).eval()
    model.load_state_dict(hf.state_dict(), strict=True)
    x = pixels(size=size)
    with torch.no_grad():
        ref = hf(pixel_values=x, output_hidden_states=True)
        states = model.hidden_states(x)
        d_states = max(diff(a, b) for a, b in zip(states, ref.hidden_states, strict=True))
        d_last = diff(model.last_hidden_state(x), ref.last_hidden_state)
        d_pool = diff(model.final_norm(states[-1][:, 0]), ref.pooler_output)
        d_feat = diff(model(x), ref.hidden_states[-2][:, 1:])
    print(
        f"CLIP {size}px {attn}: hidden_states {d_states:.3g}, last_hidden_state {d_last:.3g}, "
        f"pooled {d_pool:.3g}, features (layer -2, no CLS) {d_feat:.3g}"
    )
    assert len(states) == len(ref.hidden_states) == 4
    assert max(d_states, d_last, d_pool, d_feat) <= CLIP_TOL
    assert model(x).shape == (2, (size // 8) ** 2, 64)


def test_clip_tower_of_a_llava_checkpoint():
    """The tower's slice of a LlavaForConditionalGeneration (transformers >= 5 in-memory names,
    ``model.vision_tower.*``) loads, and with the MLP projector (``linear_1``/``linear_2`` as
    fc1/fc2) gives LLaVA's own image features: layer -2, CLS dropped, projected."""
    torch.manual_seed(0)
    vision = transformers.CLIPVisionConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
    )
    text = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    cfg = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=63)
    llava = _perturb(transformers.LlavaForConditionalGeneration(cfg))
    assert (cfg.vision_feature_layer, cfg.vision_feature_select_strategy) == (-2, "default")
    state = llava.state_dict()
    tower, proj = "model.vision_tower.", "model.multi_modal_projector."
    backbone = SingleVisionBackbone(ViTConfig(kind="clip", **TINY)).eval()
    backbone.featurizer.load_state_dict(
        {k[len(tower) :]: v for k, v in state.items() if k.startswith(tower)}, strict=True
    )
    projector = Projector(64, 96, fused=False).eval()
    projector.load_state_dict(
        {
            k[len(proj) :].replace("linear_", "fc"): v
            for k, v in state.items()
            if k.startswith(proj)
        },
        strict=True,
    )
    x = pixels()
    with torch.no_grad():
        # transformers 5: an output whose pooler_output lists each image's (N, d) features
        want = torch.stack(list(llava.model.get_image_features(pixel_values=x).pooler_output))
        got = projector(backbone.featurizer(x))
    d = diff(got, want)
    print(f"LLaVA image features: max abs diff {d:.3g}")
    assert d <= CLIP_TOL


@pytest.mark.parametrize(
    "kind,registers", [("siglip", 0), ("dinov2", 0), ("dinov2", 4), ("clip", 0)]
)
def test_save_pretrained_round_trip(tmp_path, kind, registers):
    hf = hf_tower(kind, registers)
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    model = ours(kind, registers)
    model.load_state_dict(state, strict=True)
    check_parity(hf, model, prefix=model.config.num_prefix_tokens)


def test_state_dict_keys_are_hf_checkpoint_names():
    sig, dino = ours("siglip"), ours("dinov2", 4)
    for key in (
        "vision_model.embeddings.patch_embedding.weight",
        "vision_model.embeddings.position_embedding.weight",
        "vision_model.encoder.layers.0.self_attn.q_proj.weight",
        "vision_model.encoder.layers.2.mlp.fc2.bias",
        "vision_model.post_layernorm.weight",
    ):
        assert key in sig.state_dict(), key
    for key in (
        "embeddings.cls_token",
        "embeddings.mask_token",
        "embeddings.position_embeddings",
        "embeddings.register_tokens",
        "embeddings.patch_embeddings.projection.weight",
        "encoder.layer.0.attention.attention.query.weight",
        "encoder.layer.0.attention.output.dense.bias",
        "encoder.layer.0.layer_scale1.lambda1",
        "layernorm.weight",
    ):
        assert key in dino.state_dict(), key
    assert "embeddings.register_tokens" not in ours("dinov2").state_dict()
    # A legacy SiglipModel checkpoint with the head and text tower loads strictly too.
    state = dict(
        sig.state_dict(),
        **{
            "vision_model.head.probe": torch.zeros(1, 1, 64),
            "text_model.embeddings.token_embedding.weight": torch.zeros(4, 64),
            "logit_scale": torch.zeros(1),
        },
    )
    ours("siglip").load_state_dict(state, strict=True)
    assert canonical_hf_state_dict(state, "siglip").keys() == sig.state_dict().keys()
    assert "vision_model.head." in IGNORED_HF_PREFIXES["siglip"]
    clip = ours("clip").state_dict()
    for key in (
        "vision_model.embeddings.class_embedding",
        "vision_model.embeddings.patch_embedding.weight",
        "vision_model.embeddings.position_embedding.weight",
        "vision_model.pre_layrnorm.weight",
        "vision_model.encoder.layers.2.self_attn.out_proj.bias",
        "vision_model.post_layernorm.bias",
    ):
        assert key in clip, key
    assert "vision_model.embeddings.patch_embedding.bias" not in clip  # CLIP's conv has no bias
    # A full CLIPModel checkpoint (text tower, projections, an old position_ids buffer) too.
    full = dict(
        clip,
        **{
            "vision_model.embeddings.position_ids": torch.arange(17)[None],
            "text_model.final_layer_norm.weight": torch.zeros(4),
            "visual_projection.weight": torch.zeros(4, 64),
            "text_projection.weight": torch.zeros(4, 4),
            "logit_scale": torch.zeros(()),
        },
    )
    ours("clip").load_state_dict(full, strict=True)


def test_feature_layer():
    x = pixels()
    model = ours("dinov2", 4)
    with torch.no_grad():
        states = model.hidden_states(x)
        last = ViTEncoder(ViTConfig(kind="dinov2", num_registers=4, feature_layer=-1, **TINY))
        last.load_state_dict(model.state_dict())
        assert torch.equal(last(x), model.last_hidden_state(x)[:, 5:])
        first = ViTEncoder(ViTConfig(kind="dinov2", num_registers=4, feature_layer=-4, **TINY))
        first.load_state_dict(model.state_dict())
        assert torch.equal(first(x), states[0][:, 5:])
    assert model(x).shape == (2, 16, 64)


def test_forward_skips_last_block():
    model = ours("siglip")
    calls = []
    for i, block in enumerate(model.blocks):
        block.register_forward_hook(lambda *_, i=i: calls.append(i))
    model(pixels())
    assert calls == [0, 1]


@pytest.mark.parametrize(
    "kind,registers", [("siglip", 0), ("dinov2", 0), ("dinov2", 4), ("clip", 0)]
)
def test_num_params_and_flops(kind, registers):
    model = ours(kind, registers)
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    cfg = model.config
    T, D, I = cfg.seq_len, 64, 128
    block = 2 * (4 * T * D * D + 2 * T * T * D + 2 * T * D * I)
    patch = 2 * 16 * 3 * 64 * D
    assert cfg.flops(batch=3) == 3 * (patch + 2 * block)  # feature_layer -2 runs 2 of 3 blocks
    assert cfg.flops(batch=1, layers=3) == patch + 3 * block


def test_real_sizes_param_counts():
    """Full-size OpenVLA towers, counted against HF models built on the meta device (no memory)."""
    dino, sig = openvla_vision_configs()
    with torch.device("meta"):
        hf_sig = transformers.SiglipVisionModel(
            transformers.SiglipVisionConfig(
                image_size=224,
                patch_size=14,
                hidden_size=1152,
                num_hidden_layers=27,
                num_attention_heads=16,
                intermediate_size=4304,
            )
        )
        hf_dino = transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(
                image_size=224,
                patch_size=14,
                hidden_size=1024,
                num_hidden_layers=24,
                num_attention_heads=16,
                mlp_ratio=4,
                num_register_tokens=4,
            )
        )
    hf_sig_n = sum(p.numel() for n, p in hf_sig.named_parameters() if not n.startswith("head."))
    assert sig.num_params() == hf_sig_n == 412_442_352  # So400m vision tower without its head
    assert dino.num_params() == sum(p.numel() for p in hf_dino.parameters()) == 303_233_024
    assert (dino.grid, sig.grid, sig.gelu_approximate) == (16, 16, "none")
    clip = ViTConfig.clip_large(336)
    with torch.device("meta"):
        hf_clip_l = transformers.CLIPVisionModel(
            transformers.CLIPVisionConfig(
                image_size=336,
                patch_size=14,
                hidden_size=1024,
                num_hidden_layers=24,
                num_attention_heads=16,
                intermediate_size=4096,
            )
        )
    # LLaVA-1.5's tower (openai/clip-vit-large-patch14-336): 577 tokens, 24 x 24 patches
    assert clip.num_params() == sum(p.numel() for p in hf_clip_l.parameters())
    assert (clip.seq_len, clip.grid, clip.feature_blocks) == (577, 24, 23)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible by patch_size"):
        ViTConfig(kind="dinov2", **dict(TINY, image_size=30))
    with pytest.raises(ValueError, match="divisible by patch_size"):
        ViTConfig(kind="siglip", **dict(TINY, image_size=TINY["patch_size"] - 1))
    # SigLIP floors, as its patch conv does (So400m/14 at 384 px: 27 x 27)
    assert ViTConfig.siglip_so400m(384).grid == 27
    with pytest.raises(ValueError, match="divisible by num_heads"):
        ViTConfig(kind="siglip", **dict(TINY, num_heads=5))
    with pytest.raises(ValueError, match="kind"):
        ViTConfig(kind="eva", **TINY)
    with pytest.raises(ValueError, match="num_registers"):
        ViTConfig(kind="clip", num_registers=4, **TINY)
    clip = ViTConfig(kind="clip", **TINY)
    assert (clip.gelu_approximate, clip.layer_norm_eps, clip.num_prefix_tokens) == (
        "quick",
        1e-5,
        1,
    )
    assert clip.image_mean == (0.48145466, 0.4578275, 0.40821073)
    assert ViTConfig(kind="siglip", **TINY).layer_norm_eps == 1e-6
    with pytest.raises(ValueError, match="feature_layer"):
        ViTConfig(kind="siglip", feature_layer=0, **TINY)
    assert ViTConfig(kind="siglip", **TINY).image_mean == (0.5, 0.5, 0.5)
    assert ViTConfig(kind="dinov2", **TINY).image_std == (0.229, 0.224, 0.225)


def test_input_validation():
    model = ours("siglip")
    with pytest.raises(ValueError, match=r"\(B, 3, 32, 32\) .*got shape \(1, 3, 48, 48\)"):
        model(torch.randn(1, 3, 48, 48))
    with pytest.raises(ValueError, match=r"got shape \(1, 4, 32, 32\)"):
        model(torch.randn(1, 4, 32, 32))
    with pytest.raises(ValueError, match="floating-point.*got dtype torch.uint8"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"got shape \(3, 32, 32\)"):
        model(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="images01 must be"):
        model.normalize(torch.rand(1, 3, 16, 16))


def test_normalize():
    img = torch.rand(2, 3, 32, 32)
    out = ours("dinov2").normalize(img)
    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1)
    torch.testing.assert_close(out, (img - mean) / std)
    torch.testing.assert_close(ours("siglip").normalize(img), img * 2 - 1)


def test_backbones_and_projector():
    dino = ViTConfig(kind="dinov2", num_registers=4, **TINY)
    sig = ViTConfig(kind="siglip", **dict(TINY, hidden_size=48, num_heads=3))
    fused = FusedVisionBackbone(dino, sig).eval()
    img = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        out = fused(img)
        assert out.shape == (2, 16, 64 + 48) and fused.embed_dim == 112
        torch.testing.assert_close(out[..., :64], fused.featurizer(fused.featurizer.normalize(img)))
        single = SingleVisionBackbone(sig).eval()
        assert single(img).shape == (2, 16, 48) and single.embed_dim == 48
    assert {k.split(".")[0] for k in fused.state_dict()} == {"featurizer", "fused_featurizer"}
    with pytest.raises(ValueError, match="grid"):
        FusedVisionBackbone(dino, ViTConfig(kind="siglip", **dict(TINY, patch_size=4)))

    for is_fused, names in [(True, {"fc1", "fc2", "fc3"}), (False, {"fc1", "fc2"})]:
        proj = Projector(112, 96, fused=is_fused)
        assert proj(out).shape == (2, 16, 96)
        assert {k.split(".")[0] for k in proj.state_dict()} == names
        assert proj.num_params() == sum(p.numel() for p in proj.parameters())
        macs = (112 * 448 + 448 * 96 + 96 * 96) if is_fused else (112 * 96 + 96 * 96)
        assert proj.flops(16) == 2 * 16 * macs
    assert Projector(112, 96, fused=True).fc1.weight.shape == (448, 112)


def test_fused_backbone_loads_nested_checkpoints():
    """Both towers inside FusedVisionBackbone load (a) HF in-memory names under the submodule
    prefixes and (b) an OpenVLA-style timm checkpoint (`vision_backbone.featurizer.*`, LayerScale
    renamed `scale_factor`, SigLIP `attn_pool.*` present), and the features match HF's."""
    hf_dino, hf_sig = hf_dinov2(4), hf_siglip()
    dino_cfg = ViTConfig(kind="dinov2", num_registers=4, **TINY)
    fused = FusedVisionBackbone(dino_cfg, ViTConfig(kind="siglip", **TINY)).eval()
    state = {f"featurizer.{k}": v for k, v in hf_dino.state_dict().items()}
    state |= {f"fused_featurizer.{k}": v for k, v in hf_sig.state_dict().items()}
    fused.load_state_dict(state, strict=True)

    openvla = {
        f"vision_backbone.featurizer.{k}": v
        for k, v in hf_to_timm_vit(hf_dino.state_dict(), "dinov2", "scale_factor").items()
    }
    openvla |= {
        f"vision_backbone.fused_featurizer.{k}": v
        for k, v in hf_to_timm_vit(hf_sig.state_dict(), "siglip").items()
    }
    openvla["vision_backbone.fused_featurizer.attn_pool.latent"] = torch.zeros(1, 1, 64)
    again = FusedVisionBackbone(dino_cfg, ViTConfig(kind="siglip", **TINY)).eval()
    for name in ("featurizer", "fused_featurizer"):
        prefix = f"vision_backbone.{name}."
        sub = {k[len(prefix) :]: v for k, v in openvla.items() if k.startswith(prefix)}
        getattr(again, name).load_state_dict(
            timm_to_hf_vit(sub, again.get_submodule(name).config.kind)
        )

    img = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        want = torch.cat(
            [
                hf_dino(
                    pixel_values=fused.featurizer.normalize(img), output_hidden_states=True
                ).hidden_states[-2][:, 5:],
                hf_sig(
                    pixel_values=fused.fused_featurizer.normalize(img), output_hidden_states=True
                ).hidden_states[-2],
            ],
            dim=-1,
        )
        d1, d2 = diff(fused(img), want), diff(again(img), want)
    assert d1 <= TOL and d2 <= TOL, f"fused vs HF max abs diff {d1:.3g} (HF names), {d2:.3g} (timm)"


@pytest.mark.parametrize("kind,registers", [("siglip", 0), ("dinov2", 0), ("dinov2", 4)])
@pytest.mark.parametrize("ls_name", ["gamma", "scale_factor"])
def test_timm_round_trip(kind, registers, ls_name):
    src = ours(kind, registers)
    _perturb(src)
    timm = hf_to_timm_vit(src.state_dict(), kind, ls_name=ls_name)
    D, N = 64, 16
    assert timm["blocks.0.attn.qkv.weight"].shape == (3 * D, D)
    assert "blocks.0.attn.proj.weight" in timm and "norm.weight" in timm
    assert "patch_embed.proj.weight" in timm
    if kind == "siglip":
        assert timm["pos_embed"].shape == (1, N, D) and "cls_token" not in timm
        timm["attn_pool.latent"] = torch.zeros(1, 1, D)  # present in real checkpoints, ignored
    else:
        assert timm["cls_token"].shape == (1, 1, D)
        assert timm["pos_embed"].shape == (1, N if registers else N + 1, D)
        assert f"blocks.0.ls1.{ls_name}" in timm and "mask_token" not in timm
        assert ("reg_token" in timm) == bool(registers)
    dst = ours(kind, registers)
    dst.load_state_dict(timm_to_hf_vit(timm, kind), strict=True)
    x = pixels()
    with torch.no_grad():
        assert diff(dst(x), src(x)) == 0.0
        assert diff(dst.last_hidden_state(x), src.last_hidden_state(x)) == 0.0
    with pytest.raises(KeyError, match="blocks.0.attn.bogus.weight"):
        timm_to_hf_vit(dict(timm, **{"blocks.0.attn.bogus.weight": torch.zeros(1)}), kind)
    with pytest.raises(KeyError, match="bogus"):
        hf_to_timm_vit(dict(src.state_dict(), bogus=torch.zeros(1)), kind)


def test_a_siglip_tower_starts_a_clip_tower():
    """siglip_to_clip_vit: exact where the towers agree (the conv bias folded into the patch
    positions gives the same patch embeddings, to fp32 rounding: the sum runs in another
    order; the blocks are copied), and what SigLIP lacks is left to the CLIP tower's own
    initialisation."""
    sig, clip = _perturb(ours("siglip")), ours("clip")
    missing = clip.load_state_dict(siglip_to_clip_vit(sig.state_dict()), strict=False)
    assert (
        sorted(missing.missing_keys)
        == [
            "vision_model.embeddings.class_embedding",
            "vision_model.pre_layrnorm.bias",
            "vision_model.pre_layrnorm.weight",
        ]
        and not missing.unexpected_keys
    )
    x = pixels()
    with torch.no_grad():
        # a few ulp of values up to ~4 (1.2e-6 seen beside two CPU burners); a wrong fold is O(1)
        assert diff(clip.embed(x)[:, 1:], sig.embed(x)) <= 1e-5
    a, b = clip.blocks[2].state_dict(), sig.blocks[2].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_timm_names_refuse_clip():
    """OpenVLA's timm layouts have no CLIP tower: refused by name, not mis-renamed."""
    with pytest.raises(ValueError, match="kind must be one of"):
        hf_to_timm_vit(ours("clip").state_dict(), "clip")
    with pytest.raises(ValueError, match="kind must be one of"):
        timm_to_hf_vit({}, "clip")


def test_bf16_close_to_fp32():
    hf = hf_dinov2(4)
    model = ours("dinov2", 4)
    model.load_state_dict(hf.state_dict())
    x = pixels()
    with torch.no_grad():
        ref = model(x)
        out = model.to(torch.bfloat16)(x)
    assert out.dtype == torch.bfloat16
    rel = diff(out, ref) / ref.abs().max().item()
    assert rel < 0.05, f"bf16 vs fp32 max abs diff relative to max |x|: {rel:.3g}"
