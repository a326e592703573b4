"""Named model shapes: the real VLAs (from shared/REFERENCE.md and the models' public configs)
and tiny presets of every family that run on a laptop CPU in tens of milliseconds.

Real presets are for cost modelling, FLOP counts and random-weight benchmarks at true size;
nothing here downloads weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vlarun.models.emu3_vq import VQConfig, VQImageTokens
from vlarun.models.fast_head import FastConfig
from vlarun.models.flow_expert import FlowExpertConfig
from vlarun.models.heads import DiTConfig, OFTHeadConfig
from vlarun.models.llama import LlamaConfig
from vlarun.models.rdt_head import RDTConfig
from vlarun.models.tokenizer import EOS_ID
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


# -- tiny presets: same families and code paths, shapes that run in milliseconds ----------------

TINY_IMAGE = 64
TINY_VOCAB = 1024  # room for 259 byte ids and 256 action bins
TINY_TEXT = 128  # byte-level prompts: the OpenVLA template alone is ~50 bytes


def _tiny_llm(**kw) -> LlamaConfig:
    base = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=128,
        intermediate_size=384,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        max_positions=512,
    )
    return LlamaConfig(**(base | kw))


def _tiny_vit(kind: str, **kw) -> ViTConfig:
    base = dict(
        kind=kind,
        image_size=TINY_IMAGE,
        patch_size=8,
        hidden_size=64,
        num_layers=3,
        num_heads=4,
        intermediate_size=128,
    )
    return ViTConfig(**(base | kw))


def _tiny_openvla(name: str, family: str, **kw) -> VLAConfig:
    vision = (_tiny_vit("dinov2", num_registers=4), _tiny_vit("siglip"))
    return VLAConfig(
        name=name,
        family=family,
        llm=_tiny_llm(),
        vision=vision,
        connector="fused-mlp",
        action_dim=7,
        max_text_tokens=TINY_TEXT,
        **kw,
    )


def tiny_openvla() -> VLAConfig:
    return _tiny_openvla("tiny-openvla", "autoregressive", chunk=1)


def tiny_oft() -> VLAConfig:
    oft = OFTHeadConfig(llm_dim=128, action_dim=7, chunk=4, hidden_dim=128, num_blocks=2)
    return _tiny_openvla("tiny-openvla-oft", "parallel", chunk=4, oft=oft)


def tiny_cogact() -> VLAConfig:
    dit = DiTConfig(
        cond_dim=128,
        action_dim=7,
        horizon=8,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        ddim_steps=10,
    )
    return _tiny_openvla("tiny-cogact", "diffusion", chunk=8, dit=dit)


def _tiny_gemma(**kw) -> LlamaConfig:
    """The tiny PaliGemma-style LM (one KV head, GELU-tanh, Gemma norms, tied embeddings)."""
    base = dict(
        num_kv_heads=1,
        head_dim=64,
        mlp_act="gelu_tanh",
        gemma_norm=True,
        tie_embeddings=True,
        rms_norm_eps=1e-6,
    )
    return _tiny_llm(**(base | kw))


def tiny_pi0() -> VLAConfig:
    expert = _tiny_gemma(vocab_size=1, hidden_size=64, intermediate_size=128)
    flow = FlowExpertConfig(expert, action_dim=7, horizon=8, state_dim=8, num_steps=10)
    return VLAConfig(
        name="tiny-pi0",
        family="flow",
        llm=_tiny_gemma(),
        vision=(_tiny_vit("siglip"),),
        connector="linear",
        action_dim=7,
        chunk=8,
        prefix_causal=False,
        max_text_tokens=TINY_TEXT,
        flow=flow,
    )


def tiny_pi0_fast() -> VLAConfig:
    """tiny-pi0's prefix with no expert, decoding the FAST code of an 8 x 7 chunk: 512 FAST ids
    at the top of the 1024-id vocabulary (the byte ids stay below them), the byte tokenizer's
    </s> (2) as END. A random-weight preset gets ``fast_head.synthetic_fast_tokenizer``, whose
    code of a smooth chunk is ~14 tokens (``decode_tokens``); the cap leaves room for twice
    that."""
    return VLAConfig(
        name="tiny-pi0-fast",
        family="autoregressive",
        llm=_tiny_gemma(),
        vision=(_tiny_vit("siglip"),),
        connector="linear",
        action_dim=7,
        chunk=8,
        prefix_causal=False,
        max_text_tokens=TINY_TEXT,
        decode_tokens=14,
        fast=FastConfig(vocab_size=512, max_tokens=32, end_id=EOS_ID),
    )


# tiny-univla: UniVLA's structure at tiny-pi0-fast's scale. A 32 px VQ of 8 x 8 codes (128
# entries, channels 32 x (1, 2, 2)), two views of 79 tokens; its ids above the byte tokenizer's:
# markers 259..275 (<|image start|>, "0".."9", "*", <|image token|>, end-of-row, end-of-frame,
# <|image end|>), codes 276..403; FAST's 512 ids in the top half (as tiny-pi0-fast) ended by </s>.
TINY_DIGITS = {str(i): 260 + i for i in range(10)} | {"*": 270}
TINY_UNIVLA_VQ = VQImageTokens(
    VQConfig(
        image_size=32,
        codebook_size=128,
        base_channels=32,
        channel_multiplier=(1, 2, 2),
        num_res_blocks=1,
        attn_resolutions=(2,),
    ),
    visual_start=276,
    head=(259, *(TINY_DIGITS[c] for c in "8*8"), 271),
    eol=272,
    tail=(273, 274),
)


def tiny_univla() -> VLAConfig:
    return VLAConfig(
        name="tiny-univla",
        family="autoregressive",
        llm=_tiny_llm(),
        vision=(),
        connector="vq",
        vq=TINY_UNIVLA_VQ,
        num_images=2,
        action_dim=7,
        chunk=10,
        max_text_tokens=TINY_TEXT,
        decode_tokens=14,
        fast=FastConfig(vocab_size=512, max_tokens=32, end_id=EOS_ID),
    )


def tiny_smolvla() -> VLAConfig:
    llm = _tiny_llm(hidden_size=96, num_heads=3, num_kv_heads=1, intermediate_size=256)
    expert = _tiny_llm(
        vocab_size=1,
        hidden_size=72,
        num_heads=3,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=192,
    )
    # SmolVLA's structure (see smolvla()): prefix state token, cross-attending odd layers
    flow = FlowExpertConfig(
        expert,
        action_dim=7,
        horizon=8,
        state_dim=0,
        num_steps=10,
        cross_every=2,
        cross_kv_dim=llm.num_kv_heads * llm.hd,
        causal_actions=True,
    )
    vit = _tiny_vit("siglip", feature_layer=-1)
    return VLAConfig(
        name="tiny-smolvla",
        family="flow",
        llm=llm,
        vision=(vit,),
        connector="pixel-shuffle",
        pixel_shuffle=2,
        action_dim=7,
        chunk=8,
        max_text_tokens=TINY_TEXT,
        proprio_dim=8,
        flow=flow,
        **SMOLVLA_LAYOUT,
    )


# -- Meta-World presets: the small policies vlarun trains on its own benchmark ------------------
# 128 px frames in 8 px patches give 256 visual tokens, so token methods have room to work;
# widths are chosen so one behaviour-cloning step stays cheap on a 2-core CPU.

MW_IMAGE = 128
MW_CHUNK = 4  # actions per inference (4 steps x 4 dims)
MW_VOCAB = 512  # 256 text ids (a BPE trained on the instructions) + 256 action bins


def _mw_trunk(
    name: str,
    family: str,
    width: int = 192,
    layers: int = 4,
    chunk: int = MW_CHUNK,
    patch: int = 8,
    **kw,
) -> VLAConfig:
    """The Meta-World policies' shape: a 128 px SigLIP-style ViT (patch ``patch``, width 128, 4
    layers), an MLP projector and a small Llama of ``width`` x ``layers``; ``kw`` adds views,
    proprio and the head."""
    vit = ViTConfig(
        kind="siglip",
        image_size=MW_IMAGE,
        patch_size=patch,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        intermediate_size=512,
        feature_layer=-1,
    )
    llm = LlamaConfig(
        vocab_size=MW_VOCAB,
        hidden_size=width,
        intermediate_size=512,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        max_positions=512,
    )
    return VLAConfig(
        name=name,
        family=family,
        llm=llm,
        vision=(vit,),
        connector="mlp",
        action_dim=4,
        chunk=chunk,
        max_text_tokens=32,
        **kw,
    )


def mw_ar() -> VLAConfig:
    return _mw_trunk("tiny-ar", "autoregressive")


def mw_oft() -> VLAConfig:
    oft = OFTHeadConfig(llm_dim=192, action_dim=4, chunk=MW_CHUNK, hidden_dim=256, num_blocks=2)
    return _mw_trunk("tiny-oft", "parallel", oft=oft)


def mw_dit() -> VLAConfig:
    dit = DiTConfig(
        cond_dim=192,
        action_dim=4,
        horizon=MW_CHUNK,
        hidden_size=128,
        num_layers=3,
        num_heads=4,
        ddim_steps=10,
    )
    return _mw_trunk("tiny-dit", "diffusion", dit=dit)


# -- MT10 presets: deep enough that cutting computation costs success ----------------------------
# A 12-layer LM (width 128, so one training step stays affordable on a 2-core CPU), two views
# (the workspace camera and its mirror on the robot's left, the second pooled 2 x 2 to 64
# tokens: 320 visual tokens) and the hand state as a proprio token. TRIAGE probes drift at a
# shallow layer and then has 10 more layers to save; layer pruning has 12 to choose from.

MT10_WIDTH = 128
MT10_LAYERS = 12


def _mt10_trunk(name: str, family: str, **kw) -> VLAConfig:
    return _mw_trunk(
        name,
        family,
        width=MT10_WIDTH,
        layers=MT10_LAYERS,
        num_images=2,
        view_pool=(1, 2),
        views=("workspace", "left"),
        proprio_dim=4,
        **kw,
    )


def mt10_ar() -> VLAConfig:
    return _mt10_trunk("mt10-ar", "autoregressive")


def mt10_oft() -> VLAConfig:
    oft = OFTHeadConfig(
        llm_dim=MT10_WIDTH, action_dim=4, chunk=MW_CHUNK, hidden_dim=256, num_blocks=2
    )
    return _mt10_trunk("mt10-oft", "parallel", oft=oft)


def mt10_dit() -> VLAConfig:
    dit = DiTConfig(
        cond_dim=MT10_WIDTH,
        action_dim=4,
        horizon=MW_CHUNK,
        hidden_size=128,
        num_layers=3,
        num_heads=4,
        ddim_steps=10,
    )
    return _mt10_trunk("mt10-dit", "diffusion", dit=dit)


# -- MT10 with a wrist camera: views like real VLAs', four families -------------------------
# The MT10 trunk with the workspace view and a wrist camera that rides with the hand (pooled to
# 64 tokens: 320 visual tokens, the wrist ones changing every step, which is what token reuse
# must cope with on a real robot). The continuous heads predict chunks of 8 steps so a robot can
# execute one chunk while the next is computed; the autoregressive head keeps 4 steps (16
# tokens), since every step it adds is 4 more sequential decode steps.

MT10W_CHUNK = 8


def _mt10w_trunk(name: str, family: str, chunk: int = MT10W_CHUNK, **kw) -> VLAConfig:
    return _mw_trunk(
        name,
        family,
        width=MT10_WIDTH,
        layers=MT10_LAYERS,
        chunk=chunk,
        num_images=2,
        view_pool=(1, 2),
        views=("workspace", "wrist"),
        proprio_dim=4,
        **kw,
    )


def mt10w_ar() -> VLAConfig:
    return _mt10w_trunk("mt10w-ar", "autoregressive", chunk=MW_CHUNK)


def mt10w_oft() -> VLAConfig:
    oft = OFTHeadConfig(
        llm_dim=MT10_WIDTH, action_dim=4, chunk=MT10W_CHUNK, hidden_dim=256, num_blocks=2
    )
    return _mt10w_trunk("mt10w-oft", "parallel", oft=oft)


def mt10w_dit() -> VLAConfig:
    dit = DiTConfig(
        cond_dim=MT10_WIDTH,
        action_dim=4,
        horizon=MT10W_CHUNK,
        hidden_size=128,
        num_layers=3,
        num_heads=4,
        ddim_steps=10,
    )
    return _mt10w_trunk("mt10w-dit", "diffusion", dit=dit)


def mt10w_flow() -> VLAConfig:
    """pi0's structure at this scale: an action expert as deep as the trunk (12 layers, the
    trunk's 2 KV heads of 32 dims, so each layer reads the trunk's cached prefix K/V) but half
    as wide; the hand state comes in the prefix's proprio token, as pi05 puts it in the prompt."""
    expert = LlamaConfig(
        vocab_size=1,
        hidden_size=64,
        intermediate_size=256,
        num_layers=MT10_LAYERS,
        num_heads=2,
        num_kv_heads=2,
        head_dim=MT10_WIDTH // 4,
        max_positions=512,
        tie_embeddings=True,
    )
    flow = FlowExpertConfig(expert, action_dim=4, horizon=MT10W_CHUNK, state_dim=0, num_steps=10)
    return _mt10w_trunk("mt10w-flow", "flow", flow=flow)


