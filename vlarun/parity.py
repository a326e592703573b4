"""`vlarun check-parity`: vlarun's modules against transformers on identical weights.

Random-weight models of several shapes are built in transformers, their weights loaded into
vlarun, and outputs compared in fp32. With ``checkpoint``, any Llama/Gemma/SigLIP/DINOv2/CLIP
directory written by transformers' ``save_pretrained`` is loaded into both and compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vlarun.models.checkpoint import load_checked, load_hf_module, vit_config_from_hf
from vlarun.models.llama import LlamaConfig, LlamaLM, RopeScaling
from vlarun.models.token_plan import TokenPlan
from vlarun.models.vit import ViTEncoder, canonical_hf_state_dict

TOL = 1e-4  # fp32 max abs difference allowed against transformers
TOL_SELF = 1e-5  # vlarun's own cache modes against its full forward


@dataclass
class Check:
    name: str
    max_abs_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "max_abs_diff": self.max_abs_diff,
            "tolerance": self.tolerance,
            "ok": self.ok,
        }


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("check-parity needs transformers: pip install 'vlarun[parity]'") from e
    return transformers


LLAMA_SHAPES = {
    "llama-mha": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=344,
        num_layers=3,
        num_heads=4,
        num_kv_heads=4,
        max_positions=256,
    ),
    "llama-gqa": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=344,
        num_layers=3,
        num_heads=8,
        num_kv_heads=2,
        max_positions=256,
    ),
    "llama3-rope-scaling": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        max_positions=256,
        rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64),
    ),
    "gemma-geglu-hd256": LlamaConfig(
        vocab_size=257,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=256,
        max_positions=256,
        rms_norm_eps=1e-6,
        mlp_act="gelu_tanh",
        gemma_norm=True,
        tie_embeddings=True,
    ),
}


def hf_llama(cfg: LlamaConfig, seed: int = 0):
    """A random transformers Llama/Gemma with vlarun's shape (norm weights randomised too)."""
    tf = _transformers()
    conf_cls = tf.GemmaConfig if cfg.gemma_norm else tf.LlamaConfig
    model_cls = tf.GemmaForCausalLM if cfg.gemma_norm else tf.LlamaForCausalLM
    hf_cfg = {k: v for k, v in cfg.to_hf().items() if k not in ("model_type", "architectures")}
    torch.manual_seed(seed)
    conf = conf_cls(**hf_cfg)
    conf._attn_implementation = "eager"  # the explicit-softmax path: an independent reference
    model = model_cls(conf).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2).add_(0.0 if cfg.gemma_norm else 1.0)
    return model


def _llama_checks(name: str, cfg: LlamaConfig) -> list[Check]:
    hf = hf_llama(cfg)
    ours = LlamaLM(cfg).eval()
    load_checked(ours, dict(hf.state_dict()), name)
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        full = ours(ours.embed(ids)).hidden
        got = ours.logits(full)
        cache = ours.new_cache(2, 64)
        pre = ours(ours.embed(ids[:, :30]), torch.arange(30), cache).hidden
        dec = [
            ours(ours.embed(ids[:, p : p + 1]), torch.tensor([p]), cache).hidden
            for p in range(30, 40)
        ]
        cached = torch.cat([pre, *dec], dim=1)
        plan = TokenPlan.full(2, vis_start=1, num_visual=24, last_shared_layer=0)
        planned = ours(ours.embed(ids), torch.arange(40), ours.new_cache(2, 64), plan=plan).hidden
    return [
        Check(f"{name}: logits vs transformers", _diff(ref, got), TOL),
        Check(f"{name}: prefill + cached decode vs full forward", _diff(cached, full), TOL_SELF),
        Check(f"{name}: full-recompute TokenPlan vs plain forward", _diff(planned, full), TOL_SELF),
    ]


