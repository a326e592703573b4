"""Checkpoints: safetensors + config.json with Hugging Face / OpenVLA weight names; no pickle.

Layouts read and written:
  * vlarun VLA directories (``config.json`` with ``model_type: "vlarun"``) in OpenVLA's prismatic
    layout: ``vision_backbone.featurizer.*`` / ``.fused_featurizer.*`` in timm names (as OpenVLA's
    released weights), ``projector.*``, ``language_model.model.*``, ``language_model.lm_head.*``,
    plus ``dataset_statistics.json`` (action normalisation) and an optional ``tokenizer.json``;
  * OpenVLA's own HF directories (``model_type: "openvla"``), sharded or not, and OpenVLA-OFT's
    (the same, plus heads converted once from pickles by ``vlarun convert``: oft_files.py);
  * transformers' LLaVA directories (``model_type: "llava"``) as LLaVA-VLA (llava.py);
  * transformers' Emu3 directories (``model_type: "emu3"``) as UniVLA (univla.py);
  * transformers ``save_pretrained`` directories of Llama, Gemma, SigLIP and DINOv2 models.
Pickle files (.bin/.pt/.pth/.ckpt) are refused: loading them can execute arbitrary code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from vlarun import config as cfgio
from vlarun.models import lerobot, llava, univla
from vlarun.models.emu3_vq import VQConfig
from vlarun.models.fast_tokens import FAST_TOKENIZER_DIR, FastTokenizer
from vlarun.models.heads import NormStats, OFTHeadConfig
from vlarun.models.llama import LlamaConfig, LlamaLM
from vlarun.models.oft_files import HEADS_CONFIG, HEADS_FILE, HeadsError, read_heads_config
from vlarun.models.presets import PRESETS, RENAMED, get_preset, openvla_7b
from vlarun.models.presets.real import UNIVLA_TOKENS
from vlarun.models.vit import (
    ViTConfig,
    ViTEncoder,
    canonical_hf_state_dict,
    hf_to_timm_vit,
    openvla_vision_configs,
    timm_to_hf_vit,
)
from vlarun.models.vla import VLA, VLAConfig

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
WEIGHTS = "model.safetensors"
STATS = "dataset_statistics.json"
MAX_REPORTED = 8


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names the file, key or field at fault."""


# ---------------------------------------------------------------------------------------------
# Reading tensors safely


# safetensors' element sizes by dtype name, and the largest header its own reader accepts.
_ST_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_ST_MAX_HEADER = 100 * 2**20


def check_safetensors(path: Path) -> dict:
    """A safetensors file checked before it is opened, and its header returned (issue 64: a
    truncated file, flipped header bytes or a header length of 2^40 each ended in a 22-line
    traceback): the header's length against the file, its JSON, every tensor's dtype, shape
    and byte range inside the file. CheckpointError names the file and the fault."""
    size = path.stat().st_size
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header")
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > min(size - 8, _ST_MAX_HEADER):
            raise CheckpointError(
                f"{path}: its header length ({n} bytes) runs past the file "
                f"({size} bytes): truncated or not safetensors"
            )
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: its header is not a JSON object")
    body = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
            want = _ST_BYTES[dtype]
            for v in (*shape, start, end):
                if not isinstance(v, int) or v < 0:
                    raise ValueError
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(
                f"{path}: tensor {name!r} has a malformed entry ({str(info)[:120]})"
            ) from None
        if not start <= end <= body or end - start != want * math.prod(shape):
            raise CheckpointError(
                f"{path}: tensor {name!r} ({dtype} {shape}) claims bytes "
                f"{start}..{end} of a {body}-byte body"
            )
    return header


def _load_file(path: Path) -> dict[str, Tensor]:
    check_safetensors(path)
    return load_file(path)


