"""Record OpenVLA's own ``predict_action`` on a random-weight OpenVLA directory, once, as the
fixture ``tests/models/fixtures/openvla_reference.json`` that
``tests/models/test_openvla_reference.py`` holds vlarun to (issue 20: same greedy action tokens,
same unnormalised actions within 1e-5, frames of any size).

Two steps, two Python environments:

  1. vlarun's:  .venv/bin/python scripts/openvla-reference.py make DIR
     writes DIR with ``vlarun.parity.make_openvla_reference_dir``: seeded random weights in
     OpenVLA's layout (the real DINOv2-L + SigLIP-So400m towers, a 2-layer Llama text_config),
     config.json, preprocessor_config.json and the prompt's ids. The test rebuilds the same
     directory and checks its SHA-256 against the fixture's, so both ran the same weights.
  2. OpenVLA's: REF/bin/python scripts/openvla-reference.py reference DIR --openvla SRC
     with OpenVLA's pins (timm 0.9.10, transformers 4.40.1, tokenizers 0.19.1, torchvision)
     loads DIR with the unmodified ``prismatic/extern/hf/*.py`` of SRC (a checkout of
     github.com/openvla/openvla; recorded with c8f03f4), preprocesses every frame with its
     ``PrismaticImageProcessor`` and runs ``OpenVLAForActionPrediction.predict_action``.

How the fixture was made (2026-12-02; a CPU-only torch 2.13 here, with PyPI's CUDA
torchvision 0.28, whose C++ operators cannot load: its fake-kernel registrations are skipped at
import, which only the detection operators need):

  python3 -m venv /tmp/ovla && /tmp/ovla/bin/pip install torch==2.13.0
  /tmp/ovla/bin/pip install --no-deps torchvision==0.28.0 timm==0.9.10 transformers==4.40.1 \\
      tokenizers==0.19.1 "huggingface_hub<0.25" safetensors pyyaml "numpy<2" pillow regex \\
      requests filelock packaging tqdm fsspec typing_extensions
  .venv/bin/python scripts/openvla-reference.py make /tmp/ovla-dir
  /tmp/ovla/bin/python scripts/openvla-reference.py reference /tmp/ovla-dir --openvla SRC
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests/models/fixtures/openvla_reference.json"


def make(directory: str) -> None:
    from vlarun.parity import make_openvla_reference_dir

    print(json.dumps(make_openvla_reference_dir(directory)))


def _import_openvla(src: Path):
    """OpenVLA's three HF files as a package of their own, unmodified."""
    import torch
    import torch.library

    register_fake = torch.library.register_fake
    torch.library.register_fake = lambda *a, **k: lambda f: f  # see the module docstring
    try:
        import torchvision  # noqa: F401
    finally:
        torch.library.register_fake = register_fake
    pkg = Path(tempfile.mkdtemp()) / "openvla_hf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("configuration_prismatic.py", "modeling_prismatic.py", "processing_prismatic.py"):
        shutil.copy(src / "prismatic/extern/hf" / name, pkg / name)
    sys.path.insert(0, str(pkg.parent))
    from openvla_hf import configuration_prismatic, modeling_prismatic, processing_prismatic

    return configuration_prismatic, modeling_prismatic, processing_prismatic


def reference(directory: str, src: str, out: str) -> None:
    import numpy as np
    import torch
    from PIL import Image

    d = Path(directory)
    conf, modeling, processing = _import_openvla(Path(src))
    inputs = json.loads((d / "reference_inputs.json").read_text())
    config = conf.OpenVLAConfig.from_pretrained(d)
    model = modeling.OpenVLAForActionPrediction.from_pretrained(
        d, config=config, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    pre = json.loads((d / "preprocessor_config.json").read_text())
    pre.pop("image_processor_type", None)
    processor = processing.PrismaticImageProcessor(**pre)
    # The frames: the seeded generator of vlarun.parity.openvla_reference_frames (numpy only).
    rng = np.random.default_rng(inputs["frames_seed"])
    frames = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in inputs["frame_sizes"]]
    captured = {}
    generate = model.generate

    def recording_generate(*a, **k):
        captured["ids"] = generate(*a, **k)
        return captured["ids"]

    model.generate = recording_generate
    rows = []
    for i, frame in enumerate(frames):
        pixels = processor.preprocess(Image.fromarray(frame), return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            actions = model.predict_action(
                input_ids=torch.tensor([inputs["input_ids"]]),
                pixel_values=pixels.float(),
                do_sample=False,
            )
        n = len(actions)
        rows.append({
            "frame": i,
            "size": list(frame.shape[:2]),
            "action_ids": captured["ids"][0, -n:].tolist(),
            "actions": [float(a) for a in actions],
            "pixel_values_sum": float(pixels.double().sum()),
        })  # fmt: skip
    import timm
    import tokenizers
    import transformers

    fixture = {
        "about": "OpenVLA's predict_action (openvla c8f03f4, prismatic/extern/hf) on the "
        "directory vlarun.parity.make_openvla_reference_dir writes; scripts/openvla-reference.py",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "weights_sha256": inputs["weights_sha256"],
        "input_ids": inputs["input_ids"],
        "versions": {
            "torch": torch.__version__,
            "timm": timm.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },  # fmt: skip
        "rows": rows,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(fixture, indent=1))
    print(json.dumps(fixture["rows"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    m = sub.add_parser("make", help="write the random-weight OpenVLA directory (vlarun's env)")
    m.add_argument("directory")
    r = sub.add_parser("reference", help="run OpenVLA's own code on it (OpenVLA's env)")
    r.add_argument("directory")
    r.add_argument("--openvla", required=True, help="checkout of github.com/openvla/openvla")
    r.add_argument("--out", default=str(FIXTURE))
    a = ap.parse_args()
    if a.step == "make":
        make(a.directory)
    else:
        reference(a.directory, a.openvla, a.out)


if __name__ == "__main__":
    main()