# -- MT10 at patch 16: the wrist-camera suite in a shape that trains on two CPU cores ---------
# mt10w's 12-layer LM, ViT and 128 px views, with 16 px patches: 64 workspace tokens + the wrist
# view pooled to 16 = 80 visual tokens in a ~137-token sequence, against 320 in ~377 at patch 8.
# The LM's cost is its sequence, so a training step is ~3.4x cheaper (27 against 8 samples/s
# on two cores, measured 2026-12-04) while every pixel of the 128 px frames is still seen (64 px
# at patch 8 costs the same but shrinks the goal marker to 2-3 px). Every head predicts 8 steps
# except the autoregressive one (4 steps: each step is 4 more sequential decode steps).

MT10P_PATCH = 16


def _mt10p_trunk(name: str, family: str, chunk: int = MT10W_CHUNK, **kw) -> VLAConfig:
    return _mt10w_trunk(name, family, chunk=chunk, patch=MT10P_PATCH, **kw)


def mt10p_ar() -> VLAConfig:
    return _mt10p_trunk("mt10p-ar", "autoregressive", chunk=MW_CHUNK)


def mt10p_oft() -> VLAConfig:
    return dataclasses.replace(mt10w_oft(), name="mt10p-oft", vision=mt10p_ar().vision)


def mt10p_dit() -> VLAConfig:
    return dataclasses.replace(mt10w_dit(), name="mt10p-dit", vision=mt10p_ar().vision)