def read_weights(directory: str | Path) -> dict[str, Tensor]:
    """All tensors of a directory's safetensors file(s) (single or sharded with an index)."""
    d = Path(directory)
    if d.is_file():
        _refuse_pickle_file(d)
        if d.suffix != ".safetensors":
            raise CheckpointError(f"{d}: not a safetensors file")
        return _load_file(d)
    if not d.is_dir():
        raise CheckpointError(f"{d}: no such checkpoint directory")
    index = d / f"{WEIGHTS}.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(_load_file(d / shard))
        return state
    # A LeRobot directory keeps its processors' statistics in safetensors files beside the
    # weights: those are not weights (read them as such and "88 missing keys" hid the cause).
    files = [f for f in sorted(d.glob("*.safetensors")) if "processor" not in f.name]
    if not files:
        pickles = [p.name for p in d.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise CheckpointError(
                f"{d} holds only pickle weights ({', '.join(pickles)}); vlarun refuses pickle "
                "because loading it can run arbitrary code - convert to safetensors first"
            )
        raise CheckpointError(
            f"{d}: no {WEIGHTS} (nor {WEIGHTS}.index.json): the weights are missing"
        )
    state = {}
    for f in files:
        state.update(_load_file(f))
    return state


def _refuse_pickle_file(path: Path) -> None:
    if path.suffix in PICKLE_SUFFIXES:
        raise CheckpointError(
            f"{path.name} is a pickle checkpoint; vlarun refuses pickle because loading it can "
            "run arbitrary code - convert it to safetensors first"
        )


def read_config(directory: str | Path) -> dict:
    path = Path(directory) / "config.json"
    if not path.exists():
        raise CheckpointError(f"{directory}: no config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: invalid JSON ({e})") from None


def load_checked(module: nn.Module, state: dict[str, Tensor], what: str) -> None:
    """Load ``state`` strictly; report missing, unexpected and mis-shaped keys by name."""
    own = module.state_dict()
    # Tied weights appear under two names in state_dict() but are stored once.
    tied = {
        k for k in own if k.endswith("lm_head.weight") and k not in state and _is_tied(module, k)
    }
    missing = sorted(set(own) - set(state) - tied)
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if state[k].shape != own[k].shape
    ]
    _raise_mismatch(what, {"missing": missing, "unexpected": unexpected, "mis-shaped": shapes})
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)


def _raise_mismatch(what: str, problems: dict[str, list[str]]) -> None:
    """CheckpointError naming the first keys of each kind of mismatch, if there is any."""
    text = []
    for label, keys in problems.items():
        if keys:
            shown = ", ".join(keys[:MAX_REPORTED])
            more = f" (+{len(keys) - MAX_REPORTED} more)" if len(keys) > MAX_REPORTED else ""
            text.append(f"{len(keys)} {label} keys: {shown}{more}")
    if text:
        raise CheckpointError(f"{what} does not match the model: " + "; ".join(text))


def random_vla(cfg: VLAConfig, dtype: torch.dtype = torch.bfloat16, std: float = 0.02) -> VLA:
    """A VLA of ``cfg`` with normal(0, std) weights, made directly in ``dtype`` (no fp32 build,
    no per-layer init): large random-weight shapes for benchmarks and memory tests."""
    with torch.device("meta"):
        model = VLA(cfg)
    model = model.to(dtype).to_empty(device="cpu")
    for module in model.modules():
        if hasattr(module, "init_buffers"):
            module.init_buffers(device="cpu")
        if isinstance(module, nn.modules.batchnorm._BatchNorm):  # to_empty left them garbage
            module.reset_running_stats()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model.eval()


def _is_tied(module: nn.Module, key: str) -> bool:
    lm = module.get_submodule(key.rsplit(".lm_head.weight", 1)[0]) if "." in key else module
    return isinstance(lm, LlamaLM) and lm.cfg.tie_embeddings


# ---------------------------------------------------------------------------------------------
# VLA checkpoints (prismatic layout)


def vla_state_to_prismatic(model: VLA) -> dict[str, Tensor]:
    """The model's tensors under OpenVLA's names (vision towers in timm names, LayerScale as
    OpenVLA's ``scale_factor``), so OpenVLA's own code loads what vlarun writes. A CLIP tower
    (LLaVA's; OpenVLA has none) keeps its Hugging Face names."""
    out, renamed_towers = {}, []
    for tower in ("featurizer", "fused_featurizer"):
        if hasattr(model.vision_backbone, tower):
            enc: ViTEncoder = getattr(model.vision_backbone, tower)
            if enc.config.kind == "clip":
                continue  # written below under the model's own (HF) names
            renamed_towers.append(f"vision_backbone.{tower}.")
            # LayerScale as OpenVLA's released weights (and its code) name it: ``scale_factor``
            renamed = hf_to_timm_vit(enc.state_dict(), enc.config.kind, "scale_factor")
            for k, v in renamed.items():
                out[f"vision_backbone.{tower}.{k}"] = v
    for k, v in model.state_dict().items():
        if k.startswith(tuple(renamed_towers)):
            continue
        if k.endswith("lm_head.weight") and _is_tied(model, k):
            continue  # safetensors stores shared tensors once: the embedding carries it
        out[k] = v
    return {k: v.contiguous() for k, v in out.items()}


