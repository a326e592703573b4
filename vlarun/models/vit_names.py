"""Weight names of the ViT towers: Hugging Face layouts (transformers 4 and 5) onto
``vit.ViTEncoder``'s names, timm's names (OpenVLA's checkpoints) to and from them, and a
SigLIP tower as a CLIP tower's warm start. Pure renames and reshapes of state dicts; no module
here."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch
from torch import Tensor

_KINDS = ("siglip", "dinov2", "clip")
_TIMM_KINDS = ("siglip", "dinov2")  # the towers OpenVLA's checkpoints store under timm names


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# Checkpoint keys we deliberately do not model. A full SiglipModel checkpoint also carries the
# text tower and logit scale; the SigLIP attention-pooling head is unused because VLAs consume
# patch features. DINOv2 has nothing to skip (its mask_token is kept as an unused parameter). A
# full CLIPModel checkpoint carries the text tower and both contrastive projections.
IGNORED_HF_PREFIXES: dict[str, tuple[str, ...]] = {
    "siglip": (
        "vision_model.head.",
        "vision_model.embeddings.position_ids",  # a buffer some older exports persisted
        "text_model.",
        "logit_scale",
        "logit_bias",
    ),
    "dinov2": (),
    "clip": (
        "vision_model.embeddings.position_ids",  # persisted by transformers < 4.31
        "text_model.",
        "visual_projection.",
        "text_projection.",
        "logit_scale",
    ),
}


# transformers >= 5 keeps these in memory (its save_pretrained writes the checkpoint names back).
_UNPREFIXED = {
    "siglip": ("embeddings.", "encoder.", "post_layernorm.", "head."),
    "clip": ("embeddings.", "pre_layrnorm.", "encoder.", "post_layernorm."),
}
_DINOV2_HF5_RENAMES = {
    ".attention.q_proj.": ".attention.attention.query.",
    ".attention.k_proj.": ".attention.attention.key.",
    ".attention.v_proj.": ".attention.attention.value.",
    ".attention.o_proj.": ".attention.output.dense.",
}


def canonical_hf_state_dict(state: dict[str, Tensor], kind: str) -> dict[str, Tensor]:
    """Map any HF layout of a ``kind`` checkpoint onto ``ViTEncoder``'s names.

    Handles transformers >= 5 in-memory names (SigLIP and CLIP without ``vision_model.``; DINOv2
    ``attention.q_proj``/``o_proj``) and drops ``IGNORED_HF_PREFIXES``. Unknown keys pass through
    unchanged, so a strict ``load_state_dict`` still reports them.
    """
    _require(kind in _KINDS, f"kind must be one of {_KINDS}, got {kind!r}.")
    out = {}
    for key, value in state.items():
        if kind in _UNPREFIXED and key.startswith(_UNPREFIXED[kind]):
            key = "vision_model." + key
        if kind == "dinov2":
            for new_name, old_name in _DINOV2_HF5_RENAMES.items():
                key = key.replace(new_name, old_name)
        if not key.startswith(IGNORED_HF_PREFIXES[kind]):
            out[key] = value
    return out


# ----------------------------------------------------------------------------------------------
# timm <-> HF names (OpenVLA's checkpoint stores both towers as timm VisionTransformers)

# (timm, HF) module names holding a .weight and .bias, at the top level and inside block i.
_TIMM_TOP = {
    "siglip": [
        ("patch_embed.proj", "vision_model.embeddings.patch_embedding"),
        ("norm", "vision_model.post_layernorm"),
    ],
    "dinov2": [
        ("patch_embed.proj", "embeddings.patch_embeddings.projection"),
        ("norm", "layernorm"),
    ],
}
_TIMM_BLOCK = {  # and mlp.fc1 / mlp.fc2, named alike in both
    "siglip": [
        ("norm1", "layer_norm1"),
        ("attn.proj", "self_attn.out_proj"),
        ("norm2", "layer_norm2"),
    ],
    "dinov2": [("norm1", "norm1"), ("attn.proj", "attention.output.dense"), ("norm2", "norm2")],
}
_HF_LAYER = {"siglip": "vision_model.encoder.layers.", "dinov2": "encoder.layer."}
# timm fuses q, k, v into `attn.qkv` (rows stacked in that order); HF keeps three Linears.
_HF_QKV = {
    "siglip": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "dinov2": ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
}
# timm SigLIP's attention-pool head (`global_pool='map'`) and any classifier are not modelled.
TIMM_IGNORED_PREFIXES = ("attn_pool.", "head.")
_SIGLIP_POS = "vision_model.embeddings.position_embedding.weight"
# Tensors converted by hand below rather than renamed.
_TIMM_SPECIAL = {"siglip": {"pos_embed"}, "dinov2": {"pos_embed", "cls_token", "reg_token"}}
_DINOV2_TOKENS = ("cls_token", "mask_token", "position_embeddings", "register_tokens")
_HF_SPECIAL = {"siglip": {_SIGLIP_POS}, "dinov2": {f"embeddings.{n}" for n in _DINOV2_TOKENS}}


def _require_known(ok: bool, key: str, kind: str) -> None:
    if not ok:
        raise KeyError(f"unknown key {key!r} for a {kind} ViT tower (no mapping between timm/HF).")


def _depth(keys: Iterable[str], pattern: str) -> int:
    """Number of blocks named in ``keys`` (1 + the largest index ``pattern`` captures)."""
    return 1 + max((int(m[1]) for k in keys if (m := re.match(pattern, k))), default=-1)


def _timm_renames(kind: str, depth: int, ls_name: str) -> dict[str, str]:
    """timm name -> HF name for every tensor that only needs renaming."""
    pairs = list(_TIMM_TOP[kind])
    for i in range(depth):
        hf = f"{_HF_LAYER[kind]}{i}."
        pairs += [(f"blocks.{i}.{t}", hf + h) for t, h in _TIMM_BLOCK[kind]]
        pairs += [(f"blocks.{i}.mlp.fc{j}", f"{hf}mlp.fc{j}") for j in (1, 2)]
    names = {f"{t}.{leaf}": f"{h}.{leaf}" for t, h in pairs for leaf in ("weight", "bias")}
    if kind == "dinov2":  # LayerScale: timm `ls1.gamma` (OpenVLA: `ls1.scale_factor`) <-> lambda1
        for i in range(depth):
            for j in (1, 2):
                names[f"blocks.{i}.ls{j}.{ls_name}"] = f"encoder.layer.{i}.layer_scale{j}.lambda1"
    return names


def timm_to_hf_vit(state: dict[str, Tensor], kind: str) -> dict[str, Tensor]:
    """Rename a timm ViT state dict (prefix already stripped) to ``ViTEncoder``'s HF names.

    Kinds: "dinov2" is timm ``vit_large_patch14_(reg4_)dinov2``, "siglip" is timm
    ``vit_so400m_patch14_siglip_*`` (OpenVLA's two towers). LayerScale may be ``ls1.gamma``
    (timm) or ``ls1.scale_factor`` (OpenVLA's renamed copy). A DINOv2 ``pos_embed`` without a
    CLS slot (timm ``no_embed_class``: the reg4 models, whose ``cls_token`` already includes its
    position) gets a zero CLS position. timm has no ``mask_token``; a zero one is added.
    Raises KeyError naming any key it does not know.
    """
    _require(kind in _TIMM_KINDS, f"kind must be one of {_TIMM_KINDS}, got {kind!r}.")
    depth = _depth(state, r"blocks\.(\d+)\.")
    names = _timm_renames(kind, depth, "gamma") | _timm_renames(kind, depth, "scale_factor")
    out = {names[k]: v for k, v in state.items() if k in names}
    for key, value in state.items():
        if m := re.fullmatch(r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)", key):
            for name, part in zip(_HF_QKV[kind], value.chunk(3, dim=0), strict=True):
                out[f"{_HF_LAYER[kind]}{m[1]}.{name}.{m[2]}"] = part  # (3D, ...) -> 3 x (D, ...)
        elif key not in names and key not in _TIMM_SPECIAL[kind]:
            _require_known(key.startswith(TIMM_IGNORED_PREFIXES), key, kind)

    if kind == "siglip":
        out[_SIGLIP_POS] = state["pos_embed"][0]  # (1, N, D) -> (N, D)
        return out
    cls, pos = state["cls_token"], state["pos_embed"]  # (1, 1, D), (1, N or N+1, D)
    if math.isqrt(pos.shape[1]) ** 2 == pos.shape[1]:  # no CLS slot: N is a square, N+1 never is
        pos = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)
    out["embeddings.cls_token"] = cls
    out["embeddings.position_embeddings"] = pos  # (1, N+1, D)
    out["embeddings.mask_token"] = torch.zeros_like(cls[0])  # (1, D), unused at inference
    if "reg_token" in state:
        out["embeddings.register_tokens"] = state["reg_token"]  # (1, R, D)
    return out


def hf_to_timm_vit(
    state: dict[str, Tensor], kind: str, ls_name: str = "gamma"
) -> dict[str, Tensor]:
    """Inverse of ``timm_to_hf_vit`` (any HF layout in, timm names out).

    DINOv2 with registers is written in timm's ``no_embed_class`` form (CLS position folded into
    ``cls_token``); without registers ``pos_embed`` keeps its CLS slot. ``mask_token`` is dropped.
    ``ls_name="scale_factor"`` writes OpenVLA's LayerScale name instead of timm's ``gamma``.
    """
    _require(kind in _TIMM_KINDS, f"kind must be one of {_TIMM_KINDS}, got {kind!r}.")
    state = canonical_hf_state_dict(state, kind)
    layer = _HF_LAYER[kind]
    depth = _depth(state, re.escape(layer) + r"(\d+)\.")
    names = {hf: timm for timm, hf in _timm_renames(kind, depth, ls_name).items()}
    out = {names[k]: v for k, v in state.items() if k in names}
    known = set(names) | _HF_SPECIAL[kind]
    for i in range(depth):
        for leaf in ("weight", "bias"):
            keys = [f"{layer}{i}.{n}.{leaf}" for n in _HF_QKV[kind]]
            out[f"blocks.{i}.attn.qkv.{leaf}"] = torch.cat([state[k] for k in keys])  # (3D, ...)
            known.update(keys)
    for key in state:
        _require_known(key in known, key, kind)

    if kind == "siglip":
        out["pos_embed"] = state[_SIGLIP_POS][None]  # (N, D) -> (1, N, D)
        return out
    cls, pos = state["embeddings.cls_token"], state["embeddings.position_embeddings"]
    if "embeddings.register_tokens" in state:
        out["reg_token"] = state["embeddings.register_tokens"]
        cls, pos = cls + pos[:, :1], pos[:, 1:]  # fold the CLS position into the token
    out["cls_token"], out["pos_embed"] = cls, pos
    return out


# ----------------------------------------------------------------------------------------------
# A SigLIP tower as the start of a CLIP one (mt10p-llava grows from mt10p's trunk)


def siglip_to_clip_vit(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A SigLIP tower's tensors (any HF layout) as a warm start for a CLIP tower of its shape.

    Exact where the two agree: the patch conv, its bias folded into the patch positions (CLIP's
    conv has none: conv(x) + b + pos = conv_nobias(x) + (pos + b)), and the blocks and
    ``post_layernorm``, which have the same names and shapes. The class token's position is
    zero (its ``class_embedding`` carries the same thing). What SigLIP lacks,
    ``class_embedding`` and ``pre_layrnorm``, is left out for the caller's initialisation. The
    result computes another function (a LayerNorm on the embeddings, quick GELU instead of
    tanh GELU, a class token in the attention): a starting point for training, not a
    conversion.
    """
    state = canonical_hf_state_dict(state, "siglip")
    emb = "vision_model.embeddings."
    out = {k: v for k, v in state.items() if not k.startswith(emb)}
    out[emb + "patch_embedding.weight"] = state[emb + "patch_embedding.weight"]
    pos = state[_SIGLIP_POS] + state[emb + "patch_embedding.bias"]  # (N, D)
    out[emb + "position_embedding.weight"] = torch.cat([torch.zeros_like(pos[:1]), pos])
    return out
