"""`vlarun bench gpu-check` (run by ``scripts/gpu-check.sh``): one call that times vlarun on one
GPU at the real shapes, side by side with its baselines, and writes ``gpu-check.json``.

Sections, each independent (one that raises records its error and the others still run; the
command then exits non-zero), all with random weights at the presets' shapes:

  parity    vlarun's Llama vs transformers on the same weights on the device: max |logit|
            differences, greedy-token agreement, the bf16 tolerance (``engine.greedy_check``);
  engine    openvla-7b's LM: prefill of 256 visual + 24 text tokens and 7 one-token decode
            steps vs transformers eager (DynamicCache, as ``generate`` uses; StaticCache too)
            and ``generate`` itself; the memory-bandwidth floor of a decode step (weight and
            KV bytes / a device-to-device copy's bandwidth);
  policies  end-to-end latency of pi0 (1 and 3 views, chunk 50, 10 flow steps) and CogACT
            (DiT, 10 DDIM steps) through the stage graph;
  triage    OpenVLA-OFT prefill with ``triage:0.34`` vs full recompute, next to the FLOPs ratio
            of the engine's accounting and of the scheduler's cost model;
  jacobi    openvla-7b action decoding with ``exit:0.5`` (Jacobi + early exit) vs one token at a
            time: tokens/s and the cost of one Jacobi iteration against one decode step;
  energy    joules per inference from NVML's energy counter around the timed loops (CUDA
            only; elsewhere ``energy_source`` says there was no meter, and no number is made).

The GPU-specific code is small: bf16 on CUDA (fp32 on the CPU, where this project's machines
emulate bf16), ``settle`` (a CUDA synchronize) around every timed call, NVML. ``--quick`` runs the
tiny presets and the engine bench's tiny shape: that is what CI runs on the CPU
(``--device cpu --quick``); its numbers describe nothing. The CPU cannot run the real shapes
(a 7B model with random weights), so ``--device cpu`` without ``--quick`` is refused.
``--dtype bf16`` on a CPU runs the GPU's dtype path slowly (emulated), which finds dtype bugs.
The JSON is rewritten after every section, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import itertools
import json
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vlarun.config import items, opt

SECTIONS = ("parity", "engine", "policies", "triage", "jacobi", "energy")
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


@dataclass(frozen=True)
class GpuCheckOptions:
    """One-call GPU check: parity, engine, pi0/CogACT, TRIAGE, Jacobi and energy, as JSON."""

    out: str = opt("results/gpu-check", "folder for gpu-check.json")
    device: str = opt("cuda", "cuda | cuda:N | cpu (cpu needs --quick)")
    quick: bool = opt(False, "tiny shapes, few repetitions: the CPU CI smoke run")
    sections: tuple[str, ...] = opt(SECTIONS, "sections to run")
    dtype: str = opt("auto", "auto (bf16 on CUDA, fp32 on a CPU), bf16 or fp32",
                     choices=["auto", "bf16", "fp32"])  # fmt: skip
    repeats: int = opt(0, "timed repetitions per measurement; 0: 10 (3 with --quick)")
    budget_s: float = opt(420.0, "sections not started within this many seconds are skipped")
    # One thread on a CPU: on a shared CI machine a busy core makes every OpenMP barrier wait a
    # scheduler slice (the quick run took 130 s at 2 threads with one core taken, 20 s at 1).
    threads: int = opt(0, "torch CPU threads; 0: 1 on a CPU run, torch's default on CUDA")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        unknown = [s for s in items(self.sections) if s not in SECTIONS]
        if unknown:
            raise ValueError(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"--dtype must be auto, bf16 or fp32, got {self.dtype!r}")
        if self.repeats < 0 or self.budget_s <= 0 or self.threads < 0:
            raise ValueError("--repeats and --threads must be >= 0 and --budget-s > 0")


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


def make_env(o: GpuCheckOptions) -> Env:
    from vlarun.models.device import resolve_device

    device = resolve_device(o.device)  # no CUDA here: one line naming what is missing
    if device.type == "cpu" and not o.quick:
        raise ValueError("--device cpu runs only with --quick: the real shapes (7B models with "
                         "random weights) take too long and too much memory on a CPU")  # fmt: skip
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if o.threads or not cuda:
        torch.set_num_threads(o.threads or 1)
    meter, source = None, "none (no meter)"
    if cuda:
        from vlarun.sched.meters import NvmlMeter, WindowMeter

        try:
            nvml = NvmlMeter(device.index or 0)
            nvml.energy_joules()
            meter, source = WindowMeter(nvml), "measured (NVML total energy counter, whole board)"
        except Exception as e:  # no nvidia-ml-py, no driver access: say so, invent nothing
            source = f"none (NVML unreadable: {type(e).__name__}: {e})"
    repeats = o.repeats or (3 if o.quick else 10)
    # bf16 on the GPU (its tensor cores' type); fp32 on the CPU, where bf16 is emulated here.
    bf16 = o.dtype == "bf16" or (o.dtype == "auto" and cuda)
    dtype = torch.bfloat16 if bf16 else torch.float32
    return Env(device, dtype, o.quick, repeats, 1 if o.quick else 3, meter, source)


def device_info(env: Env) -> dict:
    """The device's name and what it was measured with (every result file carries this)."""
    if env.device.type == "cuda":
        p = torch.cuda.get_device_properties(env.device)
        info = {"type": "cuda", "name": torch.cuda.get_device_name(env.device),
                "index": env.device.index, "memory_gib": round(p.total_memory / 2**30, 1),
                "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                "cuda": torch.version.cuda}  # fmt: skip
    else:
        from vlarun.bench.engine import machine_info

        m = machine_info()
        info = {"type": "cpu", "name": m["cpu"], "cores": m["cores"], "threads": m["threads"]}
    return info


def _versions() -> dict:
    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = None
    return {"torch": torch.__version__, "transformers": hf, "python": platform.python_version()}


def _free(env: Env) -> None:
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


def _ms(samples: list[float]) -> tuple[float, float]:
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


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------------------------------------
# Sections


def parity(env: Env) -> dict:
    """vlarun vs transformers on the same random weights, on the device, in the check's dtype."""
    from vlarun.bench import engine

    cfg = lm_shape(env)
    hf, ours = engine.build_pair(cfg, env.dtype, device=env.device)
    gen = torch.Generator().manual_seed(engine.SEED + 1)
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT_TOKENS), generator=gen).to(env.device)
    tokens = {}
    for r in (engine.VlarunRunner(ours, PROMPT_TOKENS, DECODE_STEPS),
              engine.HFRunner(hf, False, PROMPT_TOKENS, DECODE_STEPS)):  # fmt: skip
        r.reset()
        tok = r.prefill(ids)
        seq = [int(tok)]
        for i in range(DECODE_STEPS):
            tok = r.step(tok, i)
            seq.append(int(tok))
        tokens[r.name] = seq
    # The prompt's logits, both models in the same dtype, no cache.
    ours_logits = ours.logits(ours(ours.embed(ids)).hidden[:, -1:]).float()
    hf_logits = hf(input_ids=ids, logits_to_keep=1).logits.float()
    same = float((ours_logits - hf_logits).abs().max())
    # Free-running greedy sequences part for good at the first near-tie (common on random
    # weights in bf16), so agreement is also counted teacher-forced: transformers' argmax at
    # each position of vlarun's own sequence against vlarun's token there.
    mine = torch.tensor(tokens["vlarun"], device=env.device)
    seq = torch.cat([ids, mine[None, :-1]], dim=1)
    hf_next = hf(input_ids=seq, logits_to_keep=len(mine)).logits[0].argmax(-1)
    forced = float((hf_next == mine).float().mean())
    check = engine.greedy_check(hf, ours, ids, DECODE_STEPS, env.dtype_name)  # last: casts hf
    std = check["logits_std"]
    a, b = tokens["vlarun"], tokens["hf-dynamic"]
    rule = ("fp32: max |vlarun - fp32 transformers| <= 1e-3 x logit std" if env.dtype_name ==
            "fp32" else "bf16: max |vlarun bf16 - transformers fp32| <= max(1e-3, 1.5 x "
            "|transformers bf16 - transformers fp32|), in logit std")  # fmt: skip
    return {
        "model": "openvla-7b LM (Llama-2-7B)" if not env.quick else "engine tiny shape",
        "params": cfg.num_params(),
        "dtype": env.dtype_name,
        "prompt_tokens": PROMPT_TOKENS,
        "decode_steps": DECODE_STEPS,
        "max_abs_logit_diff_vs_hf_same_dtype": same,
        "max_abs_logit_diff_vs_fp32_reference": check["logits_err_vlarun"] * std,
        "hf_max_abs_logit_diff_vs_fp32_reference": check["logits_err_hf"] * std,
        "tolerance_abs": check["logits_tolerance"] * std,
        "tolerance_rule": rule,
        "within_tolerance": bool(check["tokens_match"]),
        "greedy_tokens_agree": float(np.mean([x == y for x, y in zip(a, b, strict=True)])),
        "greedy_tokens_agree_teacher_forced": forced,
        "greedy_margin_max": check["greedy_margin_max"],
        "logits_std": std,
        "tokens": tokens,
        "passed": bool(check["tokens_match"]),
    }