def prismatic_to_vla_state(state: dict[str, Tensor], model: VLA) -> dict[str, Tensor]:
    """Inverse of ``vla_state_to_prismatic``: timm tower names back to the model's names (a
    CLIP tower's HF names pass through)."""
    if model.cfg.vq is not None:  # a VQ tokenizer keeps Emu3's names (emu3_vq.py)
        return dict(state)
    out, towers = {}, {}
    for k, v in state.items():
        if k.startswith("vision_backbone."):
            tower, rest = k[len("vision_backbone.") :].split(".", 1)
            towers.setdefault(tower, {})[rest] = v
        else:
            out[k] = v
    for tower, sub in towers.items():
        if not hasattr(model.vision_backbone, tower):
            raise CheckpointError(f"checkpoint has vision tower {tower!r} the model lacks")
        kind = getattr(model.vision_backbone, tower).config.kind
        if kind == "clip":
            out |= {f"vision_backbone.{tower}.{k}": v for k, v in sub.items()}
            continue
        try:
            renamed = timm_to_hf_vit(sub, kind)
        except KeyError as e:
            raise CheckpointError(f"vision tower {tower!r}: {e.args[0]}") from None
        out |= {f"vision_backbone.{tower}.{k}": v for k, v in renamed.items()}
    return out


