"""Hugging Face LLaVA checkpoints (``LlavaForConditionalGeneration``) as vlarun's LLaVA-VLA.

A directory with ``config.json`` (``model_type: "llava"``: ``vision_config`` a CLIP tower,
``text_config`` a Llama, ``vision_feature_layer``, ``vision_feature_select_strategy``,
``image_token_index`` or ``image_token_id``, ``projector_hidden_act``) and safetensors weights in
either layout transformers writes:
  * 4.x: ``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``,
    ``language_model.lm_head.*`` (transformers 5 saves this layout too, without
    ``vision_model.`` under ``vision_tower.``);
  * 5.x in memory: ``model.vision_tower.*``, ``model.multi_modal_projector.*``,
    ``model.language_model.*``, ``lm_head.*``.

It loads into the autoregressive family: the CLIP tower's patch features of
``vision_feature_layer`` (CLS dropped, strategy "default"), the two-layer projector, the Llama,
and actions as OpenVLA's 256 bins on the last ids below ``vocab_size`` of the action-bin mapping.
That mapping is no part of LLaVA's config, so it comes from the directory's ``action_bins.json``
or from the loader's ``action_bins`` option (the vocabulary size the bins count down from); with
neither, the directory is refused in one line.

The prompt is LLaVA-1.5's: ``USER: <image>\\nWhat action should the robot take to
{instruction}? ASSISTANT:``, tokenized whole by the checkpoint's ``tokenizer.json`` as LLaVA's
processor does, with the patch features in place of ``<image>``. The ids before ``<image>``
("USER: ") are the same for every instruction and become ``VLAConfig.image_prefix_ids``; so a
LLaVA directory needs its ``tokenizer.json``, refused in one line without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from vlarun.models.tokenizer import llava_prompt

IMAGE_TOKEN = "<image>"
ACTION_BINS_FILE = "action_bins.json"
N_BINS = 256  # vlarun's action tokens: OpenVLA's 256 bins over [-1, 1]
# LLaVA-VLA's chunk when action_bins.json does not say: 5 steps x 7 dimensions = 35 tokens.
DEFAULT_CHUNK, DEFAULT_ACTION_DIM = 5, 7


class LlavaError(ValueError):
    """A LLaVA directory vlarun cannot load; the message is one line naming the field."""


def is_llava(config: dict) -> bool:
    return config.get("model_type") == "llava"


def image_token_id(config: dict) -> int:
    """``image_token_index`` (transformers 4) or ``image_token_id`` (5)."""
    for key in ("image_token_id", "image_token_index"):
        if config.get(key) is not None:
            return int(config[key])
    return 32000  # LlavaConfig's default


def check(config: dict, where: str) -> None:
    """One LlavaError naming the first field vlarun cannot build."""
    vision = config.get("vision_config") or {}
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise LlavaError(
            f"{where}: vision_config is a {vision.get('model_type')!r} tower; "
            "vlarun loads LLaVA's CLIP tower"
        )
    layer = config.get("vision_feature_layer", -2)
    if not isinstance(layer, int) or layer >= 0:
        raise LlavaError(
            f"{where}: vision_feature_layer={layer!r}; vlarun takes one negative "
            "layer index (LLaVA-1.5: -2)"
        )
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy != "default":
        raise LlavaError(
            f"{where}: vision_feature_select_strategy={strategy!r}; vlarun feeds "
            "the patch features without CLS ('default')"
        )
    act = config.get("projector_hidden_act", "gelu")
    if act != "gelu":
        raise LlavaError(f"{where}: projector_hidden_act={act!r}; vlarun's projector uses gelu")
    if config.get("multimodal_projector_bias", True) is not True:
        raise LlavaError(f"{where}: multimodal_projector_bias=false; vlarun's projector has biases")
    text = config.get("text_config") or {}
    if text.get("model_type", "llama") != "llama":
        raise LlavaError(
            f"{where}: text_config is a {text.get('model_type')!r} model; vlarun loads a Llama LM"
        )


def read_action_bins(directory: str | Path, option: int | None) -> dict:
    """The action-bin mapping: ``action_bins.json`` in the directory, else the ``option`` (the
    vocabulary size the 256 bins count down from), else one LlavaError. The file holds
    ``{"vocab_size": V, "n_bins": 256, "chunk": 5, "action_dim": 7}``: action ids are
    ``V - 256 .. V - 1`` with OpenVLA's conventions (``ActionTokenizer``)."""
    path = Path(directory) / ACTION_BINS_FILE
    if path.exists():
        try:
            bins = json.loads(path.read_text())
            vocab = int(bins["vocab_size"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise LlavaError(f"{path}: needs an integer vocab_size ({e})") from None
    elif option is not None:
        bins, vocab = {}, int(option)
    else:
        raise LlavaError(
            f"{directory}: no {ACTION_BINS_FILE} and no action_bins option: a LLaVA checkpoint "
            "does not say which token ids are action bins (give the vocabulary size the 256 "
            "bins count down from, e.g. 32000)"
        )
    n = bins.get("n_bins", N_BINS)
    lo, hi = bins.get("min_action", -1.0), bins.get("max_action", 1.0)
    if n != N_BINS or (lo, hi) != (-1.0, 1.0):
        raise LlavaError(
            f"{path}: {n} bins over [{lo}, {hi}]; vlarun's action tokens are 256 bins over [-1, 1]"
        )
    return {
        "vocab_size": vocab,
        "chunk": int(bins.get("chunk", DEFAULT_CHUNK)),
        "action_dim": int(bins.get("action_dim", DEFAULT_ACTION_DIM)),
    }


def prompt_split(ids: list[int], image_id: int, where: str = "the prompt") -> tuple[list, list]:
    """(ids before the image token, ids after it) of a tokenized LLaVA prompt."""
    if ids.count(image_id) != 1:
        raise LlavaError(
            f"{where} holds the image token {image_id} {ids.count(image_id)} times, not once"
        )
    i = ids.index(image_id)
    return ids[:i], ids[i + 1 :]


def image_prefix_ids(directory: str | Path, image_id: int, bos_id: int | None) -> tuple[int, ...]:
    """The ids of the prompt before ``<image>`` ("USER: ") by the directory's tokenizer.json;
    one LlavaError when the directory has none (its ids would be bytes, not the LM's)."""
    from vlarun.models.tokenizer import HFTokenizer

    path = Path(directory) / "tokenizer.json"
    if not path.exists():
        raise LlavaError(
            f"{directory}: no tokenizer.json. A LLaVA checkpoint tokenizes its prompt with its "
            "Llama tokenizer: copy tokenizer.json from the repository the weights came from; "
            "vlarun never downloads"
        )
    ids = HFTokenizer(path, bos_id).encode(llava_prompt("x"))
    return tuple(prompt_split(ids, image_id, f"{path}: LLaVA's prompt")[0])


# (HF name pattern, vlarun name): the 4.x and 5.x layouts, both to vlarun's prismatic names.
_RENAMES = (
    (
        re.compile(r"^(?:model\.)?vision_tower\.(?:vision_model\.)?"),
        "vision_backbone.featurizer.vision_model.",
    ),
    (re.compile(r"^(?:model\.)?multi_modal_projector\.linear_1\."), "projector.fc1."),
    (re.compile(r"^(?:model\.)?multi_modal_projector\.linear_2\."), "projector.fc2."),
    (re.compile(r"^language_model\.model\."), "language_model.model."),
    (re.compile(r"^model\.language_model\."), "language_model.model."),
    (re.compile(r"^(?:language_model\.)?lm_head\."), "language_model.lm_head."),
)


def rename(name: str) -> str:
    """A LLaVA weight's name in vlarun's VLA (unknown names pass through, to be reported as
    unexpected keys by the loader)."""
    for pattern, target in _RENAMES:
        new, n = pattern.subn(target, name, count=1)
        if n:
            return new
    return name
