"""Hugging Face Emu3 checkpoints (``Emu3ForConditionalGeneration``) as vlarun's UniVLA.

UniVLA (BAAI, 2025) is Emu3: a VQ image tokenizer (emu3_vq.py) and a Llama-shaped LM over one
vocabulary of text, image and action tokens. A directory with ``config.json`` (``model_type:
"emu3"``: ``vq_config``, ``text_config``, ``vocabulary_map``) and safetensors weights in either
layout transformers writes:
  * hub / ``save_pretrained``: ``text_model.model.*``, ``text_model.lm_head.*``, ``vqmodel.*``;
  * 5.x in memory: ``model.text_model.*``, ``lm_head.*``, ``model.vqmodel.*``.
The VQ decoder (``vqmodel.decoder.*``, ``vqmodel.post_quant_conv.*``) makes pixels from ids and
is not loaded.

It loads into the autoregressive family with the ``vq`` connector: each view goes through the
VQ tokenizer, its codes become LM ids inside Emu3's image markers (``VQImageTokens``, ids from
``vocabulary_map``), and the LM embeds them with its own table. Emu3's text model is a Llama
(RMSNorm, SwiGLU, GQA, RoPE at theta 1e6, no biases: ``Emu3TextConfig``); its dropouts are off
in eval. Actions are a FAST code decoded up to UniVLA's end-of-action id, as its LIBERO
evaluation does (``reference/RoboVLMs/eval/libero/model_wrapper_emu.py``): FAST id ``f`` is the
LM id ``top - f`` with ``top = pad_token_id - 1`` (its ``last_token_id``), and 151845 ends it.

That mapping is no part of Emu3's config, so it comes from the directory's
``action_tokens.json`` or from the loader's ``action_tokens`` option (the end-of-action id, the
rest UniVLA's LIBERO defaults); the FAST vocabulary is the directory's ``fast_tokenizer/``. With
either missing, the directory is refused in one line.

Layout: vlarun's autoregressive one, [BOS, image blocks, instruction]. UniVLA's own processor
is not public in the sources checked; its LIBERO wrapper's history mode puts the instruction
before the images, so a trained UniVLA may expect [BOS, instruction, images], which vlarun's
token plans (visual tokens at fixed indices) do not serve yet. Its evaluation also masks the
logits to the FAST ids and END while decoding; vlarun takes the plain argmax.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlarun.models.emu3_vq import (
    EMU3_MEAN,
    EMU3_STD,
    VQConfig,
    VQImageTokens,
    is_decoder_weight,
    vq_name,
)
from vlarun.models.fast_head import FastConfig
from vlarun.models.fast_tokens import FAST_TOKENIZER_DIR, TOKENIZER_FILE

ACTION_TOKENS_FILE = "action_tokens.json"
# Emu3's image markers (Emu3Processor / Emu3ImageVocabularyMapping), looked up in
# ``vocabulary_map``; the size text "h*w" is written digit by digit, as Emu3's Qwen-style
# tokenizer splits numbers into single digits.
IMAGE_START, IMAGE_WRAPPER, IMAGE_END = "<|image start|>", "<|image token|>", "<|image end|>"
END_OF_ROW, END_OF_FRAME = "<|extra_200|>", "<|extra_201|>"
VISUAL = "<|visual token {:06d}|>"
# UniVLA's LIBERO evaluation (model_wrapper_emu.py): two 200 x 200 views (agent and wrist), a
# 10 x 7 chunk, at most 80 decoded tokens, end-of-action 151845.
UNIVLA_IMAGE, UNIVLA_VIEWS, UNIVLA_CHUNK, UNIVLA_DIM, UNIVLA_MAX_TOKENS = 200, 2, 10, 7, 80
UNIVLA_END = 151845

# Emu3TextConfig's defaults: a config.json may keep only the fields that differ from them.
TEXT_DEFAULTS = {
    "vocab_size": 184622,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 9216,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "pad_token_id": 151643,
    "bos_token_id": 151849,
    "tie_word_embeddings": False,
}


class UniVLAError(ValueError):
    """An Emu3 directory vlarun cannot load; the message is one line naming the field."""


def is_emu3(config: dict) -> bool:
    return config.get("model_type") == "emu3"


def text_config(config: dict, where: str) -> dict:
    """The Llama-style dict of Emu3's text model (``LlamaConfig.from_hf``), checked."""
    text = TEXT_DEFAULTS | (config.get("text_config") or {})
    if text.get("model_type", "emu3_text_model") != "emu3_text_model":
        raise UniVLAError(f"{where}: text_config is a {text['model_type']!r} model, not Emu3's")
    for key, want in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
        if text.get(key, want) != want:
            raise UniVLAError(f"{where}: text_config {key}={text[key]!r}; vlarun's LM has {want}")
    if "tie_word_embeddings" in config:  # the top level decides the tie in transformers 5
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return text | {"model_type": "llama"}


