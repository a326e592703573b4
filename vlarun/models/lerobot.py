"""LeRobot policy directories (``config.json`` with ``"type": "pi0"`` or ``"pi05"``) as
vlarun VLAs.

What a LeRobot pi0 directory holds (lerobot 7427f31, ``policies/pi0``; openpi's PyTorch port):
``config.json`` (variants by name, ``chunk_size``, ``max_state_dim`` / ``max_action_dim``,
``tokenizer_max_length``, ``input_features`` / ``output_features``, ``normalization_mapping``),
``model.safetensors`` (fp32, ``model.paligemma_with_expert.*`` and the projections), and the
processor pipelines ``policy_preprocessor.json`` / ``policy_postprocessor.json`` whose
normaliser steps name a ``state_file`` of flat statistics (``observation.state.mean``, ...).

How the model maps onto vlarun's flow family:
  * PaliGemma = SigLIP (last layer + post-LayerNorm) -> ``multi_modal_projector.linear`` -> Gemma;
    the prefix is [every camera's tokens, <bos>, task + "\\n"], attended bidirectionally
    (``images_first``), text embeddings scaled by sqrt(width), image tokens not;
  * the action expert (``gemma_expert``) reads the prefix's cached K/V in every layer; its
    suffix is [state token, H action tokens] exactly as ``FlowMatchingExpert`` builds it;
  * states and actions are padded to 32 wide inside the model; statistics normalise the
    robot's own dimensions, which are the first ones.

pi05 differs in two places, both carried over: the flow time conditions every norm of the
expert (adaptive RMSNorm with gated residuals, ``time_mlp_in/out``) instead of joining the
action tokens, and the state (QUANTILES-normalised, in 256 bins) is written into the prompt
("Task: ..., State: ...;\nAction: "), so the expert has no state token.

Not carried over: SmolVLA (state in the prefix, cross-attention layers) is refused by name.
LeRobot's ``empty_cameras`` are masked out of attention and positions: simply absent here.
Nothing is fetched: the PaliGemma tokenizer LeRobot downloads at run time must be in the
directory as ``tokenizer.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlarun.models.flow_expert import FlowExpertConfig
from vlarun.models.llama import LlamaConfig
from vlarun.models.presets import GEMMA_2B, GEMMA_300M_EXPERT
from vlarun.models.vit import ViTConfig
from vlarun.models.vla import VLAConfig

LEROBOT_TYPES = ("pi0", "pi05", "smolvla")
PALIGEMMA_BOS = 2  # PaliGemma's <bos>; LeRobot's tokenizer step adds it before the task
TOKENIZER_FILE = "tokenizer.json"

# LeRobot's Gemma variants (policies/pi0/modeling_pi0.py ``get_gemma_config``), and two
# random-weight test shapes of vlarun's own (never in a LeRobot checkpoint) so parity tests
# run in seconds. A PaliGemma variant carries its SigLIP tower: LeRobot fixes So400m/14.
_SO400M = ViTConfig.siglip_so400m(224, feature_layer=-1)
_TINY_SIGLIP = ViTConfig("siglip", 224, 14, 64, 2, 4, 128, feature_layer=-1)
_TINY_GEMMA = LlamaConfig(
    vocab_size=GEMMA_2B.vocab_size,  # LeRobot fixes PaliGemma's vocabulary at 257152
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=8,  # LeRobot's joint attention reshapes to 8 heads (as both real variants have)
    num_kv_heads=1,
    head_dim=16,
    rms_norm_eps=1e-6,
    max_positions=8192,
    mlp_act="gelu_tanh",
    gemma_norm=True,
    tie_embeddings=True,
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
# LeRobot weight name prefixes -> vlarun's; None drops the tensor (tied or unused LM heads).
_RENAMES: tuple[tuple[str, str | None], ...] = (
    ("model.paligemma_with_expert.paligemma.model.vision_tower.", "vision_backbone.featurizer."),
    ("model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.", "projector."),
    ("model.paligemma_with_expert.paligemma.model.language_model.", "language_model.model."),
    ("model.paligemma_with_expert.paligemma.lm_head.", None),  # tied to embed_tokens
    ("model.paligemma_with_expert.gemma_expert.model.", "action_expert.expert.model."),
    ("model.paligemma_with_expert.gemma_expert.lm_head.", None),  # the expert emits no tokens
    ("model.state_proj.", "action_expert.state_proj."),
    ("model.action_in_proj.", "action_expert.action_in_proj."),
    ("model.action_time_mlp_in.", "action_expert.action_time_mlp_in."),
    ("model.action_time_mlp_out.", "action_expert.action_time_mlp_out."),
    ("model.action_out_proj.", "action_expert.action_out_proj."),
    ("model.time_mlp_in.", "action_expert.time_mlp_in."),  # pi05
    ("model.time_mlp_out.", "action_expert.time_mlp_out."),
)
# Parameters a LeRobot directory does not hold because LeRobot has no such module: the
# expert's one-entry embedding table (LeRobot sets ``embed_tokens = None``). Zero-filled.
ABSENT = ("action_expert.expert.model.embed_tokens.weight",)


class LeRobotError(ValueError):
    """A LeRobot directory vlarun cannot load, with the field or file that is the reason."""


def is_lerobot(config: Mapping) -> bool:
    """A LeRobot policy config (``type`` + features), not a transformers one."""
    return config.get("type") in LEROBOT_TYPES and "model_type" not in config


def rename(name: str) -> str | None:
    """vlarun's parameter name for a LeRobot pi0 tensor; None to drop it; the name unchanged
    when unknown (the loader then reports it as unexpected)."""
    for old, new in _RENAMES:
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
    return [k for k, f in feats.items()
            if f.get("type") == "VISUAL" and ".empty_camera_" not in k]  # fmt: skip


def _feature_width(config: Mapping, group: str, key: str) -> int | None:
    f = (config.get(group) or {}).get(key)
    return int(f["shape"][-1]) if f and f.get("shape") else None


def vla_config(config: Mapping, directory: str | Path) -> VLAConfig:
    """The VLAConfig of a LeRobot pi0 directory, or one LeRobotError naming the field."""
    where = f"{directory}/config.json"
    kind = config.get("type")
    if kind == "smolvla":
        raise LeRobotError(f"{where}: type 'smolvla' is not supported yet (its state token sits "
                           "in the prefix and its expert cross-attends to projected prefix keys "
                           "in alternate layers); vlarun loads LeRobot pi0 and pi05 "
                           "directories")  # fmt: skip
    for memory in ("use_visual_memory", "use_proprioceptive_memory"):
        if config.get(memory):
            raise LeRobotError(f"{where}: {memory}=true (pi05's frame / state history) is not "
                               "supported")  # fmt: skip
    vlm_name = config.get("paligemma_variant", "gemma_2b")
    expert_name = config.get("action_expert_variant", "gemma_300m")
    if vlm_name not in PALIGEMMA_VARIANTS:
        raise LeRobotError(f"{where}: paligemma_variant {vlm_name!r}; known: "
                           f"{sorted(PALIGEMMA_VARIANTS)}")  # fmt: skip
    if expert_name not in EXPERT_VARIANTS:
        raise LeRobotError(f"{where}: action_expert_variant {expert_name!r}; known: "
                           f"{sorted(EXPERT_VARIANTS)}")  # fmt: skip
    res = config.get("image_resolution", [224, 224])
    if len(res) != 2 or res[0] != res[1]:
        raise LeRobotError(f"{where}: image_resolution {res} must be square (PaliGemma's is)")
    periods = (config.get("min_period", 4e-3), config.get("max_period", 4.0))
    if tuple(map(float, periods)) != (4e-3, 4.0):
        raise LeRobotError(f"{where}: min/max_period {periods}; vlarun's time embedding uses "
                           "openpi's (0.004, 4.0)")  # fmt: skip
    if config.get("use_relative_actions"):
        raise LeRobotError(f"{where}: use_relative_actions=true is not supported (the chunk "
                           "would need the state added back per joint)")  # fmt: skip
    cams = camera_keys(config)
    if not cams:
        raise LeRobotError(f"{where}: input_features name no VISUAL feature (camera)")
    tower, llm = PALIGEMMA_VARIANTS[vlm_name]
    tower = dataclasses.replace(tower, image_size=int(res[0]))
    expert = EXPERT_VARIANTS[expert_name]
    width = int(config.get("max_action_dim", 32))
    horizon = int(config.get("chunk_size", 50))
    pi05 = kind == "pi05"  # the time conditions the expert's norms; the state is prompt text
    flow = FlowExpertConfig(expert, action_dim=width, horizon=horizon,
                            state_dim=0 if pi05 else int(config.get("max_state_dim", 32)),
                            num_steps=int(config.get("num_inference_steps", 10)),
                            time_cond="adarms" if pi05 else "mlp")  # fmt: skip
    text = int(config.get("tokenizer_max_length", 200 if pi05 else 48))
    check_tokenizer(directory)
    try:
        return VLAConfig(
            name=f"lerobot-{kind}-{vlm_name}", family="flow", llm=llm, vision=(tower,),
            connector="linear", num_images=len(cams), action_dim=width, chunk=horizon,
            max_text_tokens=text, prefix_causal=False, images_first=True,
            bos_id=PALIGEMMA_BOS, flow=flow,
            notes=f"LeRobot {kind} directory (PaliGemma + Gemma expert)",
        )  # fmt: skip
    except ValueError as e:
        raise LeRobotError(f"{where}: {e}") from None


def check_tokenizer(directory: str | Path) -> Path:
    """The directory's tokenizer.json, or the one error that says where to get it."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.exists():
        raise LeRobotError(
            f"{directory}: no {TOKENIZER_FILE}. LeRobot pi0 / pi05 tokenize with the PaliGemma "
            "tokenizer (google/paligemma-3b-pt-224), which it fetches from a model hub at run "
            f"time; vlarun never downloads: copy that repository's {TOKENIZER_FILE} here"
        )
    return path


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


