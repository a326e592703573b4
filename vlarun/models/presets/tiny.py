"""Tiny presets of every family: the same code paths as the real shapes, at sizes that run on a
laptop CPU in milliseconds (tests, quick benchmarks).
"""

from __future__ import annotations

from vlarun.models.emu3_vq import VQConfig, VQImageTokens
from vlarun.models.fast_head import FastConfig
from vlarun.models.flow_expert import FlowExpertConfig
from vlarun.models.heads import DiTConfig, OFTHeadConfig
from vlarun.models.llama import LlamaConfig
from vlarun.models.presets.real import SMOLVLA_LAYOUT
from vlarun.models.tokenizer import EOS_ID
from vlarun.models.vit import ViTConfig
from vlarun.models.vla import VLAConfig

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
