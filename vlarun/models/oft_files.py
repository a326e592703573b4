"""OpenVLA-OFT's extra heads, converted once from torch pickles to safetensors (``vlarun convert``).

An OpenVLA-OFT checkpoint directory is an OpenVLA directory (``model_type: "openvla"``, sharded
safetensors) plus the heads its fine-tuning script saves with ``torch.save``:
``action_head--{step}_checkpoint.pt`` (the L1 regression MLP-ResNet) and
``proprio_projector--{step}_checkpoint.pt`` (state -> one LM token), ``step`` a number or
``latest``, keys prefixed ``module.`` when trained under DDP. OFT picks the chunk, action and
state sizes and the number of camera views by looking at ``sys.argv`` at run time; they are in
no file, so the conversion takes them (``--platform`` for the published settings).

Conversion (``vlarun convert``, ``apps/convert.py``: the only place in vlarun that reads a
pickle, never at run time) reads them with ``torch.load(weights_only=True)``: only tensors and
plain containers are rebuilt, no code from the file runs. It writes ``oft_heads.safetensors`` (keys
``action_head.*`` and ``proprio_projector.*``, vlarun's names, which are OFT's) and
``oft_heads.json`` (the sizes, and each source file's SHA-256). Loading never touches the
pickles: ``checkpoint.load_vla`` builds the parallel family from those two files, and a
directory whose heads were not converted fails in one line that says how to convert them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

HEADS_FILE = "oft_heads.safetensors"
HEADS_CONFIG = "oft_heads.json"
KINDS = ("action_head", "proprio_projector")
_PICKLE = re.compile(r"^(action_head|proprio_projector)--(\d+|latest)_checkpoint\.pt$")


@dataclass(frozen=True)
class Platform:
    """What OFT's scripts choose by platform: action chunk, action and state sizes, views."""

    chunk: int
    action_dim: int
    proprio_dim: int
    num_images: int


# openvla-oft's constants.py and its LIBERO / ALOHA / Bridge evaluation scripts.
PLATFORMS = {
    "libero": Platform(chunk=8, action_dim=7, proprio_dim=8, num_images=2),
    "aloha": Platform(chunk=25, action_dim=14, proprio_dim=14, num_images=3),
    "bridge": Platform(chunk=5, action_dim=7, proprio_dim=7, num_images=1),
}


class HeadsError(ValueError):
    """The heads cannot be converted or used; the message names the file or field at fault."""


def pickled_heads(directory: str | Path, step: str | None = None) -> dict[str, Path]:
    """{kind: path} of the OFT head pickles in ``directory``: ``step`` if given, else
    ``latest`` when present, else the highest step."""
    found: dict[str, dict[str, Path]] = {}
    for path in Path(directory).iterdir():
        m = _PICKLE.match(path.name)
        if m:
            found.setdefault(m.group(1), {})[m.group(2)] = path
    out = {}
    for kind in (k for k in KINDS if k in found):
        steps = found[kind]
        if step is not None:
            if step not in steps:
                have = ", ".join(sorted(steps))
                raise HeadsError(f"{directory}: no {kind}--{step}_checkpoint.pt (steps: {have})")
            out[kind] = steps[step]
        else:
            key = "latest" if "latest" in steps else max((s for s in steps if s.isdigit()), key=int)
            out[kind] = steps[key]
    return out


def head_shapes(state: dict[str, Tensor], platform: Platform, where: Path | str) -> dict:
    """The head sizes the tensors imply, checked against the platform's: one HeadsError naming
    the key and both numbers on any disagreement."""
    try:
        fc1 = state["action_head.model.fc1.weight"]  # (hidden, action_dim * llm_dim)
    except KeyError:
        raise HeadsError(
            f"{where}: the action head has no model.fc1.weight (not OFT's L1 head)"
        ) from None
    hidden, fan_in = fc1.shape
    out_dim = state["action_head.model.fc2.weight"].shape[0]  # (action_dim, hidden)
    if out_dim != platform.action_dim:
        raise HeadsError(
            f"{where}: action_head.model.fc2.weight emits {out_dim} action numbers, the platform "
            f"{platform.action_dim}"
        )
    if fan_in % platform.action_dim:
        raise HeadsError(
            f"{where}: action_head.model.fc1.weight takes {fan_in} inputs, not a multiple of "
            f"action_dim {platform.action_dim}"
        )
    blocks = {
        k.split(".")[3] for k in state if k.startswith("action_head.model.mlp_resnet_blocks.")
    }
    out = {
        "chunk": platform.chunk,
        "action_dim": platform.action_dim,
        "num_images": platform.num_images,
        "llm_dim": fan_in // platform.action_dim,
        "hidden_dim": hidden,
        "num_blocks": len(blocks),
        "proprio_dim": 0,
    }
    proj = state.get("proprio_projector.fc1.weight")  # (llm_dim, proprio_dim)
    if proj is not None:
        if proj.shape[1] != platform.proprio_dim:
            raise HeadsError(
                f"{where}: proprio_projector.fc1.weight takes {proj.shape[1]} state numbers, "
                f"the platform {platform.proprio_dim}"
            )
        out["proprio_dim"] = platform.proprio_dim
    return out


def read_heads_config(directory: str | Path) -> dict | None:
    """The converted heads' sizes, or None for a directory without OFT heads. A directory with
    unconverted head pickles raises one HeadsError saying how to convert them."""
    d = Path(directory)
    if (d / HEADS_CONFIG).exists():
        return json.loads((d / HEADS_CONFIG).read_text())
    if d.is_dir() and any(_PICKLE.match(p.name) for p in d.iterdir()):
        raise HeadsError(
            f"{d} holds OpenVLA-OFT heads as torch pickles, which vlarun does not load; convert "
            f"them once: vlarun convert {d} --platform libero|aloha|bridge"
        )
    return None
