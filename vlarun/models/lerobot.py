"""LeRobot policy directories (``config.json`` with ``"type"``: ``"pi0"``, ``"pi05"``,
``"smolvla"`` or ``"pi0_fast"``) as vlarun VLAs of the flow family (pi0_fast: autoregressive).

What a LeRobot directory holds (lerobot 7427f31, ``policies/{pi0,pi05,smolvla,pi0_fast}``):
``config.json`` (backbone variants or sizes, ``chunk_size``, ``max_state_dim`` /
``max_action_dim``, ``tokenizer_max_length``, ``input_features`` / ``output_features``,
``normalization_mapping``), ``model.safetensors`` (fp32), and the processor pipelines
``policy_preprocessor.json`` / ``policy_postprocessor.json`` whose normaliser steps name a
``state_file`` of flat statistics (``observation.state.mean``, ...).

pi0 (openpi's PyTorch port) maps onto the flow family so:
  * PaliGemma = SigLIP (last layer + post-LayerNorm) -> ``multi_modal_projector.linear`` -> Gemma;
    the prefix is [every camera's tokens, <bos>, task + "\\n"], attended bidirectionally
    (``images_first``), text embeddings scaled by sqrt(width), image tokens not;
  * the action expert (``gemma_expert``) reads the prefix's cached K/V in every layer; its
    suffix is [state token, H action tokens] exactly as ``FlowMatchingExpert`` builds it;
  * states and actions are padded to 32 wide inside the model; statistics normalise the
    robot's own dimensions, which are the first ones.

pi05 differs in two places: the flow time conditions every norm of the expert (adaptive
RMSNorm with gated residuals, ``time_mlp_in/out``) instead of joining the action tokens, and
the state (QUANTILES-normalised, in 256 bins) is written into the prompt ("Task: ..., State:
...;\\nAction: "), so the expert has no state token.

SmolVLA (``_smolvla_config``): SmolVLM2's vision tower, pixel-shuffle connector and first
``num_vlm_layers`` text layers; image and text embeddings scaled by sqrt(width); the state a
prefix token after the text in an attention block of its own; no BOS; an expert whose odd
layers cross-attend to its own projections of the prefix's keys and values; causal actions.

pi0_fast (``_pi0_fast_config``) is pi0's PaliGemma without an expert: the LM decodes greedily
after [every camera's tokens, <bos>, "Task: ..., State: ...;\n", <bos>] (LeRobot appends a
second <bos> after the prompt; the state is written in 256 bins as pi05's), every prefix token
seeing every other. It writes "Action: ", the FAST code (``fast_head.py``: FAST id f is the LM
id ``vocab - 1 - fast_skip_tokens - f``) and "|"; the code is a (n_action_steps, robot action
dim) chunk, unpadded, decoded as LeRobot's ``detokenize_actions`` does (relaxed).

LeRobot's ``empty_cameras`` are masked out of attention and positions: simply absent here.
Nothing is fetched: what LeRobot downloads at run time (the tokenizer; SmolVLA's backbone
config; pi0_fast's FAST tokenizer) must be in the directory (``tokenizer.json``,
``vlm_config.json``, ``fast_tokenizer/``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.models.fast_head import FastConfig
from vlarun.models.fast_tokens import FAST_TOKENIZER_DIR, FastTokenizer
from vlarun.models.flow_expert import FlowExpertConfig
from vlarun.models.llama import LlamaConfig
from vlarun.models.presets.real import GEMMA_2B, GEMMA_300M_EXPERT, PI0_FAST_TOKENS, SMOLVLA_LAYOUT
from vlarun.models.vit import ViTConfig
from vlarun.models.vla import VLAConfig

LEROBOT_TYPES = ("pi0", "pi05", "smolvla", "pi0_fast")
# Types LeRobot no longer has, with the reason vlarun does not load them (one line each).
RETIRED_TYPES = {
    "pi0fast": "LeRobot's earlier pi0-FAST port (policies/pi0fast, removed from LeRobot in "
    "6e8be57, October 2025), whose weight layout vlarun does not load; LeRobot's current "
    "port is type 'pi0_fast'",
}
PALIGEMMA_BOS = 2  # PaliGemma's <bos>; LeRobot's tokenizer step adds it before the task
TOKENIZER_FILE = "tokenizer.json"

# LeRobot's Gemma variants (policies/pi0/modeling_pi0.py ``get_gemma_config``), and two
# random-weight test shapes of vlarun's own (never in a LeRobot checkpoint) so parity tests
# run in seconds. A PaliGemma variant carries its SigLIP tower: LeRobot fixes So400m/14.
_SO400M = ViTConfig.siglip_so400m(224, feature_layer=-1)
_TINY_SIGLIP = ViTConfig("siglip", 224, 14, 64, 2, 4, 128, feature_layer=-1)
# LeRobot's joint attention reshapes to 8 heads, as both real variants have; the vocabulary
# stays PaliGemma's 257152 (LeRobot fixes it).
_TINY_GEMMA = dataclasses.replace(
    GEMMA_2B, hidden_size=64, intermediate_size=128, num_layers=2, head_dim=16
)
# (LeRobot also accepts paligemma_variant "gemma_300m", but fixes the projector's output at
# 2048 wide, so such a model cannot run there either; it is not offered here.)
PALIGEMMA_VARIANTS: dict[str, tuple[ViTConfig, LlamaConfig]] = {
    "gemma_2b": (_SO400M, GEMMA_2B),
    "vlarun_tiny": (_TINY_SIGLIP, _TINY_GEMMA),
}
EXPERT_VARIANTS: dict[str, LlamaConfig] = {
    "gemma_300m": GEMMA_300M_EXPERT,
    "gemma_2b": GEMMA_2B,
    "vlarun_tiny": dataclasses.replace(
        _TINY_GEMMA, hidden_size=48, intermediate_size=96, vocab_size=1
    ),
}

_TOWER = "vision_backbone.featurizer."
_EXPERT_HEADS: tuple[tuple[str, str | None], ...] = (
    ("model.state_proj.", "action_expert.state_proj."),  # pi0's state token
    ("model.action_in_proj.", "action_expert.action_in_proj."),
    ("model.action_time_mlp_in.", "action_expert.action_time_mlp_in."),
    ("model.action_time_mlp_out.", "action_expert.action_time_mlp_out."),
    ("model.action_out_proj.", "action_expert.action_out_proj."),
    ("model.time_mlp_in.", "action_expert.time_mlp_in."),  # pi05
    ("model.time_mlp_out.", "action_expert.time_mlp_out."),
)
# LeRobot weight name prefixes -> vlarun's, per policy type; None drops the tensor (tied or
# unused LM heads). Below the prefixes the names are transformers' (so are vlarun's).
_PALIGEMMA: tuple[tuple[str, str | None], ...] = (
    ("model.paligemma_with_expert.paligemma.model.vision_tower.", _TOWER),
    ("model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.", "projector."),
    ("model.paligemma_with_expert.paligemma.model.language_model.", "language_model.model."),
    # The head is tied to embed_tokens. LeRobot saves through huggingface_hub's
    # save_torch_state_dict, which keeps a shared tensor under the first of its names in sort
    # order: the head's. LeRobot's loader copies it back to embed_tokens; so does this name.
    ("model.paligemma_with_expert.paligemma.lm_head.", "language_model.model.embed_tokens."),
)
RENAMES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "pi0": (
        *_PALIGEMMA,
        ("model.paligemma_with_expert.gemma_expert.model.", "action_expert.expert.model."),
        ("model.paligemma_with_expert.gemma_expert.lm_head.", None),  # the expert emits no tokens
        *_EXPERT_HEADS,
    ),
    "smolvla": (
        ("model.vlm_with_expert.vlm.model.vision_model.", _TOWER + "vision_model."),
        ("model.vlm_with_expert.vlm.model.connector.modality_projection.", "projector."),
        ("model.vlm_with_expert.vlm.model.text_model.", "language_model.model."),
        ("model.vlm_with_expert.vlm.lm_head.", None),
        ("model.vlm_with_expert.lm_expert.", "action_expert.expert.model."),
        ("model.state_proj.", "proprio_projector."),  # SmolVLA's state is a prefix token
        *_EXPERT_HEADS[1:],
    ),
}
RENAMES["pi05"] = RENAMES["pi0"]
RENAMES["pi0_fast"] = _PALIGEMMA  # no expert: the LM's own head decodes the FAST code
# Parameters a LeRobot directory does not hold because LeRobot has no such module: the
# expert's one-entry embedding table (LeRobot sets ``embed_tokens = None``). Zero-filled.
ABSENT = ("action_expert.expert.model.embed_tokens.weight",)


class LeRobotError(ValueError):
    """A LeRobot directory vlarun cannot load, with the field or file that is the reason."""


def is_lerobot(config: Mapping) -> bool:
    """A LeRobot policy config (``type`` + features), not a transformers one."""
    return config.get("type") in LEROBOT_TYPES and "model_type" not in config


def rename(name: str, kind: str = "pi0") -> str | None:
    """vlarun's parameter name for a LeRobot tensor of a ``kind`` policy; None to drop it; the
    name unchanged when unknown (the loader then reports it as unexpected)."""
    for old, new in RENAMES[kind]:
        if name.startswith(old):
            if new is None:
                return None
            rest = name[len(old) :]
            if new == _TOWER and not rest.startswith("vision_model."):
                rest = "vision_model." + rest  # saved from transformers 5's in-memory names
            return new + rest
    return name


def camera_keys(config: Mapping) -> list[str]:
    """The checkpoint's cameras in LeRobot's order, without its masked ``empty_camera_*``."""
    feats = config.get("input_features") or {}
    return [k for k, f in feats.items() if f.get("type") == "VISUAL" and ".empty_camera_" not in k]


def _feature_width(config: Mapping, group: str, key: str) -> int | None:
    f = (config.get(group) or {}).get(key)
    return int(f["shape"][-1]) if f and f.get("shape") else None


def vla_config(config: Mapping, directory: str | Path) -> VLAConfig:
    """The VLAConfig of a LeRobot pi0 directory, or one LeRobotError naming the field."""
    where = f"{directory}/config.json"
    kind = config.get("type")
    _check_common(config, where)
    check_tokenizer(directory, config)
    if kind == "smolvla":
        return _smolvla_config(config, directory)
    if kind == "pi0_fast":
        return _pi0_fast_config(config, directory)
    for memory in ("use_visual_memory", "use_proprioceptive_memory"):
        if config.get(memory):
            raise LeRobotError(
                f"{where}: {memory}=true (pi05's frame / state history) is not supported"
            )
    vlm_name, tower, llm = _paligemma(config, where)
    expert_name = config.get("action_expert_variant", "gemma_300m")
    if expert_name not in EXPERT_VARIANTS:
        raise LeRobotError(
            f"{where}: action_expert_variant {expert_name!r}; known: {sorted(EXPERT_VARIANTS)}"
        )
    cams = camera_keys(config)
    expert = EXPERT_VARIANTS[expert_name]
    width = int(config.get("max_action_dim", 32))
    horizon = int(config.get("chunk_size", 50))
    pi05 = kind == "pi05"  # the time conditions the expert's norms; the state is prompt text
    flow = FlowExpertConfig(
        expert,
        action_dim=width,
        horizon=horizon,
        state_dim=0 if pi05 else int(config.get("max_state_dim", 32)),
        num_steps=int(config.get("num_inference_steps", 10)),
        time_cond="adarms" if pi05 else "mlp",
    )
    text = int(config.get("tokenizer_max_length", 200 if pi05 else 48))
    try:
        return VLAConfig(
            name=f"lerobot-{kind}-{vlm_name}",
            family="flow",
            llm=llm,
            vision=(tower,),
            connector="linear",
            num_images=len(cams),
            action_dim=width,
            chunk=horizon,
            max_text_tokens=text,
            prefix_causal=False,
            images_first=True,
            bos_id=PALIGEMMA_BOS,
            flow=flow,
            notes=f"LeRobot {kind} directory (PaliGemma + Gemma expert)",
        )
    except ValueError as e:
        raise LeRobotError(f"{where}: {e}") from None


def _paligemma(config: Mapping, where: str) -> tuple[str, ViTConfig, LlamaConfig]:
    """(variant name, SigLIP tower at the configured resolution, Gemma) of a PaliGemma prefix."""
    vlm_name = config.get("paligemma_variant", "gemma_2b")
    if vlm_name not in PALIGEMMA_VARIANTS:
        raise LeRobotError(
            f"{where}: paligemma_variant {vlm_name!r}; known: {sorted(PALIGEMMA_VARIANTS)}"
        )
    res = config.get("image_resolution", [224, 224])
    if len(res) != 2 or res[0] != res[1]:
        raise LeRobotError(f"{where}: image_resolution {res} must be square (PaliGemma's is)")
    tower, llm = PALIGEMMA_VARIANTS[vlm_name]
    return vlm_name, dataclasses.replace(tower, image_size=int(res[0])), llm


def _pi0_fast_config(config: Mapping, directory: str | Path) -> VLAConfig:
    """pi0_fast: the PaliGemma prefix, then greedy decoding of "Action: ", a FAST code and "|"
    (module docstring). The marker, the end and the FAST ids' place in the vocabulary come from
    the directory's two tokenizers, as LeRobot reads them."""
    where = f"{directory}/config.json"
    vlm_name, tower, llm = _paligemma(config, where)
    if tower.image_size != 224:  # PI0FastPaliGemma never sets the tower's size (pi0 does)
        raise LeRobotError(
            f"{where}: image_resolution {config['image_resolution']}; LeRobot's "
            "pi0_fast builds its SigLIP tower at 224 px whatever this says, so "
            "it runs at 224 only"
        )
    temperature = float(config.get("temperature", 0.0))
    if temperature > 0:
        raise LeRobotError(
            f"{where}: temperature={temperature} (sampled FAST codes); vlarun "
            "decodes greedily, as LeRobot does at temperature 0"
        )
    text = _text_tokenizer(directory, config)
    size = text.get_vocab_size(with_added_tokens=False)  # transformers' ``vocab_size``
    if size != llm.vocab_size:
        raise LeRobotError(
            f"{directory}/{TOKENIZER_FILE}: {size} tokens; LeRobot places the "
            "FAST ids from the top of the tokenizer's vocabulary, which must "
            f"then be the model's {llm.vocab_size}"
        )
    marks = {t: text.token_to_id(t) for t in ("|", "Action", ":")}
    if None in marks.values():
        absent = [t for t, i in marks.items() if i is None]
        raise LeRobotError(
            f"{directory}/{TOKENIZER_FILE}: no token {absent}; LeRobot's pi0_fast "
            "ends its code at '|' and checks it starts 'Action' ':'"
        )
    fast_dir = _fetched_file(
        directory,
        config,
        FAST_TOKENIZER_DIR,
        "tokenizer.json and processor_config.json",
        "decodes actions with",
    )
    try:
        fast_vocab = FastTokenizer.load(fast_dir, action_horizon=1, action_dim=1).vocab_size
    except (OSError, ValueError) as e:
        raise LeRobotError(f"{fast_dir}: {e}") from None
    horizon = int(config.get("n_action_steps", config.get("chunk_size", 50)))
    dim = _feature_width(config, "output_features", "action") or int(config["max_action_dim"])
    steps = int(config.get("max_decoding_steps", 256))
    validate = bool(config.get("validate_action_token_prefix", True))
    try:
        fast = FastConfig(
            vocab_size=fast_vocab,
            max_tokens=steps,
            end_id=marks["|"],
            skip_tokens=int(config.get("fast_skip_tokens", 128)),
            relaxed=True,
            strip=tuple(text.encode("Action: ", add_special_tokens=False).ids),
            starts=(marks["Action"], marks[":"]) if validate else (),
        )
        return VLAConfig(
            name=f"lerobot-pi0_fast-{vlm_name}",
            family="autoregressive",
            llm=llm,
            vision=(tower,),
            connector="linear",
            num_images=len(camera_keys(config)),
            action_dim=dim,
            chunk=horizon,
            max_text_tokens=int(config.get("tokenizer_max_length", 200)),
            prefix_causal=False,
            images_first=True,
            bos_id=PALIGEMMA_BOS,
            prompt_suffix_ids=(PALIGEMMA_BOS,),
            decode_tokens=min(PI0_FAST_TOKENS, steps),
            fast=fast,
            notes="LeRobot pi0_fast directory (PaliGemma decoding FAST tokens)",
        )
    except ValueError as e:
        raise LeRobotError(f"{where}: {e}") from None


