"""The real VLAs' shapes (from shared/REFERENCE.md and the models' public configs): for cost
modelling, FLOP counts and random-weight benchmarks at true size; nothing here downloads weights.
"""

from __future__ import annotations

import dataclasses

from vlarun.models.emu3_vq import VQConfig, VQImageTokens
from vlarun.models.fast_head import FastConfig
from vlarun.models.flow_expert import FlowExpertConfig
from vlarun.models.heads import DiTConfig, OFTHeadConfig
from vlarun.models.llama import LlamaConfig
from vlarun.models.rdt_head import RDTConfig
from vlarun.models.vit import ViTConfig, openvla_vision_configs
from vlarun.models.vla import VLAConfig

# -- language models ----------------------------------------------------------------------------

LLAMA2_7B = LlamaConfig(
    vocab_size=32064,  # OpenVLA pads Llama-2's 32000 to a multiple of 64
    hidden_size=4096,
    intermediate_size=11008,
    num_layers=32,
    num_heads=32,
    num_kv_heads=32,
    rms_norm_eps=1e-6,
    max_positions=2048,
)
GEMMA_2B = LlamaConfig(
    vocab_size=257152,
    hidden_size=2048,
    intermediate_size=16384,
    num_layers=18,
    num_heads=8,
    num_kv_heads=1,
    head_dim=256,
    rms_norm_eps=1e-6,
    max_positions=8192,
    mlp_act="gelu_tanh",
    gemma_norm=True,
    tie_embeddings=True,
)
GEMMA_300M_EXPERT = LlamaConfig(
    vocab_size=1,
    hidden_size=1024,
    intermediate_size=4096,
    num_layers=18,
    num_heads=8,
    num_kv_heads=1,
    head_dim=256,
    rms_norm_eps=1e-6,
    max_positions=8192,
    mlp_act="gelu_tanh",
    gemma_norm=True,
    tie_embeddings=True,
)
SMOLVLM2_TEXT_16 = LlamaConfig(  # SmolVLM2-500M text model, first 16 of 32 layers kept
    vocab_size=49280,
    hidden_size=960,
    intermediate_size=2560,
    num_layers=16,
    num_heads=15,
    num_kv_heads=5,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,  # SmolVLA rotates with its own apply_rope at 10000 (config: 100000)
    max_positions=8192,
    tie_embeddings=True,
)
SMOLVLA_EXPERT = LlamaConfig(  # 0.75 x width; the VLM's layers, heads and head_dim
    vocab_size=1,
    hidden_size=720,
    intermediate_size=2048,
    num_layers=16,
    num_heads=15,
    num_kv_heads=5,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_positions=8192,
)


# RDT-1b's language encoder: T5-v1.1-XXL's encoder (google/t5-v1_1-xxl: d_model 4096, d_ff
# 10240 gated-GELU, 24 layers, 64 heads of 64). As a LlamaConfig it has the same matmul shapes
# (its relative position bias is not rope, which the cost model does not count); one table
# of 32128 embeddings and no LM head.
T5_XXL_ENCODER = LlamaConfig(
    vocab_size=32128,
    hidden_size=4096,
    intermediate_size=10240,
    num_layers=24,
    num_heads=64,
    num_kv_heads=64,
    head_dim=64,
    rms_norm_eps=1e-6,
    max_positions=1024,
    mlp_act="gelu_tanh",
    tie_embeddings=True,
)


def _openvla(name: str, family: str, **kw) -> VLAConfig:
    return VLAConfig(
        name=name,
        family=family,
        llm=LLAMA2_7B,
        vision=openvla_vision_configs(224),
        connector="fused-mlp",
        action_dim=7,
        action_vocab_size=32000,
        **kw,
    )


def openvla_7b() -> VLAConfig:
    return _openvla(
        "openvla-7b",
        "autoregressive",
        chunk=1,
        notes="Prismatic-7B: DINOv2-L/14 + SigLIP-So400m/14 at 224 px, Llama-2-7B",
    )