def save_vla(
    model: VLA,
    directory: str | Path,
    *,
    norm_stats: dict | None = None,
    tokenizer_file: str | Path | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write weights, config, statistics (and tokenizer) atomically: a failed save leaves no
    partial directory behind."""
    # A weight-only int8 layer (transforms.int8) stores ``weight_int8`` and ``scale`` where the
    # layout has ``weight``: written here, the checkpoint would not load as the config says.
    # Quantising at load time costs one pass over the weights, so only float models are saved.
    int8 = [n for n, m in model.named_modules() if "weight_int8" in m._buffers]
    if int8:
        raise CheckpointError(
            f"save_vla writes float checkpoints; {int8[0]} (and {len(int8) - 1} more) are int8: "
            "save the float model and quantise after loading"
        )
    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_file(vla_state_to_prismatic(model), tmp / WEIGHTS, metadata={"format": "pt"})
        config = {
            "model_type": "vlarun",
            "vla": cfgio.to_dict(model.cfg),
            "torch_dtype": str(model.dtype).removeprefix("torch."),
        }
        if tokenizer_file is None:  # said, so a directory that lost its tokenizer.json is
            config["tokenizer"] = "byte"  # refused instead of read as bytes (Policy.load)
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        if norm_stats is not None:
            (tmp / STATS).write_text(json.dumps(norm_stats, indent=1))
        if tokenizer_file is not None:
            shutil.copy(tokenizer_file, tmp / "tokenizer.json")
        if model.fast_head is not None:  # FAST's vocabulary travels with the weights
            model.fast_head.tokenizer.save(tmp / FAST_TOKENIZER_DIR)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


OPENVLA_PROMPT_SUFFIX = 29871  # Llama-2's "▁": OpenVLA's predict_action appends it after "Out:"


def vla_config_from(
    config: dict,
    directory: str | Path = "",
    action_bins: int | None = None,
    action_tokens: int | None = None,
) -> VLAConfig:
    """The VLAConfig a config.json describes (vlarun, OpenVLA, LLaVA, Emu3 / UniVLA or LeRobot
    pi0), or a clear error. ``action_bins``: a LLaVA directory's action-bin mapping when it has
    no ``action_bins.json`` (llava.py); ``action_tokens``: an Emu3 directory's end-of-action id
    when it has no ``action_tokens.json`` (univla.py)."""
    if llava.is_llava(config):
        try:
            return _llava_config(config, directory, action_bins)
        except (llava.LlavaError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(str(e)) from None
    if univla.is_emu3(config):
        try:
            return _emu3_config(config, directory, action_tokens)
        except (univla.UniVLAError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(str(e)) from None
    if lerobot.is_lerobot(config):
        try:
            return lerobot.vla_config(config, directory)
        except lerobot.LeRobotError as e:
            raise CheckpointError(str(e)) from None
    retired = lerobot.RETIRED_TYPES.get(config.get("type"))
    if retired and "model_type" not in config:
        raise CheckpointError(f"{directory}/config.json: type {config['type']!r} is {retired}")
    kind = config.get("model_type")
    if kind == "vlarun":
        try:
            return cfgio.from_dict(VLAConfig, config["vla"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{directory}/config.json: bad vlarun config ({e})") from None
    if kind == "openvla":
        base = openvla_7b()
        _check_prismatic(config, directory)
        text = config.get("text_config", {}) or {}
        vocab = text.get("vocab_size", base.llm.vocab_size)
        pad = config.get("pad_to_multiple_of", 64)
        if "hidden_size" in text:  # a full text_config: its sizes, not the 7B preset's
            try:
                hf = {
                    "model_type": "llama",
                    "max_position_embeddings": config.get("llm_max_length", 2048),
                } | text
                llm = LlamaConfig.from_hf(hf)
            except (KeyError, TypeError, ValueError) as e:
                raise CheckpointError(f"{directory}/config.json: text_config: {e}") from None
        else:
            llm = cfgio.from_dict(LlamaConfig, cfgio.to_dict(base.llm) | {"vocab_size": vocab})
        size = int((config.get("image_sizes") or [224])[0])
        base = dataclasses.replace(base, vision=openvla_vision_configs(size))
        base = _with_oft_heads(base, llm, directory)
        # OpenVLA allows prompts up to the LM's context; whatever the visual tokens, BOS and the
        # action tokens leave of it is the text budget (not our presets' 48).
        budget = (
            llm.max_positions - 1 - base.num_visual - base.num_state_tokens - base.num_action_tokens
        )
        extra = {
            "action_vocab_size": vocab - pad,
            "max_text_tokens": budget,
            "prompt_suffix_ids": [OPENVLA_PROMPT_SUFFIX],
        }
        return cfgio.from_dict(VLAConfig, cfgio.to_dict(base) | {"llm": cfgio.to_dict(llm)} | extra)
    raise CheckpointError(
        f"{directory}: config.json describes a {kind!r} model, not a VLA "
        "(expected model_type 'vlarun', 'openvla', 'llava' or 'emu3', or a LeRobot type: "
        f"{', '.join(lerobot.LEROBOT_TYPES)})"
    )


# The defaults of transformers' CLIPVisionConfig and LlamaConfig: llava-hf's config.json keeps
# only the fields that differ from them (llava-1.5-7b-hf's text_config has no hidden_size).
_CLIP_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}
_LLAMA_DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def _llava_config(config: dict, directory, action_bins: int | None) -> VLAConfig:
    """LLaVA-VLA from a ``LlavaForConditionalGeneration`` config.json (llava.py): the CLIP
    tower's layer ``vision_feature_layer``, LLaVA's MLP projector, the Llama, the action bins."""
    where = f"{directory}/config.json"
    llava.check(config, where)
    bins = llava.read_action_bins(directory, action_bins)
    vision = vit_config_from_hf(
        _CLIP_DEFAULTS | config.get("vision_config", {}) | {"model_type": "clip_vision_model"}
    )
    layer = int(config.get("vision_feature_layer", -2))
    vision = dataclasses.replace(vision, feature_layer=layer)
    text = _LLAMA_DEFAULTS | (config.get("text_config") or {}) | {"model_type": "llama"}
    if "tie_word_embeddings" in config:  # transformers 5 keeps the tie at the top level
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    llm = LlamaConfig.from_hf(text)
    if not llava.N_BINS < bins["vocab_size"] <= llm.vocab_size:
        raise CheckpointError(
            f"{where}: action bins below id {bins['vocab_size']} do not fit "
            f"the LM's {llm.vocab_size} ids"
        )
    bos = text.get("bos_token_id", 1)
    prefix = llava.image_prefix_ids(directory, llava.image_token_id(config), bos)
    chunk, dim = bins["chunk"], bins["action_dim"]
    # LLaVA's prompt may fill the LM's context: the text budget is what BOS, "USER: ", the
    # patch features and the action tokens leave of it (as for OpenVLA).
    budget = llm.max_positions - 1 - len(prefix) - vision.num_patches - chunk * dim
    return VLAConfig(
        name="llava-vla",
        family="autoregressive",
        llm=llm,
        vision=(vision,),
        connector="mlp",
        action_dim=dim,
        chunk=chunk,
        max_text_tokens=budget,
        action_vocab_size=bins["vocab_size"],
        image_prefix_ids=prefix,
        bos_id=bos,
        notes=f"LLaVA (HF LlavaForConditionalGeneration), CLIP layer {layer}",
    )


def _emu3_config(config: dict, directory, action_tokens: int | None) -> VLAConfig:
    """UniVLA from an ``Emu3ForConditionalGeneration`` config.json (univla.py): the VQ
    tokenizer at the views' size, Emu3's image ids, the Llama-shaped text model, FAST actions."""
    where = f"{directory}/config.json"
    text = univla.text_config(config, where)
    llm = LlamaConfig.from_hf(text)
    tokens = univla.read_action_tokens(directory, action_tokens, int(text["pad_token_id"]))
    mean, std = univla.image_norm(directory)
    vq = VQConfig.from_hf(config.get("vq_config") or {}, tokens["image_size"], mean, std)
    images = univla.image_tokens(config, vq, where)
    views, chunk, dim = tokens["num_images"], tokens["chunk"], tokens["action_dim"]
    # The prompt may fill the LM's context: the text budget is what BOS, the views' tokens and
    # the longest FAST code leave of it (as for OpenVLA and LLaVA).
    budget = llm.max_positions - 1 - views * images.tokens_per_image - tokens["max_tokens"]
    if budget < 1:
        raise CheckpointError(
            f"{where}: {views} views of {images.tokens_per_image} image tokens and a FAST code of "
            f"up to {tokens['max_tokens']} fill the LM's {llm.max_positions} positions"
        )
    return VLAConfig(
        name="univla",
        family="autoregressive",
        llm=llm,
        vision=(),
        connector="vq",
        vq=images,
        num_images=views,
        action_dim=dim,
        chunk=chunk,
        max_text_tokens=budget,
        decode_tokens=min(UNIVLA_TOKENS, tokens["max_tokens"]),
        fast=univla.fast_config(tokens, llm.vocab_size),
        bos_id=int(text["bos_token_id"]),
        notes=f"Emu3 (HF Emu3ForConditionalGeneration): {views} views of {vq.grid} x {vq.grid} "
        f"VQ codes, FAST actions ended by id {tokens['end_id']}",
    )


def _with_oft_heads(base: VLAConfig, llm: LlamaConfig, directory) -> VLAConfig:
    """The parallel (OpenVLA-OFT) family when the directory holds converted OFT heads
    (``oft_files.py``); the autoregressive OpenVLA otherwise."""
    try:
        heads = read_heads_config(directory) if directory else None
    except HeadsError as e:
        raise CheckpointError(str(e)) from None
    if heads is None:
        return base
    if heads["llm_dim"] != llm.hidden_size:
        raise CheckpointError(
            f"{directory}/{HEADS_CONFIG}: the action head reads {heads['llm_dim']}-wide LM "
            f"states, the LM is {llm.hidden_size} wide"
        )
    oft = OFTHeadConfig(
        heads["llm_dim"],
        heads["action_dim"],
        heads["chunk"],
        heads["hidden_dim"],
        heads["num_blocks"],
    )
    return dataclasses.replace(
        base,
        name="openvla-oft",
        family="parallel",
        oft=oft,
        chunk=heads["chunk"],
        action_dim=heads["action_dim"],
        num_images=heads["num_images"],
        proprio_dim=heads["proprio_dim"],
    )


# The Prismatic variant vlarun builds: OpenVLA's fused DINOv2 + SigLIP towers (timm names).
PRISMATIC_TOWERS = ("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224")


def _check_prismatic(config: dict, directory) -> None:
    """One CheckpointError naming the first Prismatic field vlarun cannot build (instead of a
    thousand missing keys at load time)."""
    where = f"{directory}/config.json"
    if config.get("use_fused_vision_backbone", True) is not True:
        raise CheckpointError(
            f"{where}: use_fused_vision_backbone={config['use_fused_vision_backbone']!r}; vlarun "
            "builds the fused DINOv2 + SigLIP backbone only"
        )
    towers = config.get("timm_model_ids")
    if towers is not None and tuple(towers) != PRISMATIC_TOWERS:
        raise CheckpointError(
            f"{where}: timm_model_ids={list(towers)}; vlarun builds {list(PRISMATIC_TOWERS)}"
        )
    sizes = config.get("image_sizes")
    if sizes is not None and (len(set(sizes)) != 1 or int(sizes[0]) % 14):
        raise CheckpointError(
            f"{where}: image_sizes={list(sizes)}; both towers must share one size, a multiple "
            "of their 14-pixel patch"
        )
    bins = config.get("n_action_bins", 256)
    if bins != 256:
        raise CheckpointError(f"{where}: n_action_bins={bins!r}; vlarun's action tokens use 256")


def model_config(name: str | Path) -> VLAConfig:
    """The shape a name gives: a preset, else a shipped policy or checkpoint directory (its
    config.json; no weight is read). An unknown name raises one ValueError listing the kinds."""
    from vlarun.paths import policy_dir

    if str(name) in PRESETS or str(name) in RENAMED:
        return get_preset(str(name))
    try:
        directory = policy_dir(name)
    except ValueError as missing:
        raise ValueError(f"{missing}; nor a preset ({', '.join(PRESETS)})") from None
    return vla_config_from(read_config(directory), directory)


def load_vla(
    directory: str | Path,
    dtype: torch.dtype | None = None,
    *,
    action_bins: int | None = None,
    action_tokens: int | None = None,
) -> tuple[VLA, dict]:
    """Load a VLA directory. Returns (model in eval mode, norm_stats dict or {}).

    Streamed: the model is built on the meta device (no memory, no random init), already in
    ``dtype``, and each tensor is read from its safetensors file, cast and put in place one at
    a time, so the peak is about the model's size in ``dtype`` plus one tensor (a 7B
    checkpoint in bf16 needs ~15 GB, not the ~75 GB of building in fp32, holding every shard
    and casting a copy). Vision towers (timm names, their q/k/v fused) are collected and
    converted together: they are small. Missing, unexpected and mis-shaped keys are reported
    by name, as ``load_checked`` does. ``action_bins``: a LLaVA directory's action-bin mapping
    when it has no ``action_bins.json`` (llava.py); ``action_tokens``: an Emu3 directory's
    end-of-action id when it has no ``action_tokens.json`` (univla.py)."""
    d = Path(directory)
    config = read_config(d)
    cfg = vla_config_from(config, d, action_bins, action_tokens)
    _check_depth(cfg, d)  # before any module is built
    with torch.device("meta"):
        model = VLA(cfg)
    if dtype is not None:
        model = model.to(dtype)
    for module in model.modules():  # computed buffers (RoPE tables) become real on the host
        if hasattr(module, "init_buffers"):
            module.init_buffers(device="cpu")
    # names -> meta parameters and stored buffers (a VQ tokenizer's BatchNorm statistics)
    own = dict(model.named_parameters()) | _stored_buffers(model)
    problems: dict[str, list[str]] = {"unexpected": [], "mis-shaped": []}
    towers: dict[str, Tensor] = {}
    from_lerobot = lerobot.is_lerobot(config)
    from_llava = llava.is_llava(config)
    from_emu3 = univla.is_emu3(config)
    for name, tensor in stream_weights(d):
        if from_llava:  # LLaVA's names (4.x or 5.x layout) -> vlarun's; its CLIP keeps HF's
            _put(model, own, llava.rename(name), tensor, problems)
            continue
        if from_emu3:  # Emu3's names (either layout) -> vlarun's; the VQ decoder is skipped
            if (name := univla.rename(name)) is not None:
                _put(model, own, name, tensor, problems)
            continue
        if from_lerobot:  # LeRobot names -> vlarun's (HF names below the prefixes)
            name = lerobot.rename(name, config["type"])
            if name is None:
                continue
            _put(model, own, name, tensor, problems)
            continue
        if name.startswith("vision_backbone."):
            towers[name] = tensor
            continue
        _put(model, own, name, tensor, problems)
    for name, tensor in prismatic_to_vla_state(towers, model).items():
        _put(model, own, name, tensor, problems)
    towers.clear()
    if from_lerobot:  # modules LeRobot does not have (the expert's unused embedding table)
        for name in (n for n in lerobot.ABSENT if n in own):  # pi0_fast has no expert
            _put(model, own, name, torch.zeros(own[name].shape), problems)
    _retie(model)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    missing += [n for n, b in _stored_buffers(model).items() if b.is_meta]
    _raise_mismatch(str(d), {"missing": missing, **problems})
    stats = json.loads((d / STATS).read_text()) if (d / STATS).exists() else {}
    stats = stats or config.get("norm_stats", {})
    if cfg.fast is not None and (d / FAST_TOKENIZER_DIR).is_dir():
        fast = FastTokenizer.load(
            d / FAST_TOKENIZER_DIR, action_horizon=cfg.horizon, action_dim=cfg.action_dim
        )
        model.set_fast_tokenizer(fast)
    return model.eval(), stats


_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|blocks|h)\.(\d+)\.")


def weight_names(directory: Path) -> list[str]:
    """Every tensor name of a directory's safetensors files, read from their headers only."""
    names = []
    for path in sorted(directory.glob("*.safetensors")):
        if "processor" in path.name:
            continue
        names += [k for k in check_safetensors(path) if k != "__metadata__"]
    return names