def _text_tokenizer(directory: str | Path, config: Mapping):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(check_tokenizer(directory, config)))


def _check_common(config: Mapping, where: str) -> None:
    """What vlarun does not carry over from any LeRobot flow policy, each one line."""
    periods = (config.get("min_period", 4e-3), config.get("max_period", 4.0))
    if tuple(map(float, periods)) != (4e-3, 4.0):
        raise LeRobotError(
            f"{where}: min/max_period {periods}; vlarun's time embedding uses openpi's (0.004, 4.0)"
        )
    if config.get("use_relative_actions"):
        raise LeRobotError(
            f"{where}: use_relative_actions=true is not supported (the chunk "
            "would need the state added back per joint)"
        )
    if not camera_keys(config):
        raise LeRobotError(f"{where}: input_features name no VISUAL feature (camera)")
    for flag in (
        "use_visual_memory",
        "use_proprioceptive_memory",
        "add_image_special_tokens",
        "adapt_to_pi_aloha",
        "use_delta_joint_actions_aloha",
    ):
        if config.get(flag):
            raise LeRobotError(f"{where}: {flag}=true is not supported")
    if int(config.get("prefix_length", -1)) > 0:
        raise LeRobotError(
            f"{where}: prefix_length={config['prefix_length']} (a padded prefix) is not supported"
        )


