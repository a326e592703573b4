"""`vlarun info | act | check-parity | convert | bench engine`: one model, no simulator.

Nothing here imports torch, MuJoCo or the training code at import time: ``vlarun info`` works
on a machine with neither a simulator nor a GPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import DEFAULT_POLICY, MODEL_HELP, POLICY_FLAGS_RETIRED, POLICY_HELP, opt
from vlarun.models.presets import PRESETS


@dataclass(frozen=True)
class InfoOptions:
    """Parameters, per-stage FLOPs and bytes, and packet sizes of a preset (no weights needed)."""

    model: str = opt(
        help=f"{MODEL_HELP}, or a checkpoint directory; presets: {', '.join(PRESETS)}",
        replaces=("NAME", "--preset"),
        aliases=("--policy",),  # what act / eval / serve-policy call a shipped policy
    )
    batch: int = opt(1, "batch size")
    text_tokens: int = opt(24, "instruction tokens in the prompt")
    dtype: str = opt("bfloat16", "compute dtype", choices=["bfloat16", "float32"])
    json: bool = opt(False, "print one JSON object")


@dataclass(frozen=True)
class ActOptions:
    """One inference on an image file: prints the action and per-stage latency."""

    image: str = opt(
        help="RGB image file (PNG/JPEG) or .npy (H, W, 3) uint8; one per camera, comma-separated"
    )
    instruction: str = opt(help="what the robot should do")
    state: str | None = opt(None, "robot state, comma-separated numbers (policies that read it)")
    policy: str = opt(DEFAULT_POLICY, POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    resize: bool = opt(
        False, "resize the image (bicubic) to the model's input size instead of failing"
    )
    unnorm_key: str | None = opt(None, "dataset statistics to un-normalise with")
    dtype: str = opt("float32", "compute dtype", choices=["bfloat16", "float32"])
    setting: str = opt(
        "full", "accelerator setting to run under (e.g. int8, triage:0.34, exit:0.5+int8)"
    )
    seed: int = opt(0, "seed for random weights and the initial noise")
    repeats: int = opt(5, "timed repetitions after one warm-up run")
    threads: int = opt(
        0,
        "torch threads (0: torch's default, one per core; on a busy machine fewer can be "
        "several times faster)",
    )
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    json: bool = opt(False, "print one JSON object")


@dataclass(frozen=True)
class ParityOptions:
    """Compare vlarun with transformers on identical weights."""

    transformers_dir: str | None = opt(
        None,
        "a transformers save_pretrained directory (Llama, Gemma, SigLIP, DINOv2) to compare",
        replaces=("--checkpoint",),
    )
    json: bool = opt(False, "print one JSON object")


def cmd_info(o: InfoOptions) -> dict:
    from vlarun.models.checkpoint import model_config
    from vlarun.stages.families import Workload, build_graph, param_split, prefix_len

    cfg = model_config(o.model)
    w = Workload(o.batch, o.text_tokens, o.dtype)
    graph = build_graph(cfg, w=w)
    split = param_split(cfg)
    params = split["total"]
    tokens = prefix_len(cfg, w)
    llm = cfg.llm.num_params()
    prefill = graph.stages[1].cost.flops / w.batch
    stages = [
        {
            "name": s.name,
            "flops": s.cost.flops,
            "bytes": s.cost.bytes,
            "weight_bytes": s.cost.weight_bytes,
            "passes": s.cost.passes,
            "params": s.params,
            "in_packet_bytes": s.in_bytes,
            "out_packet_bytes": s.out_bytes,
        }
        for s in graph.stages
    ]
    return {
        "model": cfg.name,
        "family": cfg.family,
        "params": params,
        "params_by_part": split,
        "visual_tokens": cfg.num_visual,
        "prefix_tokens": tokens,
        "actions_per_inference": cfg.horizon,
        "action_dim": cfg.action_dim,
        "action_tokens": cfg.num_action_tokens,  # decoded (AR) or placeholder (OFT) LM tokens
        "dtype": o.dtype,
        "batch": o.batch,
        "stages": stages,
        "prefill_flops_vs_2_llm_params_tokens": prefill / (2 * llm * tokens),
        "notes": cfg.notes,
    }


def _print_info(r: dict) -> None:
    parts = ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in r["params_by_part"].items() if k != "total")
    print(f"{r['model']} ({r['family']}): {r['params'] / 1e9:.3f} B parameters ({parts})")
    print(
        f"  {r['visual_tokens']} visual tokens, prefix {r['prefix_tokens']} tokens, "
        f"{r['actions_per_inference']} actions x {r['action_dim']} per inference, "
        f"{r['action_tokens']} action tokens, {r['dtype']}"
    )
    head = ("stage", "GFLOP", "GB moved", "passes", "in packet", "out packet")
    print("  {:<14}{:>12}{:>11}{:>8}{:>13}{:>13}".format(*head))
    for s in r["stages"]:
        print(
            f"  {s['name']:<14}{s['flops'] / 1e9:>12.2f}{s['bytes'] / 1e9:>11.3f}{s['passes']:>8}"
            f"{_mb(s['in_packet_bytes']):>13}{_mb(s['out_packet_bytes']):>13}"
        )
    print(
        f"  prefill FLOPs / (2 x LLM params x prefix tokens) = "
        f"{r['prefill_flops_vs_2_llm_params_tokens']:.3f}"
    )
    if r["notes"]:
        print(f"  note: {r['notes']}")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _parse_state(text: str | None):
    import numpy as np

    if text is None:
        return None
    try:
        return np.array([float(v) for v in text.split(",")], dtype=np.float32)
    except ValueError:
        raise ValueError(f"--state {text!r}: expected comma-separated numbers") from None


# The largest frame `act` reads: a 4096 x 4096 RGB image (48 MiB as uint8), far above any
# camera a VLA takes; checked from the file's header before anything is decoded (issue 64: a
# 228-byte .npy claiming 100000 x 100000 x 3 made numpy try 27.9 GiB).
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_IMAGE_BYTES = MAX_IMAGE_PIXELS * 3 * 4


def _npy_header(p: Path) -> tuple[tuple[int, ...], np.dtype]:  # noqa: F821
    """A .npy file's shape and dtype from its header, checked against the file's size."""
    import numpy as np

    with p.open("rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read(f, max_header_size=10_000)
        except (ValueError, OSError) as e:
            raise ValueError(f"image file {p}: not a readable .npy header ({e})") from None
        body = p.stat().st_size - f.tell()
    if dtype.hasobject:
        raise ValueError(f"image file {p}: object arrays are refused (no pickle)")
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if n * dtype.itemsize > MAX_IMAGE_BYTES or n > MAX_IMAGE_PIXELS * 4:
        raise ValueError(
            f"image file {p}: shape {shape} of {dtype} is larger than any camera "
            f"frame (at most {MAX_IMAGE_PIXELS} pixels of 3 channels)"
        )
    if n * dtype.itemsize > body:
        raise ValueError(
            f"image file {p}: its header claims {shape} of {dtype} "
            f"({n * dtype.itemsize} bytes) but the file holds {body}"
        )
    return shape, dtype


def _load_image(path: str, size: int, resize: bool):
    import numpy as np

    p = Path(path)
    if not p.exists():
        raise ValueError(f"image file {path} does not exist")
    if p.suffix == ".npy":
        _npy_header(p)  # refused before numpy allocates what the header claims
        arr = np.load(p, allow_pickle=False)
    else:
        import warnings

        from PIL import Image, UnidentifiedImageError

        try:
            # PIL warns (on stderr) about a header of 89-179 Mpx before anything is decoded;
            # the size is checked against a camera frame's just below, in one line of our own.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                im = Image.open(p)  # lazy: the header only, nothing decoded yet
            with im:
                w, h = im.size
                if w * h > MAX_IMAGE_PIXELS:
                    raise ValueError(
                        f"image file {p}: {w} x {h} pixels is larger than any "
                        f"camera frame (at most {MAX_IMAGE_PIXELS})"
                    )
                arr = np.asarray(im.convert("RGB"))
        except (Image.DecompressionBombError, UnidentifiedImageError, OSError) as e:
            raise ValueError(f"image file {p}: {e}") from None
    if resize and arr.shape[:2] != (size, size):
        from vlarun.policy.base import resize_frame

        arr = resize_frame(arr, size, "bicubic")  # as OpenVLA's processor does
    return arr


def cmd_act(o: ActOptions) -> dict:
    import statistics

    import torch

    from vlarun.models.device import resolve_device
    from vlarun.policy import Policy
    from vlarun.policy.setting import AccelSetting

    device = resolve_device(o.device)  # before anything loads
    setting = AccelSetting.parse(o.setting)  # a bad setting fails before anything loads
    if o.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {o.threads}")
    if o.threads:
        torch.set_num_threads(o.threads)
    dtype = torch.bfloat16 if o.dtype == "bfloat16" else torch.float32
    policy = Policy.load(o.policy, dtype, str(device), seed=o.seed, unnorm_key=o.unnorm_key)
    if o.setting != "full":
        policy = policy.with_setting(setting)
    frames = [_load_image(p, policy.model.cfg.image_size, o.resize) for p in o.image.split(",")]
    image = frames[0] if len(frames) == 1 else frames
    state = _parse_state(o.state)
    if policy.state_size and state is None:
        raise ValueError(
            f"{policy.model.cfg.name} reads the robot state: pass --state with "
            f"{policy.state_size} comma-separated numbers"
        )
    policy.inputs(image, o.instruction, state, o.seed)  # validate before any work
    kw = {"state": state, "seed": o.seed}
    policy.run_stages(image, o.instruction, **kw)  # warm-up: one-time allocations
    runs = [policy.run_stages(image, o.instruction, **kw) for _ in range(max(o.repeats, 1))]
    names = [t.name for t in runs[0].timings]
    per_stage = {n: [r.timings[i].seconds * 1e3 for r in runs] for i, n in enumerate(names)}
    totals = [sum(t.seconds for t in r.timings) * 1e3 for r in runs]
    actions = policy.unnormalize(runs[-1].outputs["actions"][0])
    return {
        "model": policy.model.cfg.name,
        "family": policy.model.cfg.family,
        "policy": o.policy,
        "setting": o.setting,
        "instruction": o.instruction,
        "actions": actions.round(5).tolist(),
        "unnormalized": policy.action_units == "robot units",
        "action_units": policy.action_units,
        "timing_scope": "model stages only, in process, warm-up excluded, median of repeats",
        "stages": [
            {"name": n, "median_ms": statistics.median(v), "max_ms": max(v)}
            for n, v in per_stage.items()
        ],
        "total_median_ms": statistics.median(totals),
        "repeats": len(runs),
        "dtype": o.dtype,
        "threads": torch.get_num_threads(),
    }


def _print_act(r: dict) -> None:
    under = "" if r.get("setting", "full") == "full" else f" under {r['setting']}"
    print(f'{r["model"]} ({r["family"]}){under} - "{r["instruction"]}"')
    units = r["action_units"]
    for i, a in enumerate(r["actions"]):
        print(f"  action[{i}] ({units}): " + " ".join(f"{x:+.4f}" for x in a))
    print(f"  latency per stage ({r['timing_scope']}, n={r['repeats']}):")
    for s in r["stages"]:
        print(f"    {s['name']:<14}{s['median_ms']:>9.2f} ms  (max {s['max_ms']:.2f})")
    print(f"    {'total':<14}{r['total_median_ms']:>9.2f} ms")


def cmd_parity(o: ParityOptions) -> dict:
    from vlarun.extras import require
    from vlarun.parity import check_parity

    require("transformers")  # before the first progress line
    return check_parity(
        o.transformers_dir, progress=lambda s: print(f"checking {s}", file=sys.stderr)
    )


def _print_parity(r: dict) -> None:
    for c in r["checks"]:
        print(
            f"  {'ok ' if c['ok'] else 'FAIL'} {c['name']:<58} {c['max_abs_diff']:.2e}"
            f" (tol {c['tolerance']:.0e})"
        )
    print("all checks passed" if r["ok"] else "SOME CHECKS FAILED")


@dataclass(frozen=True)
class ConvertOptions:
    """Convert an OpenVLA-OFT directory's pickled heads to safetensors, once (never loaded)."""

    directory: str = opt(help="OpenVLA-OFT checkpoint directory", positional=True)
    platform: str = opt(
        "libero",
        "OFT's platform sizes (chunk, action, state, views): libero 8/7/8/2, "
        "aloha 25/14/14/3, bridge 5/7/7/1",
        choices=["libero", "aloha", "bridge"],
    )
    chunk: int = opt(0, "action chunk (0: the platform's)")
    action_dim: int = opt(0, "action dimensions (0: the platform's)")
    proprio_dim: int = opt(0, "robot state dimensions (0: the platform's)")
    num_images: int = opt(0, "camera views (0: the platform's)")
    step: str | None = opt(None, "which checkpoint step (default: latest, else the highest)")
    json: bool = opt(False, "print one JSON object")