def _lm_infer(env: Env, runner, ids: torch.Tensor) -> tuple[float, float]:
    """(prefill seconds, decode seconds per step) of one prefill + DECODE_STEPS greedy steps."""
    runner.reset()
    env.sync()
    t0 = time.perf_counter()
    tok = runner.prefill(ids)
    env.sync()
    t1 = time.perf_counter()
    for i in range(DECODE_STEPS):
        tok = runner.step(tok, i)
    env.sync()
    return t1 - t0, (time.perf_counter() - t1) / DECODE_STEPS


def engine_section(env: Env) -> dict:
    """openvla-7b LM prefill and decode, vlarun vs transformers eager, same weights/device."""
    from vlarun.bench import engine

    cfg = lm_shape(env)
    hf, ours = engine.build_pair(cfg, env.dtype, device=env.device)
    gen = torch.Generator().manual_seed(engine.SEED + 1)
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT_TOKENS), generator=gen).to(env.device)
    runners = [engine.VlarunRunner(ours, PROMPT_TOKENS, DECODE_STEPS),
               engine.HFRunner(hf, False, PROMPT_TOKENS, DECODE_STEPS)]  # fmt: skip
    notes = []
    try:
        static = engine.HFRunner(hf, True, PROMPT_TOKENS, DECODE_STEPS)
        _lm_infer(env, static, ids)
        runners.append(static)
    except Exception as e:  # a transformers version whose StaticCache breaks eager use
        notes.append(f"hf-static unavailable: {type(e).__name__}: {e}")
    notes += _add_compiled_runner(env, runners, ours, ids)
    pre: dict[str, list[float]] = {r.name: [] for r in runners}
    dec: dict[str, list[float]] = {r.name: [] for r in runners}
    for rep in range(env.warmup + env.repeats):
        k = rep % len(runners)  # rotate who goes first: drift lands on everyone alike
        for r in runners[k:] + runners[:k]:
            p, d = _lm_infer(env, r, ids)
            if rep >= env.warmup:
                pre[r.name].append(p)
                dec[r.name].append(d)
    for r in runners:
        measure_energy(env, f"engine.{r.name} (prefill + {DECODE_STEPS} steps)",
                       lambda r=r: _lm_infer(env, r, ids))  # fmt: skip
    # transformers' own generate (eager, DynamicCache): the prefill token + DECODE_STEPS more.
    generate_ms = None
    mask = torch.ones_like(ids)
    n_new = DECODE_STEPS + 1

    def generate() -> None:
        hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new,
                    min_new_tokens=n_new, do_sample=False, pad_token_id=0)  # fmt: skip

    try:
        generate_ms = _ms(timed(env, generate, env.repeats, 1))[0]
    except Exception as e:
        notes.append(f"transformers generate failed: {type(e).__name__}: {e}")
    bandwidth = copy_bandwidth_gbs(env)
    nbytes = engine.decode_bytes_per_token(cfg, env.dtype, PROMPT_TOKENS + (DECODE_STEPS + 1) // 2)
    floor_ms = nbytes / (bandwidth * 1e9) * 1e3
    p_ms = {n: _ms(v) for n, v in pre.items()}
    d_ms = {n: _ms(v) for n, v in dec.items()}
    ours_p, ours_d = p_ms["vlarun"][0], d_ms["vlarun"][0]
    eager_p, eager_d = p_ms["hf-dynamic"][0], d_ms["hf-dynamic"][0]
    ours_total = ours_p + DECODE_STEPS * ours_d
    # The goals take vlarun's faster decode: eager, or compiled as CUDA graphs where it ran.
    best = min((n for n in d_ms if n.startswith("vlarun")), key=lambda n: d_ms[n][0])
    best_d = d_ms[best][0]
    return {
        "model": "openvla-7b LM (Llama-2-7B)" if not env.quick else "engine tiny shape",
        "params": cfg.num_params(),
        "dtype": env.dtype_name,
        "prompt_tokens": PROMPT_TOKENS,
        "decode_steps": DECODE_STEPS,
        "repeats": env.repeats,
        "warmup": env.warmup,
        "prefill_ms": {n: v[0] for n, v in p_ms.items()},
        "prefill_ms_p90": {n: v[1] for n, v in p_ms.items()},
        "decode_ms_per_token": {n: v[0] for n, v in d_ms.items()},
        "decode_ms_per_token_p90": {n: v[1] for n, v in d_ms.items()},
        "prefill_speedup_vs_hf_eager": eager_p / ours_p,
        "decode_speedup_vs_hf_eager": eager_d / ours_d,
        "hf_generate_ms": generate_ms,
        "vlarun_prefill_plus_decode_ms": ours_total,
        "speedup_vs_hf_generate": generate_ms / ours_total if generate_ms else None,
        "copy_bandwidth_gbs": bandwidth,
        "bandwidth_how": "device-to-device copy, bytes read + written / time, best of 5",
        "decode_bytes_per_token": nbytes,
        "decode_floor_ms": floor_ms,
        "decode_floor_fraction": floor_ms / ours_d,
        "decode_speedup_best_vs_hf_eager": eager_d / best_d,
        "decode_floor_fraction_best": floor_ms / best_d,
        "goals": {  # the issue's, for a GPU at the real shape
            "decode_runner": best,
            "decode_ge_2x_hf_eager": eager_d / best_d >= 2.0,
            "decode_within_15pct_of_floor": best_d <= floor_ms * 1.15,
            "prefill_ge_1.2x_hf_eager": eager_p / ours_p >= 1.2,
        },
        "notes": notes,
    }


def _add_compiled_runner(env: Env, runners: list, ours, ids) -> list[str]:
    """On CUDA, vlarun's decode step compiled as CUDA graphs (``reduce-overhead``, gpt-fast's
    mode) joins the runners after its compile-and-capture warm-up; returns notes."""
    from vlarun.bench import engine
    from vlarun.models.static_step import compile_steps

    if env.device.type != "cuda":
        return ["compiled decode not timed off CUDA: torch.compile measured no faster on the "
                "project's CPU (BENCHMARKS.md, compile probe)"]  # fmt: skip
    try:
        steps = compile_steps("reduce-overhead")
        runner = engine.VlarunRunner(ours, PROMPT_TOKENS, DECODE_STEPS, steps)
        t0 = time.perf_counter()
        for _ in range(3):  # compile, then CUDA-graph recording, then a replay
            _lm_infer(env, runner, ids)
        runners.append(runner)
        return [f"{runner.name}: compile + capture {time.perf_counter() - t0:.1f} s"]
    except Exception as e:  # a compiler failure must not cost the eager rows
        return [f"compiled decode unavailable: {type(e).__name__}: {e}"]


def policies(env: Env) -> dict:
    """Per-inference latency of pi0 (1 and 3 views) and CogACT on the device."""
    from vlarun.models.presets import get_preset

    names = ("tiny-pi0", "tiny-cogact") if env.quick else ("pi0", "cogact")
    cases = [(names[0], 1), (names[0], 3), (names[1], None)]
    bandwidth = copy_bandwidth_gbs(env) if env.device.type == "cuda" else None
    rows, ok = [], True
    for name, views in cases:
        label = name if views is None else f"{name} ({views} view{'s' * (views > 1)})"
        try:
            cfg = get_preset(name)
            if views is not None:
                cfg = dataclasses.replace(cfg, num_images=views)
            rows.append(_policy_row(env, label, cfg, bandwidth))
        except Exception as e:  # one model failing (memory, say) keeps the others' rows
            rows.append({"policy": label, "error": f"{type(e).__name__}: {e}"})
            ok = False
        _free(env)
    out = {"ok": ok, "rows": rows, "copy_bandwidth_gbs": bandwidth}
    if not ok:
        out["error"] = "; ".join(f"{r['policy']}: {r['error']}" for r in rows if "error" in r)
    return out


def _policy_row(env: Env, label: str, cfg, bandwidth: float | None) -> dict:
    policy = random_policy(cfg, env)
    instruction, image, state = frames(cfg, 1)[0]
    stages: dict[str, list[float]] = {}

    def infer() -> None:
        run = policy.run_stages(image, instruction, state=state)
        for s in run.timings:
            stages.setdefault(s.name, []).append(s.seconds)

    times = timed(env, infer, env.repeats, env.warmup)
    stage_ms = {k: float(np.median(v[-env.repeats :]) * 1e3) for k, v in stages.items()}
    measure_energy(env, f"policies.{label}", infer)
    med, p90 = _ms(times)
    steps = cfg.flow.num_steps if cfg.flow is not None else cfg.dit.ddim_steps
    row = {"policy": label, "family": cfg.family, "views": cfg.num_images,
           "chunk": cfg.horizon, "denoise_steps": steps, "params": _params(policy.model),
           "dtype": env.dtype_name, "text_tokens": TEXT_TOKENS, "latency_ms_median": med,
           "latency_ms_p90": p90, "repeats": env.repeats, "stage_ms_median": stage_ms}  # fmt: skip
    if bandwidth is not None and cfg.family == "flow":
        # openpi's RTX 4090 figures at this GPU's bandwidth: 4090 ms x (1008 GB/s / ours).
        scale = RTX4090_GBS / bandwidth
        triton = OPENPI_4090_MS["triton_1_view" if cfg.num_images == 1 else "triton_3_views"]
        row["openpi_scaled_ms"] = {"jax": OPENPI_4090_MS["jax"] * scale, "triton": triton * scale}
        row["ratio_to_openpi_scaled"] = {k: med / v for k, v in row["openpi_scaled_ms"].items()}
        row["openpi_scaling"] = (f"published RTX 4090 ms x {RTX4090_GBS:g} GB/s (4090 spec) / "
                                 f"{bandwidth:.0f} GB/s (this GPU's measured copy)")  # fmt: skip
    return row


def triage(env: Env) -> dict:
    """OFT prefill time with TRIAGE at B = 34% vs full recompute, and the FLOPs ratios."""
    from vlarun.bench.replay import interleaved_runs
    from vlarun.models.presets import get_preset
    from vlarun.policy.accelerated import AcceleratedPolicy
    from vlarun.policy.setting import AccelSetting, accelerated_with
    from vlarun.sched.cost import stage_works
    from vlarun.sched.plans import Setting, apply_setting
    from vlarun.stages.families import Workload

    cfg = get_preset("tiny-openvla-oft" if env.quick else "openvla-oft")
    base = random_policy(cfg, env)
    setting = AccelSetting.parse(f"triage:{BUDGET}")
    full, fast = AcceleratedPolicy(base), accelerated_with(base, setting)
    # The first query of an episode recomputes every token; the steady ones are reported.
    runs = interleaved_runs([full, fast], frames(cfg, env.repeats + 1), warmup=2)
    stage = "prefill_head" if cfg.family == "parallel" else "prefill"
    full_ms = [t.seconds * 1e3 for run in runs[0][1:] for t in run.timings if t.name == stage]
    fast_ms = [t.seconds * 1e3 for run in runs[1][1:] for t in run.timings if t.name == stage]
    ratio = statistics.median(fast_ms) / statistics.median(full_ms)
    executed = float(np.mean([s.flops_ratio for s in fast.steps[1:]]))
    w = Workload(1, len(base.text_ids(INSTRUCTION)), "bfloat16")
    works = {x.name: x for x in stage_works(cfg, w)}
    cut = {x.name: x for x in apply_setting(tuple(works.values()), cfg, w,
                                           Setting((("token_budget", BUDGET),), None))}  # fmt: skip
    model_ratio = cut[stage].flops / works[stage].flops
    for label, p in (("full", full), (str(setting), fast)):
        p.reset()
        measure_energy(env, f"triage.{label}", replayer(p, frames(cfg, 8)))
    return {
        "model": cfg.name,
        "stage": stage,
        "setting": str(setting),
        "dtype": env.dtype_name,
        "queries_steady": len(fast_ms),
        "prefill_ms_full": statistics.median(full_ms),
        "prefill_ms_triage": statistics.median(fast_ms),
        "prefill_time_ratio": ratio,
        "flops_ratio_executed": executed,
        "flops_ratio_cost_model": model_ratio,
        # the goal, for a GPU at the real shape
        "goal_time_ratio_le_flops_ratio_plus_0.10": ratio <= model_ratio + 0.10,
        "paper": "TRIAGE B = 34%: 0.52x prefill on a Jetson Orin",
    }


def replayer(policy, stream: list) -> Callable[[], object]:
    """A call running ``policy`` on the next query of ``stream`` (cycled), for energy loops."""
    queue = itertools.cycle(stream)

    def call():
        instruction, image, state = next(queue)
        return policy.run_stages(image, instruction, state=state)

    return call


def jacobi(env: Env) -> dict:
    """Action decoding of openvla-7b: Jacobi + early exit (``exit:0.5``) vs one token at a
    time, on the same replayed queries. Random weights: the per-iteration cost is what holds for
    a trained or distilled model too (its iteration count is what distillation changes)."""
    from vlarun.bench.replay import interleaved_runs
    from vlarun.models.presets import get_preset
    from vlarun.policy.setting import AccelSetting, accelerated_with

    cfg = get_preset("tiny-openvla" if env.quick else "openvla-7b")
    base = random_policy(cfg, env)
    ar = accelerated_with(base, AccelSetting())
    setting = AccelSetting.parse(f"exit:{EXIT_SIGMA}")
    ex = accelerated_with(base, setting)
    runs = interleaved_runs([ar, ex], frames(cfg, env.repeats), warmup=2)
    n = cfg.num_action_tokens

    def decode_s(policy_runs) -> list[float]:
        return [next(t.seconds for t in r.timings if t.name == "decode") for r in policy_runs]

    ar_s, ex_s = decode_s(runs[0]), decode_s(runs[1])
    iters = ex.decoder.summary()
    ar_step_ms = statistics.mean(ar_s) * 1e3 / max(n - 1, 1)  # n - 1 forwards after the prefill
    iter_ms = statistics.mean(ex_s) * 1e3 / iters["iterations_mean"]
    agree = [float((a.outputs["action_ids"] == b.outputs["action_ids"]).float().mean())
             for a, b in zip(runs[0], runs[1], strict=True)]  # fmt: skip
    for label, p in (("ar", ar), (str(setting), ex)):
        measure_energy(env, f"jacobi.{label}", replayer(p, frames(cfg, 8)))
    return {
        "model": cfg.name,
        "setting": str(setting),
        "dtype": env.dtype_name,
        "action_tokens": n,
        "queries": len(ex_s),
        "ar_tokens_per_s": statistics.mean(n / s for s in ar_s),
        "jacobi_exit_tokens_per_s": statistics.mean(n / s for s in ex_s),
        "speedup": statistics.mean(ar_s) / statistics.mean(ex_s),
        "ar_decode_ms": statistics.mean(ar_s) * 1e3,
        "jacobi_exit_decode_ms": statistics.mean(ex_s) * 1e3,
        "iterations_mean": iters["iterations_mean"],
        "exited_fraction": iters["exited_fraction"],
        "ar_step_ms": ar_step_ms,
        "jacobi_iteration_ms": iter_ms,
        "iteration_cost_ratio": iter_ms / ar_step_ms,
        "goal_iteration_cost_ratio_le_1.2": iter_ms / ar_step_ms <= 1.2,  # on a GPU, at 7B
        "token_agreement_with_ar": statistics.mean(agree),
        "note": "random weights: no distilled student; the iteration count is not the paper's",
    }


def energy(env: Env) -> dict:
    """Joules per inference measured in the sections before (NVML on CUDA), or why none."""
    out: dict = {"energy_source": env.energy_source}
    if env.device.type == "cuda" and env.meter is None:
        return out | {"ok": False, "error": f"no energy on CUDA: {env.energy_source}"}
    if env.meter is not None:
        out["how"] = env.meter.how
        out["joules_per_inference"] = dict(env.joules)
        if env.energy_errors:
            out |= {"ok": False, "error": "; ".join(env.energy_errors)}
        out["note"] = "whole-board energy over >= 3 calls and ~1 s, per call; idle power included"
    return out


SECTION_FNS: dict[str, Callable[[Env], dict]] = {
    "parity": parity,
    "engine": engine_section,
    "policies": policies,
    "triage": triage,
    "jacobi": jacobi,
    "energy": energy,
}


# ---------------------------------------------------------------------------------------------
# Driver


def run_section(env: Env, name: str) -> dict:
    """One section: its result with ``ok`` and ``seconds``, or its error (never raises)."""
    t0 = time.perf_counter()
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    try:
        with torch.no_grad():
            out = {"ok": True} | SECTION_FNS[name](env)
    except Exception as e:
        tail = traceback.format_exc().strip().splitlines()[-8:]
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": tail}
    _free(env)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    if env.device.type == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(env.device) / 2**30, 2)
    return out