def _hub_name(config: Mapping, name: str = TOKENIZER_FILE) -> str:
    """The model hub repository LeRobot fetches ``name`` from."""
    if config.get("type") == "smolvla":
        return config.get("vlm_model_name", "HuggingFaceTB/SmolVLM2-500M-Video-Instruct")
    if name == FAST_TOKENIZER_DIR:
        return config.get("action_tokenizer_name", "lerobot/fast-action-tokenizer")
    return config.get("text_tokenizer_name", "google/paligemma-3b-pt-224")


def _fetched_file(
    directory: str | Path, config: Mapping, name: str, hub_file: str, use: str
) -> Path:
    """``directory/name``, a copy of what LeRobot fetches from a model hub (``hub_file`` of
    the repository it names), or the one error that says where to get it."""
    path = Path(directory) / name
    copy = "them here into" if " and " in hub_file else "that file here as"
    if not path.exists():
        raise LeRobotError(
            f"{directory}: no {name}. LeRobot {config.get('type')} {use} "
            f"{_hub_name(config, name)}'s {hub_file}, which it fetches from a model hub at run "
            f"time; vlarun never downloads: copy {copy} {name}"
        )
    return path


def check_tokenizer(directory: str | Path, config: Mapping) -> Path:
    """The directory's tokenizer.json, or the one error that says where to get it."""
    return _fetched_file(directory, config, TOKENIZER_FILE, TOKENIZER_FILE, "tokenizes with")


