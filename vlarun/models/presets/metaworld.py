"""The Meta-World presets: the shapes of the small policies vlarun trains on its own benchmark
(tiny-*, mt10-*, mt10w-*, mt10p-*, mt10g-*), whose trained weights ship under checkpoints/.
"""

from __future__ import annotations

import dataclasses

from vlarun.models.fast_head import FastConfig
from vlarun.models.flow_expert import FlowExpertConfig
from vlarun.models.heads import DiTConfig, OFTHeadConfig
from vlarun.models.llama import LlamaConfig
from vlarun.models.tokenizer import EOS_ID
from vlarun.models.vit import ViTConfig
from vlarun.models.vla import VLAConfig

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
