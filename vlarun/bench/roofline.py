"""`vlarun bench roofline`: how far each stage of a policy's inference is from this machine's
limits, eager and with the compiled static steps, side by side.

Per stage of the policy's stage graph (vision, prefill, then decode / denoise, or OFT's
prefill_head):

* FLOPs and bytes moved: the cost model's (``sched.cost.stage_works``, what ``vlarun info
  --model P --text-tokens N --dtype D`` prints), at the example prompt's length;
* measured: the stage's wall time inside ``Policy.run_stages`` (``GraphRun.timings``: the path
  ``predict`` takes), the median of ``--repeats`` rounds after one warm-up round;
* this machine: the matmul peak of the policy's dtype and the memory read bandwidth of the
  engine benchmark's ``MachineProbe`` (the faster of ``torch.mm`` and prepacked oneDNN on a
  2048^3 GEMM; a sum over 256 MiB), sampled once per round so it sees the machine the policy
  saw;
* roofline time = max(FLOPs / peak, bytes / bandwidth): ``sched.cost.roofline`` on this
  machine at efficiency 1 and no dispatch overhead; the ratio measured / roofline (1 = at the
  limit), per stage and end to end (``run_stages``' wall time over the stages' roofline sum).

Compiled: the same model with ``static_step.compile_steps(mode, denoise=True)`` swapped in
(inductor with freezing, as ``vlarun bench compile`` measures it): the AR decode step, a DiT
denoising step, a flow expert's step and every family's prefill (``prefill_forward``, the
prefix padded to ``vla.PREFILL_BUCKET``) run compiled. Vision and OFT's head pass have no
compiled path: they say "eager only" (the compiled run's end-to-end time still includes them,
run eagerly). ``Policy.load(..., compile_steps=MODE)`` leaves the denoising eager on a
CPU, where it measured no faster. Eager and compiled take turns within each round.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

from vlarun.config import POLICY_FLAGS_RETIRED, POLICY_HELP, opt
from vlarun.models.static_step import COMPILE_MODES, FUSED

# The stage whose work a compiled static step does, by family (static_step.DecodeSteps).
COMPILED_STEP = {
    ("autoregressive", "prefill"): "static_step.prefill_forward",
    ("diffusion", "prefill"): "static_step.prefill_forward",
    ("flow", "prefill"): "static_step.prefill_forward",
    # OFT's one stage: the prefill compiled, the parallel head pass eager (general forward).
    ("parallel", "prefill_head"): "static_step.prefill_forward (the head pass eager)",
    ("autoregressive", "decode"): "static_step.decode_one",
    ("diffusion", "denoise"): "static_step.dit_eps",
    ("flow", "denoise"): "static_step.expert_forward",
}
EAGER_ONLY = "eager only"


@dataclass(frozen=True)
class BenchRooflineOptions:
    """Per stage of a policy's inference: FLOPs, bytes, measured time, GFLOP/s and GB/s
    against this machine's measured matmul peak and memory bandwidth, and the ratio to the
    roofline, eager and compiled side by side."""

    policy: str = opt("mt10p-ar", POLICY_HELP, replaces=POLICY_FLAGS_RETIRED)
    repeats: int = opt(15, "timed rounds after one warm-up round (median reported)")
    threads: int = opt(0, "torch threads (0: torch's default, one per core)")
    dtype: str = opt("float32", "compute dtype", choices=["float32", "bfloat16"])
    llm_layers: int = opt(
        0,
        "a preset's LM at this many of its decoder layers (0: all), each layer's shape "
        "unchanged: the prefill of a model too large for this machine, per layer",
    )
    setting: str = opt(
        "",
        "accelerator setting to run under (e.g. int8, triage:0.34; empty: the plain policy); "
        "the roofline stays the full-compute model's, so the ratio shows what it saves",
    )
    compiled: bool = opt(True, "also time the compiled static steps where a stage has them")
    compile_mode: str = opt(
        FUSED,
        "torch.compile mode of the steps (fused: the CPU's, static_step.FUSED_OPTIONS)",
        choices=COMPILE_MODES,
    )
    plot: str | None = opt(None, "write a bar chart of measured vs roofline per stage here")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.setting:
            from vlarun.policy.setting import AccelSetting

            AccelSetting.parse(self.setting)  # a bad setting fails before anything loads
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {self.repeats}")
        if self.threads < 0:
            raise ValueError(f"--threads must be >= 0, got {self.threads}")
        if self.llm_layers < 0:
            raise ValueError(f"--llm-layers must be >= 0, got {self.llm_layers}")


def machine_device(peak_gflops: float, gbs: float, dtype: str):
    """This machine as the cost model's ``Device``: the measured peak (for ``dtype`` only) and
    bandwidth, at efficiency 1 and no dispatch overhead, so that ``sched.cost.roofline`` is the
    bare roofline. Memory size and power are not read here (nothing is placed)."""
    from vlarun.machine import cpu_name
    from vlarun.sched.catalog import Device

    tflops = peak_gflops / 1e3
    return Device(
        "measured",
        cpu_name(),
        "host",
        bf16_tflops=tflops,
        int8_tops=0.0,
        fp32_tflops=tflops,
        mem_bw_gbs=gbs,
        mem_gb=1.0,
        idle_w=0.0,
        busy_w=0.0,
        compute_eff=1.0,
        memory_eff=1.0,
        dtypes=(dtype,),
    )


def achieved(flops: float, nbytes: float, ms: float, roofline_ms: float) -> dict:
    """One measured time against its work and roofline: GFLOP/s, GB/s and measured / roofline."""
    s = ms / 1e3
    return {"ms": ms, "gflops": flops / s / 1e9, "gbs": nbytes / s / 1e9, "ratio": ms / roofline_ms}


@contextlib.contextmanager
def _steps(model, steps):
    """``model`` running ``steps`` (compiled or eager) inside the block, under inductor's
    freezing (weights as constants, as ``bench compile`` compiles them)."""
    import torch._inductor.config as inductor_config

    before = model.steps
    model.steps = steps
    try:
        with inductor_config.patch(freezing=True):
            yield
    finally:
        model.steps = before


def _round(policy, obs: dict) -> tuple[float, dict[str, float], object]:
    """One ``run_stages``: (wall ms, {stage: ms}, actions)."""
    t0 = time.perf_counter()
    run = policy.run_stages(obs["image"], obs["instruction"], state=obs["state"])
    wall = (time.perf_counter() - t0) * 1e3
    return wall, {t.name: t.seconds * 1e3 for t in run.timings}, run.outputs["actions"]


def measure(policy, obs: dict, repeats: int, compiled_steps=None) -> dict:
    """Per-variant median wall and stage ms over ``repeats`` rounds after a warm-up round,
    the probe's medians, the compile time and the actions' largest eager-compiled gap."""
    import torch

    from vlarun.bench.engine import MachineProbe

    variants = {"eager": contextlib.nullcontext}
    if compiled_steps is not None:
        variants["compiled"] = lambda: _steps(policy.model, compiled_steps)
    probe = MachineProbe(policy.model.dtype)
    walls: dict[str, list[float]] = {v: [] for v in variants}
    stages: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    compile_s, actions = None, {}
    for r in range(repeats + 1):
        probe.sample(keep=r > 0)
        names = list(variants)
        for v in names[r % len(names) :] + names[: r % len(names)]:  # take turns going first
            t0 = time.perf_counter()
            with variants[v]():
                wall, per_stage, actions[v] = _round(policy, obs)
            if r == 0 and v == "compiled":  # its first call compiles every step's graph
                compile_s = time.perf_counter() - t0
            if r:  # the first round warms both
                walls[v].append(wall)
                for name, ms in per_stage.items():
                    stages[v].setdefault(name, []).append(ms)
    gap = None
    if "compiled" in actions:
        gap = float((actions["eager"] - actions["compiled"]).abs().max())
    return {
        "wall_ms": {v: statistics.median(w) for v, w in walls.items()},
        "stage_ms": {v: {n: statistics.median(x) for n, x in s.items()} for v, s in stages.items()},
        "peak_gflops": probe.peak,
        "peak_gflops_torch_mm": statistics.median(probe.gflops_mm),
        "peak_gflops_onednn": statistics.median(probe.gflops_onednn),
        "bandwidth_gbs": statistics.median(probe.gbs),
        "compile_s": compile_s,
        "max_action_diff": gap,
        "threads": torch.get_num_threads(),
    }


def report(policy, o: BenchRooflineOptions, m: dict, text_tokens: int) -> dict:
    """The roofline table of ``policy`` from its measurements ``m`` (``measure``'s output)."""
    import torch

    from vlarun.machine import cpu_features, cpu_summary
    from vlarun.sched.cost import roofline, stage_works
    from vlarun.stages.families import Workload

    cfg, dtype = policy.model.cfg, o.dtype
    device = machine_device(m["peak_gflops"], m["bandwidth_gbs"], dtype)
    works = stage_works(cfg, Workload(1, text_tokens, dtype))
    timed = list(m["stage_ms"]["eager"])
    if timed != [w.name for w in works]:  # the graph that ran is the one costed
        raise RuntimeError(f"stages run {timed} differ from the costed {[w.name for w in works]}")
    compiled = "compiled" in m["wall_ms"]
    rows = []
    for w in works:
        line = roofline(w, device, dtype)
        roof_ms = max(line.compute_s, line.memory_s) * 1e3
        step = COMPILED_STEP.get((cfg.family, w.name))
        comp = None
        if compiled and step is not None:
            comp = achieved(w.flops, w.bytes, m["stage_ms"]["compiled"][w.name], roof_ms)
        rows.append(
            {
                "name": w.name,
                "flops": w.flops,
                "bytes": w.bytes,
                "passes": w.passes,
                "roofline_ms": roof_ms,
                "bound": "compute" if line.compute_s >= line.memory_s else "memory",
                "compiled_step": step or EAGER_ONLY,
                "eager": achieved(w.flops, w.bytes, m["stage_ms"]["eager"][w.name], roof_ms),
                "compiled": comp,
            }
        )
    flops, nbytes = sum(w.flops for w in works), sum(w.bytes for w in works)
    roof = sum(r["roofline_ms"] for r in rows)
    total = {
        v: achieved(flops, nbytes, ms, roof) | {"stages_ms": sum(m["stage_ms"][v].values())}
        for v, ms in m["wall_ms"].items()
    }
    end = {
        "flops": flops,
        "bytes": nbytes,
        "roofline_ms": roof,
        "eager": total["eager"],
        "compiled": total.get("compiled"),
    }
    comp = {
        "mode": o.compile_mode if o.compiled else None,
        "ran": compiled,
        "compile_s": m["compile_s"],
        "max_action_diff": m["max_action_diff"],
    }
    if not o.compiled:
        comp["note"] = "not asked (--no-compiled)"
    elif not compiled:
        comp["note"] = f"eager only: no stage of the {cfg.family} family has a compiled step"
    else:
        steps = ", ".join(r["compiled_step"] for r in rows if r["compiled"] is not None)
        comp["note"] = f"compiled: {steps}; every other stage eager only"
    return {
        "policy": o.policy,
        "setting": o.setting or "plain",
        "llm_layers": cfg.llm.num_layers,
        # The preset's own depth where --llm-layers cut it (None: the whole model ran).
        "llm_layers_of": _preset_layers(o.policy) if o.llm_layers else None,
        "model": cfg.name,
        "family": cfg.family,
        "dtype": dtype,
        "text_tokens": text_tokens,
        "threads": m["threads"],
        "repeats": o.repeats,
        "cpu": cpu_summary(),
        "cpu_features": cpu_features(),
        "peak_gflops": m["peak_gflops"],
        "peak_gflops_torch_mm": m["peak_gflops_torch_mm"],
        "peak_gflops_onednn": m["peak_gflops_onednn"],
        "bandwidth_gbs": m["bandwidth_gbs"],
        "compile": comp,
        "stages": rows,
        "end_to_end": end,
        "timing_scope": "Policy.run_stages on the policy's example observation, warm, median",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
    }


def _preset_layers(name: str) -> int:
    from vlarun.models.presets import get_preset

    return get_preset(name).llm.num_layers


def run(o: BenchRooflineOptions) -> dict:
    import torch

    from vlarun.extras import require
    from vlarun.models.device import bf16_is_fast
    from vlarun.models.static_step import compile_steps
    from vlarun.policy.base import Policy

    if o.plot:
        require("matplotlib")  # before minutes of timing, not after
    before = torch.get_num_threads()
    if o.threads:
        torch.set_num_threads(o.threads)
    try:
        if o.llm_layers:
            from vlarun.models.presets import PRESETS

            if o.policy not in PRESETS:
                raise ValueError(f"--llm-layers takes a preset (random weights), not {o.policy}")
            dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[o.dtype]
            policy = Policy.from_preset(o.policy, dtype=dtype, llm_layers=o.llm_layers)
        else:
            policy = Policy.load(o.policy, o.dtype)  # an unknown name fails here, in one line
        if o.setting:
            policy = policy.with_setting(o.setting)
        if o.dtype == "bfloat16" and not bf16_is_fast():  # the probe alone would take minutes
            raise ValueError(
                "this CPU emulates bf16 (~100x slower than fp32 matmuls): time --dtype float32 here"
            )
        obs = policy.example_observation()
        try:
            text_tokens = len(policy.text_ids(obs["instruction"], obs["state"]))
        except ValueError:
            # A preset's byte-level tokenizer spells the example instruction in more tokens
            # than the model takes (OpenVLA: 62 against 48); its template alone still fits, and
            # the report says how many text tokens the prefill had.
            obs = policy.example_observation(instruction="")
            text_tokens = len(policy.text_ids(obs["instruction"], obs["state"]))
        has_step = policy.model.cfg.family in {f for f, _ in COMPILED_STEP}
        steps = compile_steps(o.compile_mode, denoise=True) if o.compiled and has_step else None
        m = measure(policy, obs, o.repeats, steps)
    finally:
        torch.set_num_threads(before)
    r = report(policy, o, m, text_tokens)
    if o.plot:
        plot(r, o.plot)
        r["plot"] = o.plot
    return r


def plot(r: dict, path: str) -> None:
    """Bars per stage (and end to end): roofline, eager and compiled ms, on a log axis (the
    gaps are factors)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [*r["stages"], {"name": "end to end", **r["end_to_end"]}]
    series = {
        "roofline": [x["roofline_ms"] for x in rows],
        "eager": [x["eager"]["ms"] for x in rows],
    }
    if r["compile"]["ran"]:  # a stage without a compiled step has no bar there
        series["compiled"] = [x["compiled"]["ms"] if x["compiled"] else np.nan for x in rows]
    x, width = np.arange(len(rows)), 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(1.8 * len(rows) + 2, 4))
    for i, (label, ms) in enumerate(series.items()):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, ms, width, label=label)
        if label != "roofline":  # each measured bar says how far above its roofline it is
            ratios = [
                f"{m / roof:.1f}x" if m == m else ""
                for m, roof in zip(ms, series["roofline"], strict=True)
            ]
            ax.bar_label(bars, ratios, fontsize=7)
    ax.set_xticks(x, [row["name"] for row in rows])
    ax.set_yscale("log")
    ax.set_ylabel("ms per inference")
    ax.set_title(f"{r['policy']} {r['dtype']}, {r['threads']} threads: {r['cpu']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def show(r: dict) -> None:
    comp = r["compile"]
    model = "" if r["model"] == r["policy"] else f"{r['model']}, "
    setting = "" if r.get("setting", "plain") == "plain" else f" under {r['setting']}"
    if r.get("llm_layers_of"):
        setting += f" ({r['llm_layers']} of its {r['llm_layers_of']} LM layers)"
    print(
        f"{r['policy']}{setting} ({model}{r['family']}), {r['dtype']}, {r['threads']} threads, "
        f"median of {r['repeats']}, {r['date']}, torch {r['torch']}"
    )
    print(f"CPU: {r['cpu']}")
    print(
        f"machine: {r['dtype']} matmul peak {r['peak_gflops']:.1f} GFLOP/s (torch.mm "
        f"{r['peak_gflops_torch_mm']:.1f}, oneDNN {r['peak_gflops_onednn']:.1f}), read "
        f"bandwidth {r['bandwidth_gbs']:.1f} GB/s"
    )
    head = ("stage", "GFLOP", "GB", "roof ms", "bound", "eager ms", "GFLOP/s", "GB/s", "x roof")
    line = "{:<13}{:>8}{:>8}{:>9}{:>9} |{:>10}{:>9}{:>7}{:>8}"
    column = comp["mode"] is not None  # asked for: every stage says what it got
    print(line.format(*head) + (" | compiled ms  GFLOP/s   GB/s  x roof" if column else ""))
    end = {"name": "end to end", "bound": "", "compiled_step": EAGER_ONLY, **r["end_to_end"]}
    rows = [*r["stages"], end]
    for x in rows:
        e, c = x["eager"], x["compiled"]
        text = line.format(
            x["name"],
            f"{x['flops'] / 1e9:.3f}",
            f"{x['bytes'] / 1e9:.3f}",
            f"{x['roofline_ms']:.2f}",
            x["bound"],
            f"{e['ms']:.2f}",
            f"{e['gflops']:.1f}",
            f"{e['gbs']:.1f}",
            f"{e['ratio']:.1f}x",
        )
        if column and c is not None:
            text += f" | {c['ms']:>11.2f}{c['gflops']:>9.1f}{c['gbs']:>7.1f}{c['ratio']:>7.1f}x"
        elif column:
            text += f" | {EAGER_ONLY:>11}"
        print(text)
    print(
        f"end to end is Policy.run_stages' wall time; the stages sum to "
        f"{end['eager']['stages_ms']:.2f} ms eager"
    )
    print(comp["note"])
    if comp["ran"]:
        print(
            f"torch.compile mode {comp['mode']!r}: first call {comp['compile_s']:.1f} s; "
            f"actions differ from eager by at most {comp['max_action_diff']:.2e}"
        )
    if "plot" in r:
        print(f"plot: {r['plot']}")


OPTIONS = {"bench-roofline": BenchRooflineOptions}
RUN = {"bench-roofline": run}
SHOW = {"bench-roofline": show}