def _vit_checks() -> list[Check]:
    tf = _transformers()
    common = dict(
        image_size=56, patch_size=14, hidden_size=96, num_hidden_layers=3, num_attention_heads=4
    )
    models = {
        "siglip": tf.SiglipVisionModel(tf.SiglipVisionConfig(intermediate_size=192, **common)),
        "dinov2": tf.Dinov2Model(tf.Dinov2Config(**common)),
        "clip": tf.CLIPVisionModel(tf.CLIPVisionConfig(intermediate_size=192, **common)),
    }
    if hasattr(tf, "Dinov2WithRegistersModel"):
        conf = tf.Dinov2WithRegistersConfig(num_register_tokens=4, **common)
        models["dinov2-registers"] = tf.Dinov2WithRegistersModel(conf)
    checks = []
    px = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(2))
    for name, hf in models.items():
        hf.config._attn_implementation = "eager"
        hf.eval()
        vcfg = vit_config_from_hf(hf.config.to_dict())
        ours = ViTEncoder(vcfg).eval()
        load_checked(ours, canonical_hf_state_dict(hf.state_dict(), vcfg.kind), name)
        with torch.no_grad():
            out = hf(pixel_values=px, output_hidden_states=True)
            diff_last = _diff(out.last_hidden_state, ours.last_hidden_state(px))
            n = vcfg.num_prefix_tokens
            diff_feat = _diff(out.hidden_states[-2][:, n:], ours.hidden_states(px)[-2][:, n:])
        checks += [
            Check(f"{name}: last_hidden_state", diff_last, TOL),
            Check(f"{name}: second-to-last layer features", diff_feat, TOL),
        ]
    return checks


def _checkpoint_checks(directory: str | Path) -> list[Check]:
    tf = _transformers()
    kind, ours, config = load_hf_module(directory)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        if kind == "llama":
            hf = tf.AutoModelForCausalLM.from_pretrained(directory).float().eval()
            ids = torch.randint(0, ours.cfg.vocab_size, (1, 32), generator=gen)
            ours = ours.float()
            diff = _diff(hf(input_ids=ids).logits, ours.logits(ours(ours.embed(ids)).hidden))
            return [Check(f"{Path(directory).name}: logits vs transformers", diff, TOL)]
        hf = tf.AutoModel.from_pretrained(directory).float().eval()
        if config.get("model_type") in ("siglip", "clip"):  # a full contrastive model
            hf = hf.vision_model
        s = ours.config.image_size
        px = torch.randn(1, 3, s, s, generator=gen)
        ref = hf(pixel_values=px).last_hidden_state
        diff = _diff(ref, ours.float().last_hidden_state(px))
        return [Check(f"{Path(directory).name}: {kind} last_hidden_state", diff, TOL)]


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def check_parity(
    checkpoint: str | Path | None = None, progress: Callable[[str], None] | None = None
) -> dict:
    """Run the checks; returns ``{"ok": bool, "checks": [...]}``."""
    checks: list[Check] = []
    if checkpoint is not None:
        checks += _checkpoint_checks(checkpoint)
    else:
        for name, cfg in LLAMA_SHAPES.items():
            if progress:
                progress(name)
            checks += _llama_checks(name, cfg)
        if progress:
            progress("vision")
        checks += _vit_checks()
    return {"ok": all(c.ok for c in checks), "checks": [c.as_dict() for c in checks]}


# ---------------------------------------------------------------------------------------------
# OpenVLA's own predict_action, recorded once (tests/models/fixtures/record_openvla_reference.py)

OPENVLA_REFERENCE_SEED = 20
OPENVLA_REFERENCE_PROMPT = "open the drawer"
# Frame sizes the reference saw (OpenVLA's processor resizes any size, bicubic).
OPENVLA_REFERENCE_FRAMES = ((224, 224), (256, 320), (180, 240))
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def openvla_reference_frames() -> list:
    """The uint8 (H, W, 3) frames of the reference run (seeded)."""
    import numpy as np

    rng = np.random.default_rng(OPENVLA_REFERENCE_SEED)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in OPENVLA_REFERENCE_FRAMES]