def mt10p_flow() -> VLAConfig:
    return dataclasses.replace(mt10w_flow(), name="mt10p-flow", vision=mt10p_ar().vision)


# pi0-FAST's output at mt10p's shape (issue 65): the same trunk and inputs, an 8-step chunk
# written as a FAST code (DCT + BPE, fast_tokens.py) that the LM decodes up to END. FAST's 512 ids
# (the 256 byte symbols and 256 merges, fitted on the training chunks) take the top half of a
# 1024-id vocabulary, so the 512 ids below (the words, and mt10p's old bins) keep their rows when
# it starts from an mt10p run. A code of a demonstration chunk is ~11 ids (at most ~30: the
# training run's FAST_SCALE); the cap leaves twice that.
# Decoded as LeRobot decodes (``relaxed``): a code with the wrong coefficient count is cut or
# padded, not zeroed. The first 85-minute stretch wrote malformed codes for 11 of 40 demo
# frames, each a zero action under strict decoding; relaxed: none (2026-12-06).
MT10P_FAST_CODE = FastConfig(vocab_size=512, max_tokens=64, end_id=EOS_ID, relaxed=True)


def mt10p_fast() -> VLAConfig:
    base = _mt10p_trunk("mt10p-fast", "autoregressive", decode_tokens=12)
    llm = dataclasses.replace(base.llm, vocab_size=2 * MW_VOCAB)
    return dataclasses.replace(base, llm=llm, fast=MT10P_FAST_CODE)