# LLaVA-VLA (CEED-VLA's CALVIN backbone, issue 65): LLaVA-1.5-7B as a VLA. CLIP ViT-L/14 at
# 336 px (CLS token, pre-LayerNorm, quick GELU; the second-to-last layer's 576 patch features,
# CLS dropped: vision_feature_layer -2, strategy "default"), LLaVA's two-layer GELU MLP
# projector, a Vicuna-7B-shaped LLaMA (Vicuna v1.5: 4096 positions), and OpenVLA's 256 action
# bins on the last ids of the 32000-token text vocabulary, for 5-step chunks of 7 dimensions:
# 35 tokens per inference. The image follows "USER: " as LLaVA-1.5's prompt writes it
# (llava.py); these are Llama-2's ids of "▁US", "ER", ":", "▁".
VICUNA_7B = dataclasses.replace(LLAMA2_7B, vocab_size=32000, max_positions=4096)
LLAVA_USER_IDS = (3148, 1001, 29901, 29871)
LLAVA_VLA_CHUNK = 5


def llava_vla_7b() -> VLAConfig:
    clip = ViTConfig.clip_large(336, feature_layer=-2)
    return VLAConfig(
        name="llava-vla-7b",
        family="autoregressive",
        llm=VICUNA_7B,
        vision=(clip,),
        connector="mlp",
        action_dim=7,
        chunk=LLAVA_VLA_CHUNK,
        action_vocab_size=32000,
        image_prefix_ids=LLAVA_USER_IDS,
        notes="LLaVA-1.5-7B: CLIP ViT-L/14 at 336 px (layer -2), MLP projector, Vicuna-7B; "
        "5 x 7 action bins",
    )


def openvla_oft() -> VLAConfig:
    oft = OFTHeadConfig(llm_dim=4096, action_dim=7, chunk=8, hidden_dim=4096, num_blocks=2)
    return _openvla(
        "openvla-oft",
        "parallel",
        chunk=8,
        num_images=2,
        oft=oft,
        notes="LIBERO setting: 2 images (512 visual tokens), chunk 8; proprio token not modelled",
    )


def cogact() -> VLAConfig:
    dit = DiTConfig.cogact("DiT-B", cond_dim=4096, action_dim=7, future_steps=15)
    return _openvla(
        "cogact",
        "diffusion",
        chunk=16,
        dit=dit,
        notes="Prismatic-7B + DiT-Base action module, 10 DDIM steps",
    )


def _paligemma_prefix() -> dict:
    """pi0's and pi0-FAST's shared prefix: PaliGemma-3B (SigLIP So400m/14 at 224 px + Gemma-2B),
    three cameras, bidirectional attention within the prefix."""
    siglip = ViTConfig.siglip_so400m(224, feature_layer=-1)  # PaliGemma: all blocks + post-LN
    return dict(
        llm=GEMMA_2B, vision=(siglip,), connector="linear", num_images=3, prefix_causal=False
    )


def pi0() -> VLAConfig:
    flow = FlowExpertConfig(
        GEMMA_300M_EXPERT, action_dim=32, horizon=50, state_dim=32, num_steps=10
    )
    return VLAConfig(
        name="pi0",
        family="flow",
        action_dim=32,
        chunk=50,
        max_text_tokens=48,
        flow=flow,
        notes="PaliGemma-3B (SigLIP So400m/14 + Gemma-2B), 3 cameras, 300M expert",
        **_paligemma_prefix(),
    )


def pi05() -> VLAConfig:
    """pi0.5 as openpi / LeRobot ship it: pi0's shape, the flow time conditioning every norm of
    the expert (adaptive RMSNorm) and no state token: the state is written, discretised, into
    a prompt of up to 200 tokens (LeRobot ``tokenizer_max_length``)."""
    base = pi0()
    return dataclasses.replace(
        base,
        name="pi05",
        max_text_tokens=200,
        flow=dataclasses.replace(base.flow, state_dim=0, time_cond="adarms"),
        notes="PaliGemma-3B + a 300M expert with adaptive norms; the state is prompt text",
    )


