"""What the sections of `vlarun bench gpu-check` share (``gpucheck.py`` is the driver,
``gpucheck_sections.py`` the sections): the device and dtype they run on with its
synchronisation and energy meter (``Env``), timing and energy helpers, and the shapes,
prompts and random-weight policies they measure."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

PROMPT_TOKENS = 280  # OpenVLA: 256 visual tokens + ~24 text tokens
DECODE_STEPS = 7  # one-token steps after the prefill (OpenVLA: 7 action tokens)
TEXT_TOKENS = 24  # the instruction's tokens in the policy sections (see PromptTokens)
BUDGET = 0.34  # TRIAGE's fraction of visual tokens recomputed (the paper's Table I)
EXIT_SIGMA = 0.5
INSTRUCTION = "put the red block in the drawer"
# openpi's published pi0 inference times on an RTX 4090 (the goal), and that card's
# specified memory bandwidth, to scale them by this GPU's measured copy bandwidth.
OPENPI_4090_MS = {"jax": 73.0, "triton_1_view": 20.0, "triton_3_views": 37.0}
RTX4090_GBS = 1008.0


# ---------------------------------------------------------------------------------------------
# Where it runs: device, dtype, synchronisation, the energy meter


@dataclass
class Env:
    """What every section shares. ``sync`` waits for the device (``settle``: a no-op on the
    CPU); ``joules`` collects joules per inference by label (empty without a meter)."""

    device: torch.device
    dtype: torch.dtype
    quick: bool
    repeats: int
    warmup: int
    meter: object | None  # sched.meters.WindowMeter
    energy_source: str
    joules: dict[str, float] = field(default_factory=dict)
    energy_errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._probe = torch.zeros(1, device=self.device)

    def sync(self) -> None:
        from vlarun.models.device import settle

        settle([self._probe])

    @property
    def dtype_name(self) -> str:
        return "bf16" if self.dtype == torch.bfloat16 else "fp32"


def free_memory(env: Env) -> None:
    gc.collect()
    if env.device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Timing and energy helpers


def timed(env: Env, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones, the device
    synchronised before and after each call (a GPU call is timed to its end, not its launch)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        env.sync()
        t0 = time.perf_counter()
        fn()
        env.sync()
        out.append(time.perf_counter() - t0)
    return out


def measure_energy(env: Env, label: str, fn: Callable[[], object]) -> None:
    """Joules per call of ``fn`` into ``env.joules[label]``: NVML's counter read around at
    least 3 calls and about a second (the counter's steps are coarse for one short call).
    Nothing is recorded without a meter."""
    if env.meter is None:
        return
    try:
        env.sync()
        token, t0, n = env.meter.start(), time.perf_counter(), 0
        while n < 3 or (time.perf_counter() - t0 < 1.0 and n < 50):
            fn()
            n += 1
        env.sync()
        env.joules[label] = env.meter.stop(token) / n
    except Exception as e:  # a meter (or a call) failing here must not cost the timings
        env.energy_errors.append(f"{label}: {type(e).__name__}: {e}")


def copy_bandwidth_gbs(env: Env) -> float:
    """Device memory bandwidth: a large device-to-device copy, bytes read + written per second
    (best of 5 after a warm-up). 4 GiB on a GPU (~2 ms on an H200: the synchronisation around
    it is ~1% of that), 256 MiB on a CPU (far beyond L3)."""
    n = 2**32 if env.device.type == "cuda" else 2**28
    src = torch.ones(n, dtype=torch.uint8, device=env.device)
    dst = torch.empty_like(src)
    best = min(timed(env, lambda: dst.copy_(src), 5, 1))
    return 2 * n / best / 1e9


def ms_stats(samples: list[float]) -> tuple[float, float]:
    """(median, p90) of seconds, in milliseconds."""
    arr = np.asarray(samples) * 1e3
    return float(np.median(arr)), float(np.percentile(arr, 90))


# ---------------------------------------------------------------------------------------------
# Models with random weights, built on the device


def lm_shape(env: Env):
    """openvla-7b's LM (Llama-2-7B), or the engine bench's tiny shape with --quick."""
    from vlarun.bench.engine import SHAPES
    from vlarun.models.presets import get_preset

    return SHAPES["tiny"] if env.quick else get_preset("openvla-7b").llm


class PromptTokens:
    """A tokenizer for random-weight policies giving every prompt ``n`` ids (the prompt's bytes,
    cycled), so the prefix has OpenVLA's ~24 text tokens rather than the byte-level fallback's
    ~60, which pi0's 48-token limit refuses."""

    def __init__(self, vocab_size: int, n: int = TEXT_TOKENS) -> None:
        self.vocab_size, self.n = vocab_size, n

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8") or b" "
        return [3 + data[i % len(data)] % (self.vocab_size - 3) for i in range(self.n)]


def random_policy(cfg, env: Env):
    """``Policy.from_preset`` for a config (pi0 at 1 view is no preset), built on the device:
    its initialisers run there (a 7B model's take minutes on a CPU), then it is cast to the
    check's dtype and moved there as a whole (buffers made on the host included)."""
    from vlarun.models.action_tokens import ProprioNorm
    from vlarun.models.vla import VLA
    from vlarun.policy.base import Policy

    torch.manual_seed(0)
    with torch.device(env.device):
        model = VLA(cfg)
    model = model.to(env.device, env.dtype).eval()
    d = cfg.proprio_dim
    proprio = ProprioNorm((0.0,) * d, (1.0,) * d) if d else None
    return Policy(model, PromptTokens(cfg.llm.vocab_size), None, proprio)


def frames(cfg, n: int) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """``n`` (instruction, views, state) queries of a slowly changing scene: a random
    background per view with a block moving down (TRIAGE sees a few tokens change per step)."""
    rng = np.random.default_rng(0)
    s, v = cfg.image_size, cfg.num_images
    bg = rng.integers(0, 255, (v, s, s, 3), dtype=np.uint8)
    state = np.zeros(cfg.state_dim, np.float32) if cfg.state_dim else None
    out = []
    for t in range(n):
        f = bg.copy()
        y = (t * s // 40) % (s * 3 // 4)
        f[:, y : y + s // 5, s // 4 : s // 2] = 255
        out.append((INSTRUCTION, f[0] if v == 1 else f, state))
    return out


def param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