# LLaVA-VLA's shape at mt10p's scale (issue 65, item 5): mt10p's trunk and inputs (the 12-layer
# LM, two 128 px views in 16 px patches, the hand state) seeing through a CLIP tower as LLaVA-1.5
# does (a CLS token, pre-LN, quick GELU; the second-to-last layer's patch tokens, CLS dropped)
# of the SigLIP tower's width and depth, the same 2-layer MLP projector, and 256-bin action
# tokens for 5-step chunks: 20 tokens per inference, the long sequences of CEED's CALVIN row
# (LLaVA-VLA: 5 x 7 = 35). Layer -2 leaves the tower's last block unused, as in LLaVA.
MT10P_LLAVA_CHUNK = 5


def mt10p_llava() -> VLAConfig:
    siglip = mt10p_ar().vision[0]
    shape = ("image_size", "patch_size", "hidden_size", "num_layers", "num_heads")
    shape += ("intermediate_size",)
    clip = ViTConfig(kind="clip", feature_layer=-2, **{k: getattr(siglip, k) for k in shape})
    base = _mt10p_trunk("mt10p-llava", "autoregressive", chunk=MT10P_LLAVA_CHUNK)
    return dataclasses.replace(base, vision=(clip,))


# -- MT10 with the goal in the state: Meta-World's own MT observation, a labelled variant ------
# mt10p's shape and views with the task's goal xyz appended to the hand state (7 values), the
# setting Meta-World's MT benchmarks use (``partially_observable=False``). Issue 48's step 6: the
# headline policies see the goal only through the cameras; this variant shows how much of the
# precise tasks' failure is finding a 5 px goal marker. Never reported in the same table.