def _check_depth(cfg: VLAConfig, directory: Path) -> None:
    """Refuse a config deeper than its weights before building it (issue 64: ``num_layers:
    100000`` built modules for > 60 s at 1.1 GB before the keys were compared): no stack the
    config asks for may have more layers than the deepest stack the weights hold."""
    names = weight_names(directory)
    found = [int(m.group(1)) for n in names for m in _LAYER_INDEX.finditer(n)]
    if not found:
        return
    held = max(found) + 1
    stacks = {"language model": cfg.llm.num_layers}
    stacks |= {f"vision tower {i}": v.num_layers for i, v in enumerate(cfg.vision)}
    deep = {k: v for k, v in stacks.items() if v > held}
    if deep:
        what = ", ".join(f"{k} {v} layers" for k, v in deep.items())
        raise CheckpointError(
            f"{directory / 'config.json'}: asks for {what}, but its weights "
            f"hold at most {held} layers per stack"
        )


def stream_weights(directory: Path):
    """(name, tensor) of every tensor in a directory's safetensors file(s), one at a time."""
    from safetensors import safe_open

    index = directory / f"{WEIGHTS}.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / f for f in shards]
        if (directory / HEADS_FILE).exists():  # converted OpenVLA-OFT heads (oft_files.py)
            files.append(directory / HEADS_FILE)
    elif (directory / WEIGHTS).exists():  # not the processors' statistics files (LeRobot)
        files = [directory / WEIGHTS]
        if (directory / HEADS_FILE).exists():
            files.append(directory / HEADS_FILE)
    else:
        files = [f for f in sorted(directory.glob("*.safetensors")) if "processor" not in f.name]
    if not files:
        read_weights(directory)  # raises the error that names what is there instead
    for path in files:
        check_safetensors(path)
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                yield name, f.get_tensor(name)


