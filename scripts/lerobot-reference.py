"""Record LeRobot's own pi0 / pi05 on vlarun's tiny LeRobot directory: the reference fixture.

    python scripts/lerobot-reference.py --lerobot /path/to/lerobot [--kind pi05] [--out FIXTURE]

LeRobot 7427f31 pins transformers 5.4-5.5 (later ones changed ``create_causal_mask``); with
a newer one installed, put 5.5.4 first on the path:
``pip install --target /tmp/tf55 --no-deps transformers==5.5.4 "tokenizers<=0.23.0"
"huggingface-hub<2" httpx`` and run with ``PYTHONPATH=/tmp/tf55``.

What runs is LeRobot's code, unmodified, read from a checkout at ``LEROBOT_COMMIT``:
``policies/pi0/modeling_pi0.py`` (``PI0Pytorch``: embed_prefix, the prefix pass,
denoise_step, the Euler loop) or ``policies/pi05/modeling_pi05.py`` (``PI05Pytorch``, with
its ``memory.py``), ``policies/pi_gemma.py`` (the adaptive RMSNorm),
``policies/common/{flow_matching, vla_utils}.py`` and ``utils/{constants,device_utils}.py``,
on transformers' PaliGemma and Gemma.
LeRobot itself cannot be installed beside vlarun (it needs Python >= 3.12), so the modules
those files import only for plumbing are small stand-ins written below: the config and
policy base classes, the RTC processor (off), and ``import_utils`` (draccus). Its processor
pipeline (``processor/``, Python 3.12 syntax) is not importable either: the two steps it
applies here are done by the same formulas (MEAN_STD with its eps, the task + "\\n",
right-padded tokens) and by LeRobot's own ``resize_with_pad_torch`` and ``pad_vector``.

The So400m tower's sizes LeRobot writes into its PaliGemma config (its defaults, the
intermediate size 4304, the projection 2048) are reset to the tiny tower's just before the
PaliGemma class is built; ``get_gemma_config`` learns the
``vlarun_tiny`` variant. Nothing that computes is replaced.

The fixture stores the inputs (token ids, noise, normalised state) and LeRobot's outputs
(the model's chunk and the robot actions); tests/models/test_lerobot_reference.py rebuilds
the directory (numpy-seeded, ``vlarun.parity.make_lerobot_dir``) and checks vlarun's
Policy against them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

LEROBOT_COMMIT = "7427f31801f944f5ec9ce53cda02862ce7d1638b"
REAL_FILES = (
    "policies/pi_gemma.py",
    "policies/pi0/modeling_pi0.py",
    "policies/pi05/modeling_pi05.py",
    "policies/pi05/memory.py",
    "policies/smolvla/modeling_smolvla.py",
    "policies/smolvla/smolvlm_with_expert.py",
    "policies/common/flow_matching.py",
    "policies/common/vla_utils.py",
    "utils/constants.py",
    "utils/device_utils.py",
)
STAND_INS = {
    "__init__.py": "",
    "policies/__init__.py": "",
    "policies/pi0/__init__.py": "",
    "policies/pi05/__init__.py": "",
    "policies/smolvla/__init__.py": "",
    "policies/smolvla/configuration_smolvla.py": "class SmolVLAConfig:\n    pass\n",
    "policies/utils.py": "def populate_queues(*args, **kwargs):\n    raise NotImplementedError\n",
    "policies/common/__init__.py": "",
    "utils/__init__.py": "",
    "utils/import_utils.py": (
        "_transformers_available = True\ndef require_package(*args, **kwargs):\n    return None\n"
    ),
    "configs/__init__.py": "class PreTrainedConfig:\n    pass\n",
    "policies/pretrained.py": (
        "from typing import TypeVar\nfrom torch import nn\nT = TypeVar('T')\n"
        "class PreTrainedPolicy(nn.Module):\n    pass\n"
    ),
    "policies/rtc/__init__.py": "",
    "policies/rtc/modeling_rtc.py": "class RTCProcessor:\n    pass\n",
    "policies/pi0/configuration_pi0.py": "DEFAULT_IMAGE_SIZE = 224\nclass PI0Config:\n    pass\n",
    "policies/pi05/configuration_pi05.py": (
        "DEFAULT_IMAGE_SIZE = 224\nclass PI05Config:\n    pass\n"
    ),
}
FIXTURES = Path("tests/models/fixtures")


def build_package(checkout: Path, root: Path) -> None:
    """lerobot/ under ``root``: the real files at LEROBOT_COMMIT plus the stand-ins."""
    for rel, text in STAND_INS.items():
        path = root / "lerobot" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for rel in REAL_FILES:
        blob = subprocess.run(
            ["git", "-C", str(checkout), "show", f"{LEROBOT_COMMIT}:src/lerobot/{rel}"],
            check=True, capture_output=True,
        ).stdout  # fmt: skip
        (root / "lerobot" / rel).write_bytes(blob)


def tiny_shapes(modeling, tower, expert_width: int):
    """Teach LeRobot's constructors the ``vlarun_tiny`` variants (see the module docstring)."""
    real = modeling.get_gemma_config

    def get_gemma_config(variant: str):
        if variant == "vlarun_tiny":  # the PaliGemma LM (64 wide) or the expert (48 wide)
            return modeling.GemmaConfig(64, 2, 128, 8, 1, 16)
        if variant == "vlarun_tiny_expert":
            return modeling.GemmaConfig(expert_width, 2, 96, 8, 1, 16)
        return real(variant)

    modeling.get_gemma_config = get_gemma_config
    real_paligemma = modeling.PaliGemmaForConditionalGenerationWithPiGemma

    def paligemma(config):
        """LeRobot's PaliGemma class on the tiny tower: the So400m sizes it wrote are reset."""
        v = config.vision_config
        v.hidden_size, v.num_hidden_layers = tower["hidden"], tower["layers"]
        v.num_attention_heads, v.patch_size = tower["heads"], tower["patch"]
        v.intermediate_size, v.projection_dim = tower["mlp"], config.text_config.hidden_size
        return real_paligemma(config=config)

    modeling.PaliGemmaForConditionalGenerationWithPiGemma = paligemma


