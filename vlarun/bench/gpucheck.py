"""`vlarun bench gpu-check`: one call that times vlarun on one GPU at the real shapes, side by
side with its baselines, and writes ``gpu-check.json`` (with ``gpu-check.log``, its progress
lines, and ``nvidia-smi-q.txt`` where ``nvidia-smi`` exists) under ``--out``. On a bare GPU
machine with this checkout: ``PYTHONPATH=. python3 -m vlarun bench gpu-check --out DIR``.

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

This file is the driver (options, device set-up, the run and its report); the sections are in
``gpucheck_sections.py`` and what they share (``Env``, timing, shapes) in ``gpucheck_env.py``.
"""

from __future__ import annotations

import datetime
import json
import platform
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from vlarun.bench.gpucheck_env import Env, free_memory
from vlarun.bench.gpucheck_sections import SECTION_FNS
from vlarun.config import items, opt

SECTIONS = ("parity", "engine", "policies", "triage", "jacobi", "energy")


@dataclass(frozen=True)
class GpuCheckOptions:
    """One-call GPU check: parity, engine, pi0/CogACT, TRIAGE, Jacobi and energy, as JSON."""

    out: str = opt("results/gpu-check", "folder for gpu-check.json")
    device: str = opt("cuda", "cuda | cuda:N | cpu (cpu needs --quick)")
    quick: bool = opt(False, "tiny shapes, few repetitions: the CPU CI smoke run")
    sections: tuple[str, ...] = opt(SECTIONS, "sections to run")
    dtype: str = opt(
        "auto", "auto (bf16 on CUDA, fp32 on a CPU), bf16 or fp32", choices=["auto", "bf16", "fp32"]
    )
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


def make_env(o: GpuCheckOptions) -> Env:
    from vlarun.models.device import resolve_device

    device = resolve_device(o.device)  # no CUDA here: one line naming what is missing
    if device.type == "cpu" and not o.quick:
        raise ValueError(
            "--device cpu runs only with --quick: the real shapes (7B models with "
            "random weights) take too long and too much memory on a CPU"
        )
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
        info = {
            "type": "cuda",
            "name": torch.cuda.get_device_name(env.device),
            "index": env.device.index,
            "memory_gib": round(p.total_memory / 2**30, 1),
            "capability": f"{p.major}.{p.minor}",
            "multiprocessors": p.multi_processor_count,
            "cuda": torch.version.cuda,
        }
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
    free_memory(env)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    if env.device.type == "cuda":
        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(env.device) / 2**30, 2)
    return out


def run(o: GpuCheckOptions, progress: bool = True) -> dict:
    t0 = time.perf_counter()
    env = make_env(o)
    path = Path(o.out) / "gpu-check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    log_file = (path.parent / "gpu-check.log").open("w")

    def log(message: str) -> None:  # the progress lines, on stderr and in the results folder
        if progress:
            print(message, file=sys.stderr, flush=True)
        log_file.write(message + "\n")
        log_file.flush()

    _nvidia_smi(path.parent / "nvidia-smi-q.txt")
    info = device_info(env)
    result = {
        "benchmark": "gpu-check",
        "ok": True,
        "quick": o.quick,
        "device": info,
        "dtype": env.dtype_name,
        **_versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["vlarun", "bench", "gpu-check", *sys.argv[3:]]),
        "argv": sys.argv,
        "energy_source": env.energy_source,
        "file": str(path),
        "sections": {},
    }
    log(f"gpu-check on {info['name']} ({env.dtype_name}{', quick' if o.quick else ''}) -> {path}")
    for name in items(o.sections):
        spent = time.perf_counter() - t0
        if spent > o.budget_s:
            out = {
                "ok": False,
                "error": f"skipped: {spent:.0f} s spent of the {o.budget_s:g} s budget",
            }
        else:
            out = run_section(env, name)
        result["sections"][name] = out
        failed = not out["ok"] or out.get("passed") is False
        result["ok"] = result["ok"] and not failed
        log(
            f"  {name}: {'ok' if out['ok'] else 'FAILED ' + out.get('error', '')} "
            f"({out.get('seconds', 0):.1f} s)"
        )
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        write(result, path)
    log_file.close()
    return result


def _nvidia_smi(path: Path) -> None:
    """The driver's own description of the GPU (clocks, power limits, ECC), where it exists."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return
    try:
        done = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=30)
        path.write_text(done.stdout + done.stderr)
    except (OSError, subprocess.TimeoutExpired) as e:
        path.write_text(f"nvidia-smi -q failed: {e}\n")


def write(result: dict, path: Path) -> None:
    """Atomically (a cut-short run leaves the last complete file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)


def show(r: dict) -> None:
    d = r["device"]
    quick = ", quick" if r["quick"] else ""
    print(
        f"gpu-check on {d['name']} ({r['dtype']}, torch {r['torch']}{quick}), {r['date']}, "
        f"{r.get('wall_s', 0):.0f} s, energy: {r['energy_source']}"
    )
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