def rdt_1b() -> VLAConfig:
    """RDT-1b (thu-ml/RoboticsDiffusionTransformer, configs/base.yaml): SigLIP So400m/14 at
    384 px on 3 cameras x 2 history frames (4374 image tokens), a T5-XXL encoder over the
    instruction, and a 1.2B DiT that cross-attends to both and samples 64 x 128 actions in 5
    steps. Stages: vision (SigLIP), prefill (the T5 encoder; the images' features pass through
    it to the head), denoise (adaptors + DiT). RDT's own deployment precomputes the language
    features once per instruction; here the encoder is a stage of every request."""
    rdt = RDTConfig.rdt_1b()
    return VLAConfig(
        name="rdt-1b",
        family="rdt",
        llm=T5_XXL_ENCODER,
        vision=(ViTConfig.siglip_so400m(384, feature_layer=-1),),
        connector="none",
        num_images=6,
        action_dim=rdt.action_dim,
        chunk=rdt.horizon,
        max_text_tokens=64,
        bos_id=None,
        images_first=True,
        prefix_causal=False,
        rdt=rdt,
        notes="SigLIP So400m/14 @384 x 6 views, T5-XXL encoder, 1.2B cross-attention DiT, 5 steps",
    )


# pi0-FAST decodes a FAST code of the chunk: the FAST paper (Pertsch et al. 2025, arXiv
# 2501.09747, section 3) reports 30 to 60 BPE tokens per one-second chunk where per-value
# binning needs hundreds; the cost model takes the upper end. A chunk's real count varies with
# its smoothness and ends at the LM's EOS (openpi ``Pi0FAST.sample_actions`` stops there).
PI0_FAST_TOKENS = 60
# openpi: the universal FAST+ tokenizer's 2048 ids sit below PaliGemma's 128 special ids at the
# top of its vocabulary; decoding ends at <eos> (1) or after max_decoding_steps (256).
PI0_FAST_CODE = FastConfig(vocab_size=2048, max_tokens=256, end_id=1, skip_tokens=128)


def pi0_fast() -> VLAConfig:
    """openpi's ``Pi0FASTConfig`` defaults: action_dim 32 (padded), action_horizon 32,
    max_token_len 250 for the prompt (with the state written as text) and the action tokens."""
    return VLAConfig(
        name="pi0-fast",
        family="autoregressive",
        action_dim=32,
        chunk=32,
        max_text_tokens=250 - PI0_FAST_TOKENS,
        decode_tokens=PI0_FAST_TOKENS,
        fast=PI0_FAST_CODE,
        notes=(
            "PaliGemma-3B (SigLIP So400m/14 + Gemma-2B), 3 cameras, no action expert: the LM "
            f"decodes ~{PI0_FAST_TOKENS} FAST tokens per chunk (at most "
            f"{PI0_FAST_CODE.max_tokens}), decoded to a 32 x 32 chunk"
        ),
        **_paligemma_prefix(),
    )