def _stored_buffers(model: nn.Module) -> dict[str, Tensor]:
    """The buffers a checkpoint stores (persistent ones: BatchNorm's running statistics), by
    name; computed ones (RoPE tables) are not among them."""
    out = {}
    for prefix, module in model.named_modules():
        for leaf, buf in module._buffers.items():
            if buf is not None and leaf not in module._non_persistent_buffers_set:
                out[f"{prefix}.{leaf}" if prefix else leaf] = buf
    return out


def _put(model: nn.Module, own: dict, name: str, tensor: Tensor, problems: dict) -> None:
    """Make ``tensor`` (cast to the model's dtype) parameter or stored buffer ``name``, or note
    why not."""
    target = own.get(name)
    if target is None:
        problems["unexpected"].append(name)
        return
    if tuple(tensor.shape) != tuple(target.shape):
        problems["mis-shaped"].append(
            f"{name}: checkpoint {tuple(tensor.shape)} vs model {tuple(target.shape)}"
        )
        return
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    data = tensor.to(target.dtype) if tensor.dtype != target.dtype else tensor
    if not isinstance(target, nn.Parameter):
        module._buffers[leaf] = data
        return
    module._parameters[leaf] = nn.Parameter(data, requires_grad=target.requires_grad)


def _retie(model: nn.Module) -> None:
    """Tied LM heads share the embedding again (the checkpoint stores the tensor once)."""
    for module in model.modules():
        if isinstance(module, LlamaLM) and module.cfg.tie_embeddings:
            module.lm_head.weight = module.model.embed_tokens.weight