def cmd_convert(o: ConvertOptions) -> dict:
    import dataclasses
    import warnings

    from vlarun.apps.convert import convert
    from vlarun.models.oft_files import PLATFORMS

    base = PLATFORMS[o.platform]
    mine = {
        "chunk": o.chunk,
        "action_dim": o.action_dim,
        "proprio_dim": o.proprio_dim,
        "num_images": o.num_images,
    }
    if any(v < 0 for v in mine.values()):
        raise ValueError(f"sizes must be >= 0, got {mine}")
    platform = dataclasses.replace(base, **{k: v for k, v in mine.items() if v})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        meta = convert(o.directory, platform, o.step)
    for w in seen:
        print(f"warning: {w.message}", file=sys.stderr)
    return {"directory": o.directory, "platform": o.platform} | meta


def _print_convert(r: dict) -> None:
    print(
        f"wrote {r['directory']}/oft_heads.safetensors and oft_heads.json: chunk "
        f"{r['chunk']}, action {r['action_dim']}, state {r['proprio_dim']}, views "
        f"{r['num_images']}, head {r['num_blocks']} blocks x {r['hidden_dim']} on "
        f"{r['llm_dim']}-wide LM states"
    )
    for name, sha in r["sources"].items():
        print(f"  from {name} (sha256 {sha[:16]}...)")


OPTIONS = {
    "info": InfoOptions,
    "act": ActOptions,
    "check-parity": ParityOptions,
    "convert": ConvertOptions,
}
RUN = {
    "info": cmd_info,
    "act": cmd_act,
    "check-parity": cmd_parity,
    "convert": cmd_convert,
}
SHOW = {
    "info": _print_info,
    "act": _print_act,
    "check-parity": _print_parity,
    "convert": _print_convert,
}