# UniVLA (BAAI 2025; CEED-VLA's LIBERO row, issue 65): Emu3 (univla.py). The LM is
# transformers' Emu3TextConfig defaults, Emu3-8B's text model: a 184622-id vocabulary (Qwen's
# 151643 text ids, specials, and the 32768 visual tokens at the top), 4096 wide, 32 layers, 32
# heads over 8 KV heads, SwiGLU 14336, RoPE theta 1e6, 9216 positions: ~8.5B parameters.
EMU3_8B = LlamaConfig(
    vocab_size=184622,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=1e6,
    max_positions=9216,
)
# The VQ tokenizer: Emu3VQVAEConfig's defaults (codebook 32768 x 4, channels 256 x (1, 2, 2, 4),
# 2 residual blocks a level, attention at the last level, 4 frames in time: an 8-pixel code) at
# the 200 px views UniVLA's LIBERO evaluation feeds it (model_wrapper_emu.py: agent and wrist
# views resized to 200 x 200): 25 x 25 codes a view. The ids below are Emu3's tokenizer layout
# as derived (visual tokens from 151854, <|image start|> / end / token 151851..3, <|extra_200|>
# / <|extra_201|> 151846 / 7, Qwen's "2" "5" "*" 17 20 9): a checkpoint's own vocabulary_map
# gives the real ones when it loads; the shape (659 tokens a view) does not depend on them.
UNIVLA_VQ = VQImageTokens(
    VQConfig(image_size=200),
    visual_start=151854,
    head=(151851, 17, 20, 9, 17, 20, 151853),
    eol=151846,
    tail=(151847, 151852),
)
# Actions: a FAST code of a 10 x 7 chunk, FAST id f at LM id 151642 - f (UniVLA's
# ``last_token_id``, pad 151643 - 1), ended by 151845, at most 80 tokens (model_wrapper_emu.py).
# The FAST vocabulary is assumed to be the universal FAST+ tokenizer's 2048 ids (as pi0-FAST's);
# the code length the cost model counts, 30, is assumed from the FAST paper's 30 to 60 tokens
# for a one-second chunk (UniVLA's is 10 steps), not measured.
UNIVLA_CODE = FastConfig(vocab_size=2048, max_tokens=80, end_id=151845, skip_tokens=184622 - 151643)
UNIVLA_TOKENS = 30


def univla() -> VLAConfig:
    return VLAConfig(
        name="univla",
        family="autoregressive",
        llm=EMU3_8B,
        vision=(),
        connector="vq",
        vq=UNIVLA_VQ,
        num_images=2,
        action_dim=7,
        chunk=10,
        decode_tokens=UNIVLA_TOKENS,
        fast=UNIVLA_CODE,
        bos_id=151849,
        notes="Emu3-8B LM over text, VQ image and FAST action tokens; 2 views of 25 x 25 codes "
        f"(1318 tokens), ~{UNIVLA_TOKENS} FAST tokens per 10 x 7 chunk (at most 80)",
    )


# SmolVLA's prefix (LeRobot): images, then the text with no BOS, then the state token in an
# attention block of its own through one Linear; image and text embeddings scaled by sqrt(d).
SMOLVLA_LAYOUT = dict(
    prefix_causal=False,
    images_first=True,
    bos_id=None,
    proprio_after_text=True,
    proprio_linear=True,
    scale_embeddings=True,
)


def smolvla() -> VLAConfig:
    """SmolVLA as LeRobot builds it: the state a prefix token after the text (its own block),
    image and text embeddings scaled by sqrt(960), no BOS; the expert's odd layers
    cross-attend to its projections of the prefix K/V; action tokens causal."""
    siglip = ViTConfig(
        kind="siglip",
        image_size=512,
        patch_size=16,
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        intermediate_size=3072,
        feature_layer=-1,
    )
    kv = SMOLVLM2_TEXT_16.num_kv_heads * SMOLVLM2_TEXT_16.hd
    flow = FlowExpertConfig(
        SMOLVLA_EXPERT,
        action_dim=32,
        horizon=50,
        state_dim=0,
        num_steps=10,
        cross_every=2,
        cross_kv_dim=kv,
        causal_actions=True,
    )
    return VLAConfig(
        name="smolvla",
        family="flow",
        llm=SMOLVLM2_TEXT_16,
        vision=(siglip,),
        connector="pixel-shuffle",
        pixel_shuffle=4,
        num_images=1,
        action_dim=32,
        chunk=50,
        max_text_tokens=48,
        proprio_dim=32,
        flow=flow,
        **SMOLVLA_LAYOUT,
        notes="SmolVLM2-500M (16 of 32 text layers) + a 0.75x expert, cross-attention in "
        "alternate layers (LeRobot's SmolVLA)",
    )
