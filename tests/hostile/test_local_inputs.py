"""Local inputs bounded before they are allocated (issue 64, 3): each bad input is one line and
exit 2, checked from what the file's header claims, not after numpy or PIL built it. On
d47acf9 the .npy made numpy try 27.9 GiB, the PNG was decoded before its size was checked and
the episode count grew a seed list to 6.1 GB."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _vlarun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "vlarun", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _npy(path: Path, shape: tuple[int, ...], body: bytes) -> Path:
    """A .npy file whose header claims ``shape`` of uint8, followed by ``body``."""
    header = f"{{'descr': '|u1', 'fortran_order': False, 'shape': {shape}, }}"
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + body)
    return path


def _one_line_exit_2(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr[-1500:]
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-1500:]
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize(
    "shape, body, words",
    [
        ((100000, 100000, 3), b"\x00" * 100, ("larger than any camera frame",)),
        ((64, 64, 3), b"\x00" * 100, ("the file holds 100",)),  # a header that lies
    ],
)
def test_act_checks_an_npy_header_before_loading(tmp_path, shape, body, words):
    path = _npy(tmp_path / "liar.npy", shape, body)
    done = _vlarun("act", "--policy", "tiny-ar", "--instruction", "open", "--image", str(path))
    _one_line_exit_2(done, str(path), *words)


def test_act_refuses_an_image_larger_than_a_frame_before_decoding(tmp_path):
    from PIL import Image

    path = tmp_path / "huge.png"
    Image.new("L", (5000, 5000)).save(path)  # 25 Mpx: compresses to a few KB
    done = _vlarun("act", "--policy", "tiny-ar", "--instruction", "open", "--image", str(path))
    _one_line_exit_2(done, "5000 x 5000 pixels")
    # A file that is no image at all: one line too.
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    _one_line_exit_2(
        _vlarun("act", "--policy", "tiny-ar", "--instruction", "open", "--image", str(bad)),
        str(bad),
    )


@pytest.mark.parametrize("side", [12000, 20000])
def test_a_png_header_of_a_huge_image_is_one_line_without_pil_s_warning(tmp_path, side):
    """12000 x 12000 is past PIL's bomb warning (89 Mpx) and below its error (179 Mpx): the
    warning used to print two lines before the refusal (bench hostile's png-huge row)."""
    from vlarun.bench.hostile_local import _png_header

    path = _png_header(tmp_path / "big.png", side)
    done = _vlarun("act", "--policy", "tiny-ar", "--instruction", "open", "--image", str(path))
    _one_line_exit_2(done, str(path))


def test_eval_bounds_its_episode_count_before_building_seeds():
    done = _vlarun(
        "eval",
        "--policy",
        "tiny-ar",
        "--workers",
        "1",
        "--tasks",
        "reach-v3",
        "--episodes",
        "99999999999999999999",
    )
    _one_line_exit_2(done, "--episodes must lie in 1..10000")


def test_a_normal_npy_frame_still_loads(tmp_path):
    from vlarun.apps.model import _load_image

    path = tmp_path / "ok.npy"
    np.save(path, np.zeros((64, 64, 3), np.uint8))
    assert _load_image(str(path), 64, False).shape == (64, 64, 3)


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda b: b[: len(b) // 2], "claims bytes"),  # truncated: tensors run past the end
        (lambda b: b[:8] + b"\xff\xfe" + b[10:], "not JSON"),  # flipped header bytes
        (lambda b: (2**40).to_bytes(8, "little") + b[8:], "runs past the file"),
    ],
    ids=["truncated", "flipped-header", "huge-header-length"],
)
def test_a_damaged_safetensors_file_is_one_line(tmp_path, damage, words):
    import shutil

    from vlarun.paths import policy_dir

    d = tmp_path / "ckpt"
    shutil.copytree(policy_dir("tiny-ar"), d)
    weights = d / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    image = tmp_path / "frame.npy"
    np.save(image, np.zeros((64, 64, 3), np.uint8))
    done = _vlarun("act", "--policy", str(d), "--instruction", "open", "--image", str(image))
    _one_line_exit_2(done, "model.safetensors", words)


def test_a_config_deeper_than_its_weights_is_refused_before_building(tmp_path):
    import json
    import shutil
    import time

    from vlarun.paths import policy_dir

    d = tmp_path / "ckpt"
    shutil.copytree(policy_dir("tiny-ar"), d)
    config = json.loads((d / "config.json").read_text())
    config["vla"]["llm"]["num_layers"] = 100000
    (d / "config.json").write_text(json.dumps(config))
    image = tmp_path / "frame.npy"
    np.save(image, np.zeros((64, 64, 3), np.uint8))
    t0 = time.monotonic()
    done = _vlarun("act", "--policy", str(d), "--instruction", "open", "--image", str(image))
    _one_line_exit_2(done, "language model 100000 layers", "at most 4 layers")
    assert time.monotonic() - t0 < 60  # refused at once, not after building 100,000 layers


def test_openpi_counts_a_state_before_converting_it():
    """Issue 64 (4): a uint8 state of 16M entries was converted to float32 (64 MB a request)
    before the 1,024-entry limit was read; now it is refused having allocated nothing."""
    import tracemalloc

    from vlarun.runtime.openpi import LAYOUTS

    layout = LAYOUTS["metaworld"]
    obs = {
        "image": np.zeros((64, 64, 3), np.uint8),
        "prompt": "open",
        "state": np.zeros(16_000_000, np.uint8),
    }
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="at most 1024 numbers"):
            layout.inputs(obs, 1, 4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak  # nothing the size of the state, let alone 4x it
    with pytest.raises(ValueError, match="at most 1024 numbers"):  # a list: counted, not built
        layout.inputs({**obs, "state": [0.0] * 2000}, 1, 4096)


def test_openpi_checks_every_camera_sent_even_one_the_policy_does_not_read():
    from vlarun.runtime.openpi import LAYOUTS

    layout = LAYOUTS["metaworld"]
    obs = {
        "image": np.zeros((64, 64, 3), np.uint8),
        "prompt": "open",
        "second_image": np.zeros((64, 64, 3), np.float64),
    }
    with pytest.raises(ValueError, match="'second_image' must be an"):
        layout.inputs(obs, 1, 4096)  # a one-view policy: the second view is still checked