def image_tokens(config: dict, vq: VQConfig, where: str) -> VQImageTokens:
    """Where the VQ's codes and Emu3's image markers sit in the LM vocabulary
    (``vocabulary_map``): the visual tokens must be ``codebook_size`` consecutive ids."""
    vocab = config.get("vocabulary_map") or {}
    if not vocab:
        raise UniVLAError(f"{where}: no vocabulary_map: Emu3's image token ids are unknown")

    def ids(*names: str) -> list[int]:
        missing = [n for n in names if n not in vocab]
        if missing:
            raise UniVLAError(f"{where}: vocabulary_map has no {', '.join(map(repr, missing))}")
        return [int(vocab[n]) for n in names]

    (start,) = ids(VISUAL.format(0))
    visual = ids(*(VISUAL.format(i) for i in range(vq.codebook_size)))
    if visual != list(range(start, start + vq.codebook_size)):
        raise UniVLAError(
            f"{where}: the {vq.codebook_size} visual tokens are not consecutive ids from {start}"
        )
    size = f"{vq.grid}*{vq.grid}"
    head = (*ids(IMAGE_START), *ids(*size), *ids(IMAGE_WRAPPER))
    (eol,) = ids(END_OF_ROW)
    return VQImageTokens(vq, start, head, eol, tuple(ids(END_OF_FRAME, IMAGE_END)))


def image_norm(directory: str | Path) -> tuple[tuple, tuple]:
    """(mean, std) of the directory's ``preprocessor_config.json``, else Emu3's processor's."""
    path = Path(directory) / "preprocessor_config.json"
    if not path.exists():
        return EMU3_MEAN, EMU3_STD
    pre = json.loads(path.read_text())
    return tuple(pre.get("image_mean", EMU3_MEAN)), tuple(pre.get("image_std", EMU3_STD))


def read_action_tokens(directory: str | Path, option: int | None, pad_id: int) -> dict:
    """The FAST action-token mapping: ``action_tokens.json`` in the directory, else the
    ``option`` (the end-of-action id, the rest UniVLA's LIBERO defaults), else one UniVLAError;
    and the FAST vocabulary size of the directory's ``fast_tokenizer/`` (required). The file
    holds ``{"end_id": 151845, "top_id": 151642, "max_tokens": 80, "chunk": 10,
    "action_dim": 7, "image_size": 200, "num_images": 2}``, all but ``end_id`` optional
    (``top_id``: the LM id of FAST id 0, default ``pad_token_id - 1``)."""
    d = Path(directory)
    path = d / ACTION_TOKENS_FILE
    if path.exists():
        try:
            spec = json.loads(path.read_text())
            end = int(spec["end_id"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise UniVLAError(f"{path}: needs an integer end_id ({e})") from None
    elif option is not None:
        spec, end = {}, int(option)
    else:
        raise UniVLAError(
            f"{directory}: no {ACTION_TOKENS_FILE} and no action_tokens option: an Emu3 "
            "checkpoint does not say which token ends a FAST action code (UniVLA: 151845)"
        )
    fast = d / FAST_TOKENIZER_DIR / TOKENIZER_FILE
    if not fast.exists():
        raise UniVLAError(
            f"{directory}: no {FAST_TOKENIZER_DIR}/{TOKENIZER_FILE}: UniVLA's actions are FAST "
            "codes; copy its FAST tokenizer beside the weights (vlarun never downloads)"
        )
    from tokenizers import Tokenizer

    return {
        "end_id": end,
        "top_id": int(spec.get("top_id", pad_id - 1)),
        "max_tokens": int(spec.get("max_tokens", UNIVLA_MAX_TOKENS)),
        "chunk": int(spec.get("chunk", UNIVLA_CHUNK)),
        "action_dim": int(spec.get("action_dim", UNIVLA_DIM)),
        "image_size": int(spec.get("image_size", UNIVLA_IMAGE)),
        "num_images": int(spec.get("num_images", UNIVLA_VIEWS)),
        "fast_vocab": Tokenizer.from_file(str(fast)).get_vocab_size(),
    }


def fast_config(tokens: dict, lm_vocab: int) -> FastConfig:
    """FAST id f <-> LM id ``top_id - f``: vlarun's ``V - 1 - skip - f`` with
    ``skip = V - 1 - top_id``."""
    return FastConfig(
        vocab_size=tokens["fast_vocab"],
        max_tokens=tokens["max_tokens"],
        end_id=tokens["end_id"],
        skip_tokens=lm_vocab - 1 - tokens["top_id"],
    )


_LM = (
    ("model.text_model.", "language_model.model."),
    ("text_model.model.", "language_model.model."),
    ("text_model.lm_head.", "language_model.lm_head."),
    ("lm_head.", "language_model.lm_head."),
)


def rename(name: str) -> str | None:
    """An Emu3 weight's name in vlarun's VLA, or None for the VQ decoder's (not loaded).
    Unknown names pass through, to be reported as unexpected keys by the loader."""
    for old, new in _LM:
        if name.startswith(old):
            return new + name[len(old) :]
    if is_decoder_weight(name):
        return None
    vq = vq_name(name)
    return name if vq is None else "vision_backbone." + vq