def smolvla_model(modeling, config: dict, directory: Path, work: Path):
    """LeRobot's ``VLAFlowMatching`` on the directory's SmolVLM config. LeRobot reads that
    config (and a processor, for special image tokens this model does not use) from a hub
    name; here the name is a local folder holding the same config.json, and the processor is
    a stand-in carrying the two token ids its constructor reads."""
    import shutil

    vlm = work / "vlm"
    vlm.mkdir(exist_ok=True)
    shutil.copy(directory / "vlm_config.json", vlm / "config.json")
    experts = sys.modules["lerobot.policies.smolvla.smolvlm_with_expert"]
    tokens = types.SimpleNamespace(fake_image_token_id=0, global_image_token_id=0)
    experts.AutoProcessor = types.SimpleNamespace(
        from_pretrained=lambda *a, **k: types.SimpleNamespace(tokenizer=tokens)
    )
    fields = dict(config, vlm_model_name=str(vlm), freeze_vision_encoder=False,
                  train_expert_only=False, train_state_proj=True, compile_model=False,
                  rtc_config=None, device="cpu")  # fmt: skip
    return modeling.VLAFlowMatching(types.SimpleNamespace(**fields)).eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lerobot", required=True, type=Path, help="a git checkout of lerobot")
    ap.add_argument("--kind", choices=("pi0", "pi05", "smolvla"), default="pi0")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: tests/models/fixtures/lerobot_KIND_reference.json",
    )
    args = ap.parse_args(argv)
    out = args.out or FIXTURES / f"lerobot_{args.kind}_reference.json"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from vlarun import parity
    from vlarun.models import lerobot as ours

    work = Path(tempfile.mkdtemp(prefix="lerobot-ref-"))
    build_package(args.lerobot, work / "src")
    sys.path.insert(0, str(work / "src"))
    import importlib

    modeling = importlib.import_module(f"lerobot.policies.{args.kind}.modeling_{args.kind}")
    from lerobot.policies.common.vla_utils import pad_vector, resize_with_pad, resize_with_pad_torch
    from transformers import PreTrainedTokenizerFast

    directory = work / args.kind
    config = parity.make_lerobot_dir(directory, args.kind)
    if args.kind == "smolvla":
        core = modeling.VLAFlowMatching
        model = smolvla_model(modeling, config, directory, work)
    else:
        tower = ours.PALIGEMMA_VARIANTS["vlarun_tiny"][0]
        shapes = {"hidden": tower.hidden_size, "layers": tower.num_layers,
                  "heads": tower.num_heads, "patch": tower.patch_size,
                  "mlp": tower.intermediate_size}  # fmt: skip
        expert = ours.EXPERT_VARIANTS["vlarun_tiny"]
        tiny_shapes(modeling, shapes, expert.hidden_size)
        fields = dict(config, action_expert_variant="vlarun_tiny_expert",
                      freeze_vision_encoder=False, train_expert_only=False, compile_model=False,
                      rtc_config=None, use_visual_memory=False, use_proprioceptive_memory=False,
                      memory_temporal_attention_every=4)  # fmt: skip
        core = modeling.PI0Pytorch if args.kind == "pi0" else modeling.PI05Pytorch
        model = core(types.SimpleNamespace(**fields)).eval()
    from safetensors.torch import load_file

    # On disk the tower is ``vision_tower.vision_model.*``, as transformers 5.5 (LeRobot's pin)
    # names it in memory; later transformers drop the ``vision_model`` level.
    flat = not any(".vision_tower.vision_model." in k for k in model.state_dict())
    state = {k.removeprefix("model."): v
             for k, v in load_file(str(directory / "model.safetensors")).items()}  # fmt: skip
    if flat:
        state = {k.replace("vision_tower.vision_model.", "vision_tower."): v
                 for k, v in state.items()}  # fmt: skip
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("lm_head.weight")]
    if missing or result.unexpected_keys:
        raise SystemExit(f"weights do not fit LeRobot's model: missing {missing}, "
                         f"unexpected {result.unexpected_keys}")  # fmt: skip

    inputs = parity.lerobot_reference_inputs()
    side = (config.get("image_resolution") or config["resize_imgs_with_padding"])[0]
    images, masks = [], []
    for frame in inputs["frames"]:
        img = torch.from_numpy(frame.copy()).float().div(255.0)[None]  # (1, H, W, 3) in [0, 1]
        if args.kind == "smolvla":  # SmolVLAPolicy.prepare_images: (B, C, H, W), top-left pad
            img = resize_with_pad(img.permute(0, 3, 1, 2), side, side, pad_value=0)
            images.append(img * 2.0 - 1.0)
        else:  # PI0Policy._preprocess_images, channels-last as it does
            if tuple(img.shape[1:3]) != (side, side):
                img = resize_with_pad_torch(img, side, side)
            images.append((img * 2.0 - 1.0).permute(0, 3, 1, 2))
        masks.append(torch.ones(1, dtype=torch.bool))
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"),
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
    )
    from safetensors.numpy import load_file as load_numpy

    def stats(name: str) -> dict:
        (path,) = directory.glob(f"{name}_step_*.safetensors")
        return load_numpy(str(path))

    pre, post = stats("policy_preprocessor"), stats("policy_postprocessor")
    eps = 1e-8  # NormalizerProcessorStep's default, saved in the pipeline's config
    raw = inputs["state"]
    if args.kind != "pi05":  # MEAN_STD, padded to 32 by prepare_state
        norm_state = (raw - pre["observation.state.mean"]) / (pre["observation.state.std"] + eps)
    else:  # QUANTILES
        q01, q99 = pre["observation.state.q01"], pre["observation.state.q99"]
        norm_state = 2.0 * (raw - q01) / (q99 - q01) - 1.0
    norm_state = norm_state.astype(np.float32)
    task = inputs["task"] + "\n"  # Pi0NewLineProcessor
    if args.kind == "pi05":  # Pi05PrepareStateTokenizerProcessorStep's prompt
        bins = np.digitize(norm_state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        cleaned = inputs["task"].strip().replace("_", " ").replace("\n", " ")
        task = f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "
    padding = config.get("pad_language_to", "max_length")  # SmolVLA: "longest"
    enc = tok(task, padding=padding, padding_side="right",
              max_length=config["tokenizer_max_length"], truncation=True,
              return_tensors="pt")  # fmt: skip
    state_in = pad_vector(torch.from_numpy(norm_state)[None], 32)
    gen = torch.Generator().manual_seed(0)  # vlarun's Policy draws a request's noise so
    noise = torch.randn(1, config["chunk_size"], config["max_action_dim"], generator=gen)
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    with torch.no_grad():
        if args.kind != "pi05":
            chunk = model.sample_actions(images, masks, ids, mask, state_in, noise=noise)
        else:  # pi05 reads the state from its prompt only
            chunk = model.sample_actions(images, masks, ids, mask, noise=noise)
    dim = config["output_features"]["action"]["shape"][0]
    y = chunk[0, :, :dim].numpy()
    if args.kind != "pi05":
        robot = y * post["action.std"] + post["action.mean"]
    else:
        robot = (y + 1.0) * (post["action.q99"] - post["action.q01"]) / 2.0 + post["action.q01"]
    digest = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    n_text = int(enc["attention_mask"].sum())
    fixture = {
        "_source": f"scripts/lerobot-reference.py --kind {args.kind} on lerobot "
                   f"{LEROBOT_COMMIT} ({core.__name__}), "
                   f"transformers {__import__('transformers').__version__}, torch "
                   f"{torch.__version__}",
        "weights_sha256": digest,
        "input_ids": enc["input_ids"][0, :n_text].tolist(),
        "state_normalised": state_in[0].tolist(),
        "noise": noise[0].tolist(),
        "chunk": chunk[0].tolist(),
        "actions": robot.astype(np.float64).tolist(),
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {out}: ids {fixture['input_ids']}, actions[0] {robot[0].round(4)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