def select_norm_stats(stats: dict, unnorm_key: str | None = None) -> NormStats | None:
    """Pick the action statistics stored with a checkpoint (None if it has none)."""
    if not stats:
        return None
    return NormStats.select(stats, unnorm_key)


# ---------------------------------------------------------------------------------------------
# Plain transformers checkpoints (Llama / Gemma / SigLIP / DINOv2 / CLIP)

HF_KINDS = (
    "llama",
    "gemma",
    "mistral",
    "siglip",
    "siglip_vision_model",
    "dinov2",
    "dinov2_with_registers",
    "clip",
    "clip_vision_model",
)


def vit_config_from_hf(config: dict) -> ViTConfig:
    kind = config.get("model_type")
    if kind in ("siglip", "clip"):  # a full contrastive model: its vision tower's config
        config = config["vision_config"]
        kind = f"{kind}_vision_model"
    if kind == "clip_vision_model":
        act = config.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise CheckpointError(f"CLIP with hidden_act {act!r}: vlarun runs quick_gelu or gelu")
        return ViTConfig(
            kind="clip",
            image_size=config["image_size"],
            patch_size=config["patch_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            layer_norm_eps=config.get("layer_norm_eps", 1e-5),
            feature_layer=-1,
            gelu_approximate="quick" if act == "quick_gelu" else "none",
        )
    if kind == "siglip_vision_model":
        return ViTConfig(
            kind="siglip",
            image_size=config["image_size"],
            patch_size=config["patch_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            layer_norm_eps=config.get("layer_norm_eps", 1e-6),
            feature_layer=-1,
            gelu_approximate="tanh" if "tanh" in config.get("hidden_act", "tanh") else "none",
        )
    if config.get("use_swiglu_ffn"):
        raise CheckpointError("DINOv2 with a SwiGLU MLP (giant) is not supported")
    hidden = config["hidden_size"]
    return ViTConfig(
        kind="dinov2",
        image_size=config["image_size"],
        patch_size=config["patch_size"],
        hidden_size=hidden,
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        intermediate_size=int(hidden * config.get("mlp_ratio", 4)),
        layer_norm_eps=config.get("layer_norm_eps", 1e-6),
        num_registers=config.get("num_register_tokens", 0),
        feature_layer=-1,
    )


def load_hf_module(directory: str | Path) -> tuple[str, nn.Module, dict]:
    """Load a transformers ``save_pretrained`` directory into vlarun's module.

    Returns (kind, module, hf_config): kind is "llama" (Llama/Gemma, a ``LlamaLM``) or
    "siglip"/"dinov2"/"clip" (a ``ViTEncoder``)."""
    d = Path(directory)
    config = read_config(d)
    kind = config.get("model_type")
    if kind not in HF_KINDS:
        raise CheckpointError(
            f"{d}: config.json describes a {kind!r} model; vlarun loads {', '.join(HF_KINDS)}"
        )
    state = read_weights(d)
    if kind in ("llama", "gemma", "mistral"):
        module: nn.Module = LlamaLM(LlamaConfig.from_hf(config))
        load_checked(module, state, str(d))
        return "llama", module.eval(), config
    vcfg = vit_config_from_hf(config)
    if kind in ("siglip", "clip"):  # a full contrastive model: keep the vision tower only
        state = {k: v for k, v in state.items() if k.startswith("vision_model.")}
    module = ViTEncoder(vcfg)
    load_checked(module, canonical_hf_state_dict(state, vcfg.kind), str(d))
    return vcfg.kind, module.eval(), config