def byte_tokenizer_json() -> str:
    """A ``tokenizer.json`` that encodes as ``ByteTokenizer`` does (id = 3 + UTF-8 byte, no
    BOS): a byte-level BPE without merges over GPT-2's byte-to-character table."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from vlarun.models.tokenizer import ByteTokenizer

    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {chars[b]: ByteTokenizer.OFFSET + b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok.to_str()


def make_openvla_reference_dir(out: str | Path) -> dict:
    """An OpenVLA-layout directory of seeded random weights that OpenVLA's own code loads
    unchanged: the real fused DINOv2-L + SigLIP-So400m towers (timm names, bf16), a 2-layer
    Llama ``text_config`` with OpenVLA's 32064-token vocabulary, its norm_stats and image
    processor config, and a byte-level tokenizer.json. Deterministic for a given torch build;
    returns the inputs the reference run needs (the prompt's ids, the weights' SHA-256)."""
    import hashlib
    import json

    import numpy as np
    from safetensors.torch import save_file

    from vlarun.models.checkpoint import vla_config_from, vla_state_to_prismatic
    from vlarun.models.tokenizer import ByteTokenizer, openvla_prompt
    from vlarun.models.vla import VLA

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = {
        "model_type": "llama",
        "vocab_size": 32064,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "pad_token_id": 32000,
    }
    q01 = [-0.03, -0.05, -0.04, -0.2, -0.15, -0.3, 0.0]
    q99 = [0.03, 0.05, 0.04, 0.2, 0.15, 0.3, 1.0]
    action = {
        "q01": q01,
        "q99": q99,
        "mask": [True] * 6 + [False],
        "mean": [0.0] * 7,
        "std": [1.0] * 7,
        "min": q01,
        "max": q99,
    }
    config = {
        "model_type": "openvla",
        "vision_backbone_id": "dinosiglip-vit-so-224px",
        "llm_backbone_id": "llama2-7b-pure",
        "arch_specifier": "no-align+fused-gelu-mlp",
        "use_fused_vision_backbone": True,
        "image_resize_strategy": "resize-naive",
        "timm_model_ids": [
            "vit_large_patch14_reg4_dinov2.lvd142m",
            "vit_so400m_patch14_siglip_224",
        ],
        "image_sizes": [224, 224],
        "text_config": text,
        "llm_max_length": 2048,
        "pad_token_id": 32000,
        "pad_to_multiple_of": 64,
        "n_action_bins": 256,
        "norm_stats": {"reference": {"action": action}},
    }
    cfg = vla_config_from(config, out)
    with torch.device("meta"):
        model = VLA(cfg)
    model = model.to(torch.bfloat16).to_empty(device="cpu")
    # numpy's generator, not torch's: its stream is the same on every CPU (torch's vectorised
    # normal_ may differ between instruction sets), so the weights' SHA-256 is portable.
    rng = np.random.default_rng(OPENVLA_REFERENCE_SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.from_numpy(rng.standard_normal(tuple(p.shape), dtype=np.float32))
            if p.ndim == 1 and name.endswith(("weight", "lambda1", "lambda2")):
                p.copy_(1.0 + 0.02 * noise)  # norms and layer scales near 1: activations keep scale
            else:
                p.copy_(0.02 * noise)
        # Larger head rows for the 256 action tokens, so that greedy decoding picks action bins
        # (with equal rows it picks any of 32k tokens and every action clips to one bin).
        model.language_model.lm_head.weight[32000 - 256 : 32000] *= 4
    # metadata as transformers writes it (its loader requires the "pt" format tag)
    save_file(vla_state_to_prismatic(model), out / "model.safetensors", {"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    processor = {
        "image_processor_type": "PrismaticImageProcessor",
        "use_fused_vision_backbone": True,
        "image_resize_strategy": "resize-naive",
        "input_sizes": [[3, 224, 224], [3, 224, 224]],
        "interpolations": ["bicubic", "bicubic"],
        "means": [IMAGENET_MEAN, (0.5, 0.5, 0.5)],
        "stds": [IMAGENET_STD, (0.5, 0.5, 0.5)],
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=1))
    # The reference ran on byte ids (OpenVLA's own code takes input_ids as given); an OpenVLA
    # directory must ship its tokenizer, so this one ships one that gives exactly those ids.
    (out / "tokenizer.json").write_text(byte_tokenizer_json())
    prompt = ByteTokenizer(32064).encode(openvla_prompt(OPENVLA_REFERENCE_PROMPT))
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    inputs = {
        "input_ids": [1, *prompt],
        "weights_sha256": digest,
        "torch": torch.__version__,
        "frames_seed": OPENVLA_REFERENCE_SEED,
        "frame_sizes": [list(s) for s in OPENVLA_REFERENCE_FRAMES],
    }
    (out / "reference_inputs.json").write_text(json.dumps(inputs))
    return inputs


# ---------------------------------------------------------------------------------------------
# A LeRobot pi0 directory of seeded random weights (tests/models/test_lerobot_reference.py;
# tests/models/fixtures/record_lerobot_reference.py runs LeRobot's own PI0Pytorch on it)

LEROBOT_REFERENCE_SEED = 7
LEROBOT_REFERENCE_TASK = "pick up the red block"
LEROBOT_REFERENCE_FRAMES = ((56, 56), (48, 64))  # one per camera; the second is letterboxed
LEROBOT_CAMERAS = ("observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb")
LEROBOT_STATE_DIM, LEROBOT_ACTION_DIM, LEROBOT_CHUNK = 8, 7, 4
# A word-level vocabulary in PaliGemma's special-token layout (<pad> 0, <eos> 1, <bos> 2).
_LEROBOT_WORDS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    " ",
    "\n",
    "pick",
    "up",
    "the",
    "red",
    "block",
    "open",
    "drawer",
    "put",
    "in",
    "cup",
    "Task",
    "State",
    "Action",
    ":",
    ",",
    ";",
    *map(str, range(-1, 256)),
    "|",
)  # words, state bins, end
# PaliGemma's vocabulary size: LeRobot's pi0_fast places FAST ids from the top of the
# tokenizer's vocabulary, so its tokenizer is filled up to this many entries.
PALIGEMMA_VOCAB = 257152


def lerobot_reference_inputs() -> dict:
    """The observation the reference run and the test share: uint8 frames (one per camera,
    of other sizes than the model's), a raw state, the task."""
    import numpy as np

    rng = np.random.default_rng(LEROBOT_REFERENCE_SEED + 1)
    frames = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in LEROBOT_REFERENCE_FRAMES]
    state = rng.normal(0.0, 1.0, LEROBOT_STATE_DIM).astype(np.float32)
    return {"frames": frames, "state": state, "task": LEROBOT_REFERENCE_TASK}