_STAT_FIELDS = {"MEAN_STD": ("mean", "std"), "MIN_MAX": ("min", "max"),
                "QUANTILES": ("q01", "q99")}  # fmt: skip


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


def _feature_norm(config: Mapping, step: dict, stats: dict, key: str, kind: str, width: int,
                  dim: int, where: str) -> FeatureNorm:  # fmt: skip
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
            return FeatureNorm("IDENTITY", dim, width, eps=eps)
        raise LeRobotError(f"{where}: {mode} for {key} needs {names}; the file has "
                           f"{sorted(stats)}")  # fmt: skip
    a, b = (tuple(float(v) for v in np.asarray(stats[n]).reshape(-1)) for n in names)
    return FeatureNorm(mode, dim, width, a, b, eps)


@dataclass(frozen=True)
class LeRobotIO:
    """How raw observations become the model's inputs and its outputs robot actions."""

    state: FeatureNorm
    action: FeatureNorm
    cameras: tuple[str, ...]
    has_statistics: bool


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
    state = _feature_norm(config, pre_cfg, pre_stats, "observation.state", "STATE", width,
                          state_dim, f"{d}/policy_preprocessor.json")  # fmt: skip
    action = _feature_norm(config, post_cfg, post_stats, "action", "ACTION", cfg.action_dim,
                           action_dim, f"{d}/policy_postprocessor.json")  # fmt: skip
    return LeRobotIO(state, action, tuple(camera_keys(config)), bool(pre_stats or post_stats))