def _goal(cfg: VLAConfig, name: str) -> VLAConfig:
    return dataclasses.replace(cfg, name=name, proprio_dim=cfg.proprio_dim + 3, goal_in_state=True)


def mt10g_ar() -> VLAConfig:
    return _goal(mt10p_ar(), "mt10g-ar")


def mt10g_oft() -> VLAConfig:
    return _goal(mt10p_oft(), "mt10g-oft")


def mt10g_dit() -> VLAConfig:
    return _goal(mt10p_dit(), "mt10g-dit")


def mt10g_flow() -> VLAConfig:
    return _goal(mt10p_flow(), "mt10g-flow")


PRESETS: dict[str, Callable[[], VLAConfig]] = {
    "openvla-7b": openvla_7b,
    "openvla-oft": openvla_oft,
    "llava-vla-7b": llava_vla_7b,
    "cogact": cogact,
    "pi0": pi0,
    "pi05": pi05,
    "pi0-fast": pi0_fast,
    "univla": univla,
    "smolvla": smolvla,
    "rdt-1b": rdt_1b,
    "tiny-openvla": tiny_openvla,
    "tiny-openvla-oft": tiny_oft,
    "tiny-cogact": tiny_cogact,
    "tiny-pi0": tiny_pi0,
    "tiny-pi0-fast": tiny_pi0_fast,
    "tiny-univla": tiny_univla,
    "tiny-smolvla": tiny_smolvla,
    "tiny-ar": mw_ar,
    "tiny-oft": mw_oft,
    "tiny-dit": mw_dit,
    "mt10-ar": mt10_ar,
    "mt10-oft": mt10_oft,
    "mt10-dit": mt10_dit,
    "mt10w-ar": mt10w_ar,
    "mt10w-oft": mt10w_oft,
    "mt10w-dit": mt10w_dit,
    "mt10w-flow": mt10w_flow,
    "mt10p-ar": mt10p_ar,
    "mt10p-oft": mt10p_oft,
    "mt10p-dit": mt10p_dit,
    "mt10p-flow": mt10p_flow,
    "mt10p-fast": mt10p_fast,
    "mt10p-llava": mt10p_llava,
    "mt10g-ar": mt10g_ar,
    "mt10g-oft": mt10g_oft,
    "mt10g-dit": mt10g_dit,
    "mt10g-flow": mt10g_flow,
}
DEFAULT_PRESET = "tiny-openvla"
# A shipped policy and the preset of its shape share one name (tiny-ar, mt10-oft, ...): a name
# means one model, with its trained weights where they load, as a shape where it is costed.
RENAMED = {"mw-ar": "tiny-ar", "mw-oft": "tiny-oft", "mw-dit": "tiny-dit"}


def get_preset(name: str) -> VLAConfig:
    """The preset called ``name``; an unknown name raises listing the valid ones."""
    if name in RENAMED:
        raise ValueError(f"preset {name!r} is now {RENAMED[name]!r} (the shipped policy's name)")
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]()