def run(o: GpuCheckOptions, progress: bool = True) -> dict:
    t0 = time.perf_counter()
    env = make_env(o)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    path = Path(o.out) / "gpu-check.json"
    info = device_info(env)
    result = {
        "benchmark": "gpu-check",
        "ok": True,
        "quick": o.quick,
        "device": info,
        "dtype": env.dtype_name,
        **_versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": os.environ.get("VLARUN_GPU_CHECK_COMMAND")
        or shlex.join(["vlarun", "bench", "gpu-check", *sys.argv[3:]]),
        "argv": sys.argv,
        "energy_source": env.energy_source,
        "file": str(path),
        "sections": {},
    }
    log(f"gpu-check on {info['name']} ({env.dtype_name}{', quick' if o.quick else ''}) -> {path}")
    for name in items(o.sections):
        spent = time.perf_counter() - t0
        if spent > o.budget_s:
            out = {"ok": False, "error": f"skipped: {spent:.0f} s spent of the {o.budget_s:g} s "
                   "budget"}  # fmt: skip
        else:
            out = run_section(env, name)
        result["sections"][name] = out
        failed = not out["ok"] or out.get("passed") is False
        result["ok"] = result["ok"] and not failed
        log(f"  {name}: {'ok' if out['ok'] else 'FAILED ' + out.get('error', '')} "
            f"({out.get('seconds', 0):.1f} s)")  # fmt: skip
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        write(result, path)
    return result