def _word_tokenizer_json(bos: bool = True, size: int = 0) -> str:
    """A ``tokenizer.json`` (the ``tokenizers`` library's format) that splits on whitespace,
    keeps the spaces and newlines as tokens, and adds <bos> in front as Gemma's does (or, as
    SmolVLM's, nothing: ``bos=False``). ``size``: entries up to that many are unused tokens
    named as PaliGemma's top ones are (``<unusedN>``, then 1024 ``<locNNNN>``, 128
    ``<segNNN>``)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(_LEROBOT_WORDS)}
    loc, seg = size - 128 - 1024, size - 128
    for i in range(len(vocab), size):
        vocab[
            f"<loc{i - loc:04d}>"
            if loc <= i < seg
            else f"<seg{i - seg:03d}>"
            if i >= seg
            else f"<unused{i}>"
        ] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s,;:]"), behavior="isolated")
    if bos:
        template = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
        tok.post_processor = template
    tok.add_special_tokens(["<pad>", "<eos>", "<bos>"])
    return tok.to_str()


# SmolVLA's tiny backbone (the SmolVLM config LeRobot would fetch): GQA text model of 6 layers
# (4 used), a 32 px vision tower of 8 px patches, pixel shuffle 2 (4 tokens per image).
LEROBOT_SMOLVLM = {
    "model_type": "smolvlm",
    "scale_factor": 2,
    "image_token_id": 3,
    "text_config": {
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    "vision_config": {
        "model_type": "smolvlm_vision",
        "hidden_size": 32,
        "image_size": 32,
        "patch_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
    },
}


def make_lerobot_dir(out: str | Path, kind: str = "pi0") -> dict:
    """A LeRobot pi0, pi05, smolvla or pi0_fast directory (lerobot 7427f31's file set and
    weight names) of seeded random weights at a tiny shape (pi0 / pi05 / pi0_fast: the
    ``vlarun_tiny`` variants; smolvla: ``LEROBOT_SMOLVLM`` as its ``vlm_config.json``):
    config.json, model.safetensors (fp32), both processor pipelines with statistics (pi0 /
    smolvla / pi0_fast: MEAN_STD; pi05: QUANTILES, as their defaults), and a tokenizer.json.
    Returns its config.

    pi0_fast (``_pi0_fast_extras``) also gets a FAST tokenizer in ``fast_tokenizer/``, a
    tokenizer.json of PaliGemma's vocabulary size, and its tied head saved under the head's
    name, as LeRobot's save keeps it."""
    import json

    import numpy as np
    from safetensors.numpy import save_file as save_numpy
    from safetensors.torch import save_file

    from vlarun.models import lerobot
    from vlarun.models.vla import VLA

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    smol, fast = kind == "smolvla", kind == "pi0_fast"
    side = (
        LEROBOT_SMOLVLM["vision_config"]["image_size"] if smol else LEROBOT_REFERENCE_FRAMES[0][0]
    )
    side = 224 if fast else side  # LeRobot's pi0_fast tower is 224 px, whatever it is told
    feats = {k: {"type": "VISUAL", "shape": [3, side, side]} for k in LEROBOT_CAMERAS}
    feats["observation.state"] = {"type": "STATE", "shape": [LEROBOT_STATE_DIM]}
    norm = "QUANTILES" if kind == "pi05" else "MEAN_STD"
    mapping = {"VISUAL": "IDENTITY", "STATE": norm, "ACTION": norm}
    config = {
        "type": kind,
        "n_obs_steps": 1,
        "input_features": feats,
        "output_features": {"action": {"type": "ACTION", "shape": [LEROBOT_ACTION_DIM]}},
        "device": "cpu",
        "use_amp": False,
        "paligemma_variant": "vlarun_tiny",
        "action_expert_variant": "vlarun_tiny",
        "dtype": "float32",
        "chunk_size": LEROBOT_CHUNK,
        "n_action_steps": LEROBOT_CHUNK,
        "max_state_dim": 32,
        "max_action_dim": 32,
        "num_inference_steps": 10,
        "image_resolution": [side, side],
        "empty_cameras": 0,
        "normalization_mapping": mapping,
        "min_period": 0.004,
        "max_period": 4.0,
        "tokenizer_max_length": 48 if kind == "pi0" else 200,
        "use_relative_actions": False,
    }
    if fast:  # PI0FastConfig's fields instead of the flow ones
        for key in ("num_inference_steps", "min_period", "max_period"):
            config.pop(key)
        config |= {
            "tokenizer_max_length": 48,
            "max_action_tokens": LEROBOT_FAST_STEPS,
            "max_decoding_steps": LEROBOT_FAST_STEPS,
            "fast_skip_tokens": 128,
            "temperature": 0.0,
            "use_kv_cache": True,
            "text_tokenizer_name": "google/paligemma-3b-pt-224",
            "action_tokenizer_name": "lerobot/fast-action-tokenizer",
            # random weights do not write "Action: " before their code (see _pi0_fast_extras)
            "validate_action_token_prefix": False,
        }
    if smol:  # SmolVLAConfig's fields instead of the PaliGemma ones
        for key in (
            "paligemma_variant",
            "action_expert_variant",
            "dtype",
            "image_resolution",
            "num_inference_steps",
        ):
            config.pop(key)
        config |= {
            "resize_imgs_with_padding": [side, side],
            "num_steps": 10,
            "use_cache": True,
            "vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct",
            "load_vlm_weights": False,
            "add_image_special_tokens": False,
            "attention_mode": "cross_attn",
            "prefix_length": -1,
            "pad_language_to": "longest",
            "num_expert_layers": -1,
            "num_vlm_layers": 4,
            "self_attn_every_n_layers": 2,
            "expert_width_multiplier": 0.75,
            "tokenizer_max_length": 48,
        }
        (out / lerobot.VLM_CONFIG_FILE).write_text(json.dumps(LEROBOT_SMOLVLM, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    vocab = PALIGEMMA_VOCAB if fast else 0
    (out / lerobot.TOKENIZER_FILE).write_text(_word_tokenizer_json(bos=not smol, size=vocab))
    if fast:
        _lerobot_fast_tokenizer().save(out / lerobot.FAST_TOKENIZER_DIR)
    cfg = lerobot.vla_config(config, out)
    with torch.device("meta"):
        model = VLA(cfg)
    inverse = {new: old for old, new in lerobot.RENAMES[kind] if new is not None}
    rng = np.random.default_rng(LEROBOT_REFERENCE_SEED)  # portable across CPUs (see above)
    tensors = {}
    for name, p in model.named_parameters():
        if name in lerobot.ABSENT or name == "language_model.lm_head.weight":
            continue
        prefix = next(k for k in inverse if name.startswith(k))
        noise = rng.standard_normal(tuple(p.shape), dtype=np.float32)
        # Norm weights near identity: SigLIP's LayerNorms scale by w, Gemma's RMSNorms by 1 + w.
        is_norm = p.ndim == 1 and name.endswith("weight")
        center = 1.0 if is_norm and (smol or name.startswith("vision_backbone.")) else 0.0
        value = center + (0.1 if is_norm else 0.05) * noise
        tensors[inverse[prefix] + name[len(prefix) :]] = torch.from_numpy(value)
    if fast:
        _pi0_fast_extras(tensors, cfg)
    save_file(tensors, out / "model.safetensors", {"format": "pt"})
    stats_rng = np.random.default_rng(LEROBOT_REFERENCE_SEED + 2)
    # the same draws for either kind: (mean, std) for MEAN_STD, (q01, q01 + spread) otherwise
    centre, spread = (
        stats_rng.normal(0, 1, LEROBOT_STATE_DIM),
        stats_rng.uniform(0.5, 2.0, LEROBOT_STATE_DIM),
    )
    a_centre = stats_rng.normal(0, 1, LEROBOT_ACTION_DIM)
    a_spread = stats_rng.uniform(0.5, 2.0, LEROBOT_ACTION_DIM)
    if norm == "MEAN_STD":
        state_stats = {"observation.state.mean": centre, "observation.state.std": spread}
        action_stats = {"action.mean": a_centre, "action.std": a_spread}
    else:
        state_stats = {"observation.state.q01": centre, "observation.state.q99": centre + spread}
        action_stats = {"action.q01": a_centre, "action.q99": a_centre + a_spread}
    for name, stats, registry, pipeline, step in (
        ("policy_preprocessor", state_stats, "normalizer_processor", "pre", 3),
        ("policy_postprocessor", action_stats, "unnormalizer_processor", "post", 0),
    ):
        state_file = f"{name}_step_{step}_{registry}.safetensors"
        save_numpy({k: v.astype(np.float32) for k, v in stats.items()}, str(out / state_file))
        norm = {
            "registry_name": registry,
            "state_file": state_file,
            "config": {
                "eps": 1e-8,
                "norm_map": mapping,
                "features": feats if pipeline == "pre" else config["output_features"],
            },
        }
        steps = [{"registry_name": "rename_observations_processor", "config": {}}] * step
        (out / f"{name}.json").write_text(json.dumps({"name": name, "steps": [*steps, norm]}))
    return config


LEROBOT_FAST_STEPS = 24  # pi0_fast's max_decoding_steps in the tiny directory
LEROBOT_FAST_VOCAB = 512  # its FAST tokenizer's ids (the byte alphabet and 256 merges)
# pi0_fast's weights, scaled so that greedy decoding writes a code (see _pi0_fast_extras)
LEROBOT_FAST_LAYER_SCALE, LEROBOT_FAST_ROW_SCALE, LEROBOT_FAST_END_SCALE = 10.0, 2.0, 3.0
_HEAD = "model.paligemma_with_expert.paligemma.lm_head.weight"
_EMBED = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"


def _lerobot_fast_tokenizer():
    """The tiny pi0_fast's FAST tokenizer, fitted on smooth (chunk, action dim) chunks."""
    from vlarun.models.fast_head import synthetic_fast_tokenizer

    return synthetic_fast_tokenizer(LEROBOT_CHUNK, LEROBOT_ACTION_DIM, LEROBOT_FAST_VOCAB)


def _pi0_fast_extras(tensors: dict, cfg) -> None:
    """Random weights decode no FAST code on their own. With the head tied to the embedding,
    small layers leave each token's own embedding in the residual stream, so greedy decoding
    repeats the last prompt token forever; and over 257k rows it would pick text ids anyway.
    So the LM's layer matrices are made larger (the layers, not the input token, decide the
    next one), and so are the embedding rows of the FAST ids that codes of smooth chunks use
    and, less, the "|" row: the greedy sequence is then FAST ids (one text id among them)
    and, eight steps on, "|". The embedding is saved as LeRobot saves it: under the head's
    name (``lerobot.RENAMES``)."""
    from vlarun.models.fast_head import smooth_chunks

    for name, t in tensors.items():
        if ".language_model.layers." in name and t.ndim == 2:
            t *= LEROBOT_FAST_LAYER_SCALE
    tok, fast = _lerobot_fast_tokenizer(), cfg.fast
    chunks = smooth_chunks(200, LEROBOT_CHUNK, LEROBOT_ACTION_DIM)
    used = sorted({i for c in chunks for i in tok.encode(c)})
    top = cfg.llm.vocab_size - 1 - fast.skip_tokens  # the LM id of FAST id 0
    embed = tensors.pop(_EMBED)
    embed[[top - f for f in used]] *= LEROBOT_FAST_ROW_SCALE
    embed[fast.end_id] *= LEROBOT_FAST_END_SCALE
    tensors[_HEAD] = embed
