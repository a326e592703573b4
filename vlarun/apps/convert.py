"""`vlarun convert`: OpenVLA-OFT's pickled heads to safetensors, once (``models/oft_files.py``).

The one module of vlarun that reads a pickle, and only with ``torch.load(weights_only=True)``
(torch's restricted unpickler: tensors and plain containers, anything else refused): the
checkpoint loaders and the wire never import it (tests/runtime/test_no_pickle.py).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from vlarun.models.oft_files import (
    HEADS_CONFIG,
    HEADS_FILE,
    HeadsError,
    Platform,
    head_shapes,
    pickled_heads,
)


def _read_pickle(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and containers
        raise HeadsError(
            f"{path}: not a plain state dict of tensors ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise HeadsError(f"{path}: expected a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def convert(
    directory: str | Path,
    platform: Platform,
    step: str | None = None,
) -> dict:
    """Convert the head pickles of an OpenVLA-OFT directory to ``oft_heads.safetensors`` and
    ``oft_heads.json`` beside them; returns the JSON written. The pickles stay where they are
    (vlarun never reads them again)."""
    d = Path(directory)
    files = pickled_heads(d, step)
    if "action_head" not in files:
        raise HeadsError(f"{d}: no action_head--*_checkpoint.pt to convert")
    warnings.warn(
        f"reading {', '.join(p.name for p in files.values())} with torch.load(weights_only=True): "
        "tensors only, no code runs; the safetensors copy is what vlarun loads from now on",
        stacklevel=2,
    )
    state: dict[str, Tensor] = {}
    for kind, path in files.items():
        state |= {f"{kind}.{k}": v.contiguous() for k, v in _read_pickle(path).items()}
    shapes = head_shapes(state, platform, d)
    save_file(state, d / HEADS_FILE)
    meta = shapes | {
        "sources": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files.values()}
    }
    (d / HEADS_CONFIG).write_text(json.dumps(meta, indent=1))
    return meta