def write(result: dict, path: Path) -> None:
    """Atomically (a cut-short run leaves the last complete file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)


def show(r: dict) -> None:
    d = r["device"]
    quick = ", quick" if r["quick"] else ""
    print(f"gpu-check on {d['name']} ({r['dtype']}, torch {r['torch']}{quick}), {r['date']}, "
          f"{r.get('wall_s', 0):.0f} s, energy: {r['energy_source']}")  # fmt: skip
    s = r["sections"]
    for name, out in s.items():
        if not out["ok"] and "error" in out:
            print(f"  {name}: FAILED {out['error']}")
            continue
        print(f"  {name}: {_summary(name, out)} ({out['seconds']:.1f} s)")
    print(f"written: {r['file']}")


def _summary(name: str, x: dict) -> str:
    if name == "parity":
        return (
            f"max |logit diff| {x['max_abs_logit_diff_vs_fp32_reference']:.3g} vs fp32 ref "
            f"(tolerance {x['tolerance_abs']:.3g}), greedy agreement "
            f"{x['greedy_tokens_agree']:.0%} free-running, "
            f"{x['greedy_tokens_agree_teacher_forced']:.0%} teacher-forced, "
            f"{'pass' if x['passed'] else 'FAIL'}"
        )
    if name == "engine":
        p, d = x["prefill_ms"], x["decode_ms_per_token"]
        return (
            f"prefill {p['vlarun']:.1f} ms vs HF {p['hf-dynamic']:.1f} "
            f"(x{x['prefill_speedup_vs_hf_eager']:.2f}); decode {d['vlarun']:.2f} ms/token vs "
            f"HF {d['hf-dynamic']:.2f} (x{x['decode_speedup_vs_hf_eager']:.2f}), floor "
            f"{x['decode_floor_ms']:.2f} ms ({x['decode_floor_fraction']:.0%})"
        )
    if name == "policies":
        return "; ".join(
            f"{row['policy']} {row['latency_ms_median']:.1f} ms"
            if "error" not in row
            else f"{row['policy']} FAILED {row['error']}"
            for row in x["rows"]
        )
    if name == "triage":
        return (
            f"prefill {x['prefill_ms_triage']:.1f} / {x['prefill_ms_full']:.1f} ms = "
            f"{x['prefill_time_ratio']:.2f}x; FLOPs {x['flops_ratio_cost_model']:.2f}x (cost "
            f"model), {x['flops_ratio_executed']:.2f}x (executed)"
        )
    if name == "jacobi":
        return (
            f"{x['jacobi_exit_tokens_per_s']:.0f} vs {x['ar_tokens_per_s']:.0f} tokens/s "
            f"(x{x['speedup']:.2f}), {x['iterations_mean']:.2f} iterations, one iteration "
            f"{x['iteration_cost_ratio']:.2f}x a decode step"
        )
    if name == "energy":
        j = x.get("joules_per_inference", {})
        return x["energy_source"] + "".join(f"; {k} {v:.2f} J" for k, v in j.items())
    return ""


OPTIONS = {"bench-gpu-check": GpuCheckOptions}
RUN = {"bench-gpu-check": run}
SHOW = {"bench-gpu-check": show}