VLM_CONFIG_FILE = "vlm_config.json"  # SmolVLA's backbone config (LeRobot fetches it)


def _intermediate(width: int) -> int:
    """SmolVLA's expert MLP width (smolvlm_with_expert ``get_intermediate_size``)."""
    hidden = int(4 * int(2 * width / 3))
    return 256 * ((hidden + 255) // 256)


def _smolvla_config(config: Mapping, directory: str | Path) -> VLAConfig:
    """SmolVLA: SmolVLM2's vision tower, pixel-shuffle connector and first ``num_vlm_layers``
    text layers; an expert ``expert_width_multiplier`` as wide with the VLM's heads, its
    odd layers cross-attending (``self_attn_every_n_layers``); RoPE at 10000 as LeRobot's own
    ``apply_rope`` (not the text model's configured theta)."""
    where = f"{directory}/config.json"
    path = _fetched_file(
        directory, config, VLM_CONFIG_FILE, "config.json", "builds its backbone from"
    )
    vlm = json.loads(path.read_text())
    text, vision = vlm.get("text_config") or {}, vlm.get("vision_config") or {}
    try:
        layers = int(config.get("num_vlm_layers", 16))
        if layers <= 0:
            layers = int(text["num_hidden_layers"])
        hf = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_parameters")}
        llm = LlamaConfig.from_hf(
            hf
            | {
                "model_type": "llama",
                "num_hidden_layers": layers,
                "rope_theta": 10000.0,
                "tie_word_embeddings": True,
            }
        )
        tower = ViTConfig(
            kind="siglip",
            image_size=int(vision["image_size"]),
            patch_size=int(vision["patch_size"]),
            hidden_size=int(vision["hidden_size"]),
            num_layers=int(vision["num_hidden_layers"]),
            num_heads=int(vision["num_attention_heads"]),
            intermediate_size=int(vision["intermediate_size"]),
            layer_norm_eps=float(vision.get("layer_norm_eps", 1e-6)),
            feature_layer=-1,
            gelu_approximate="tanh" if "tanh" in vision.get("hidden_act", "tanh") else "none",
        )
    except (KeyError, TypeError, ValueError) as e:
        raise LeRobotError(f"{path}: not a SmolVLM config ({e})") from None
    size = config.get("resize_imgs_with_padding") or [tower.image_size] * 2
    if list(size) != [tower.image_size] * 2:
        raise LeRobotError(
            f"{where}: resize_imgs_with_padding {size} but the vision tower "
            f"takes {tower.image_size} px"
        )
    experts = int(config.get("num_expert_layers", -1))
    if experts > 0 and experts != layers:
        raise LeRobotError(
            f"{where}: num_expert_layers={experts} of {layers} VLM layers (an "
            "expert shallower than the VLM) is not supported"
        )
    width = int(llm.hidden_size * float(config.get("expert_width_multiplier", 0.75)))
    expert = dataclasses.replace(
        llm,
        vocab_size=1,
        hidden_size=width,
        intermediate_size=_intermediate(width),
        head_dim=llm.hd,
    )
    every = int(config.get("self_attn_every_n_layers", 2))
    cross = "cross" in str(config.get("attention_mode", "cross_attn"))
    flow = FlowExpertConfig(
        expert,
        action_dim=int(config.get("max_action_dim", 32)),
        horizon=int(config.get("chunk_size", 50)),
        state_dim=0,
        num_steps=int(config.get("num_steps", 10)),
        cross_every=max(every, 1) if cross else 0,
        cross_kv_dim=llm.num_kv_heads * llm.hd,
        causal_actions=True,
    )
    if cross and every <= 0:  # LeRobot then cross-attends in every layer but the prefill
        raise LeRobotError(
            f"{where}: attention_mode {config.get('attention_mode')!r} with "
            f"self_attn_every_n_layers={every} is not supported"
        )
    try:
        return VLAConfig(
            name="lerobot-smolvla",
            family="flow",
            llm=llm,
            vision=(tower,),
            connector="pixel-shuffle",
            pixel_shuffle=int(vlm.get("scale_factor", 4)),
            num_images=len(camera_keys(config)),
            action_dim=flow.action_dim,
            chunk=flow.horizon,
            max_text_tokens=int(config.get("tokenizer_max_length", 48)),
            proprio_dim=int(config.get("max_state_dim", 32)),
            flow=flow,
            **SMOLVLA_LAYOUT,
            notes="LeRobot smolvla directory (SmolVLM2 + cross-attending expert)",
        )
    except ValueError as e:
        raise LeRobotError(f"{where}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Normalisation (lerobot/processor/normalize_processor.py, the formulas; eps as saved)

MODES = ("IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES")


@dataclass(frozen=True)
class FeatureNorm:
    """One feature's LeRobot normaliser, and the model width it is padded to / cut from.

    ``normalize`` maps the robot's values (..., D) into the model's (..., width), zero-padded
    as LeRobot's ``pad_vector``; ``unnormalize`` takes the model's first D dimensions back to
    robot units. IDENTITY passes values through."""

    mode: str
    dim: int
    width: int
    a: tuple[float, ...] = ()  # mean | min | q01
    b: tuple[float, ...] = ()  # std  | max | q99
    eps: float = 1e-8
    # False: the config asks for statistics the directory lacks (no processor file): values
    # pass through unchanged, and are not in robot units (Policy.action_units says so).
    statistics: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise LeRobotError(f"normalisation mode {self.mode!r}; vlarun knows {MODES}")
        if not 0 < self.dim <= self.width:
            raise LeRobotError(f"feature of {self.dim} dims does not fit the model's {self.width}")
        if self.mode != "IDENTITY" and not (len(self.a) == len(self.b) == self.dim):
            raise LeRobotError(
                f"{self.mode} statistics have {len(self.a)}/{len(self.b)} entries for a "
                f"{self.dim}-dim feature"
            )

    def _denom(self) -> np.ndarray:
        a, b = np.asarray(self.a), np.asarray(self.b)
        if self.mode == "MEAN_STD":
            return b + self.eps
        d = b - a
        return np.where(d == 0, self.eps, d)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] != self.dim:
            raise ValueError(f"state has {x.shape[-1]} entries; the checkpoint's has {self.dim}")
        a = np.asarray(self.a, dtype=np.float32)
        if self.mode == "MEAN_STD":
            y = (x - a) / self._denom()
        elif self.mode == "IDENTITY":
            y = x
        else:
            y = 2.0 * (x - a) / self._denom() - 1.0
        pad = np.zeros((*y.shape[:-1], self.width - self.dim), dtype=np.float32)
        return np.concatenate((y.astype(np.float32), pad), axis=-1)

    def unnormalize(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float32)[..., : self.dim]
        a = np.asarray(self.a, dtype=np.float32)
        if self.mode == "MEAN_STD":
            return (y * np.asarray(self.b, dtype=np.float32) + a).astype(np.float32)
        if self.mode == "IDENTITY":
            return y
        return ((y + 1.0) * self._denom() / 2.0 + a).astype(np.float32)


_STAT_FIELDS = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99")}


def _normaliser_step(directory: Path, pipeline: str, registry: str) -> tuple[dict, dict]:
    """(step config, flat statistics) of a processor pipeline's normaliser step; ({}, {})
    when the directory has no such pipeline or step (a base checkpoint without statistics)."""
    from safetensors.numpy import load_file

    path = directory / f"{pipeline}.json"
    if not path.exists():
        return {}, {}
    steps = json.loads(path.read_text()).get("steps", [])
    for step in steps:
        if step.get("registry_name") == registry:
            state = step.get("state_file")
            stats = load_file(str(directory / state)) if state else {}
            return step.get("config", {}), stats
    return {}, {}


def _feature_norm(
    config: Mapping, step: dict, stats: dict, key: str, kind: str, width: int, dim: int, where: str
) -> FeatureNorm:
    mapping = step.get("norm_map") or config.get("normalization_mapping") or {}
    mode = str(mapping.get(kind, "IDENTITY"))
    eps = float(step.get("eps", 1e-8))
    if mode == "IDENTITY":
        return FeatureNorm("IDENTITY", dim, width, eps=eps)
    if mode not in _STAT_FIELDS:
        raise LeRobotError(f"{where}: {kind} normalisation {mode!r}; vlarun knows {MODES}")
    fields = _STAT_FIELDS[mode]
    names = [f"{key}.{f}" for f in fields]
    if any(n not in stats for n in names):
        if not stats:  # no statistics saved at all: leave the values as they are, and say so
            return FeatureNorm("IDENTITY", dim, width, eps=eps, statistics=False)
        raise LeRobotError(f"{where}: {mode} for {key} needs {names}; the file has {sorted(stats)}")
    a, b = (tuple(float(v) for v in np.asarray(stats[n]).reshape(-1)) for n in names)
    return FeatureNorm(mode, dim, width, a, b, eps)


@dataclass(frozen=True)
class LeRobotIO:
    """How raw observations become the model's inputs and its outputs robot actions."""

    state: FeatureNorm
    action: FeatureNorm
    prompt: str  # the Policy's prompt template (tokenizer.PROMPTS)
    resize: str  # how frames of another size are letterboxed (Policy.resize)
    cameras: tuple[str, ...]  # the declared camera features, in the model's order
    state_key: str | None  # the declared state feature, if any


def read_io(directory: str | Path, config: Mapping, cfg: VLAConfig) -> LeRobotIO:
    """State and action normalisers from the processor pipelines (statistics in their
    safetensors), widths from config.json's features."""
    d = Path(directory)
    pre_cfg, pre_stats = _normaliser_step(d, "policy_preprocessor", "normalizer_processor")
    post_cfg, post_stats = _normaliser_step(d, "policy_postprocessor", "unnormalizer_processor")
    state_dim = _feature_width(config, "input_features", "observation.state") or cfg.state_dim
    action_dim = _feature_width(config, "output_features", "action") or cfg.action_dim
    # pi0 pads the state to the expert's width; pi05 writes its own dimensions into the prompt
    width = cfg.state_dim or state_dim
    state = _feature_norm(
        config,
        pre_cfg,
        pre_stats,
        "observation.state",
        "STATE",
        width,
        state_dim,
        f"{d}/policy_preprocessor.json",
    )
    action = _feature_norm(
        config,
        post_cfg,
        post_stats,
        "action",
        "ACTION",
        cfg.action_dim,
        action_dim,
        f"{d}/policy_postprocessor.json",
    )
    kind = config.get("type")
    # pi05 and pi0_fast write the state in the text
    prompt = kind if kind in ("pi05", "pi0_fast") else "task-newline"
    resize = "pad-topleft" if kind == "smolvla" else "pad"  # SmolVLA pads left/top, openpi centres
    declared = "observation.state" in (config.get("input_features") or {})
    return LeRobotIO(
        state,
        action,
        prompt,
        resize,
        tuple(camera_keys(config)),
        "observation.state" if declared else None,
    )
