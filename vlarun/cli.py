"""`vlarun` command line. Each sub-command's flags are generated from a frozen options dataclass
(field name -> flag, default -> default, metadata "help" -> help), so an option and its config
field can never drift apart. Errors print one line on stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import opt  # re-exported: option classes use it
from vlarun.models.presets import DEFAULT_PRESET, PRESETS

# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class InfoOptions:
    """Parameters, per-stage FLOPs and bytes, and packet sizes of a preset (no weights needed)."""

    preset: str = opt(help=f"model preset: {', '.join(PRESETS)}", positional=True)
    batch: int = opt(1, "batch size")
    text_tokens: int = opt(24, "instruction tokens in the prompt")
    dtype: str = opt("bfloat16", "compute dtype", choices=["bfloat16", "float32"])
    json: bool = opt(False, "print one JSON object")


@dataclass(frozen=True)
class ActOptions:
    """One inference on an image file: prints the action and per-stage latency."""

    image: str = opt(help="RGB image file (PNG/JPEG) or .npy (H, W, 3) uint8")
    instruction: str = opt(help="what the robot should do")
    preset: str = opt(DEFAULT_PRESET, f"preset for random weights: {', '.join(PRESETS)}")
    checkpoint: str | None = opt(None, "checkpoint directory (overrides --preset)")
    resize: bool = opt(False, "resize the image to the model's input size instead of failing")
    unnorm_key: str | None = opt(None, "dataset statistics to un-normalise with")
    dtype: str = opt("float32", "compute dtype", choices=["bfloat16", "float32"])
    seed: int = opt(0, "seed for random weights and the initial noise")
    repeats: int = opt(5, "timed repetitions after one warm-up run")
    json: bool = opt(False, "print one JSON object")


@dataclass(frozen=True)
class ParityOptions:
    """Compare vlarun with transformers on identical weights."""

    checkpoint: str | None = opt(None, "a transformers save_pretrained directory to compare")
    json: bool = opt(False, "print one JSON object")


@dataclass(frozen=True)
class BenchEngineOptions:
    """Engine benchmark: prefill and decode against transformers on identical weights."""

    quick: bool = opt(False, "reduced run (a couple of minutes)")
    json: bool = opt(False, "print one JSON object")


# ---------------------------------------------------------------------------------------------
# Argparse generation


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta, hint = f.metadata, hints[f.name]
        base = _base_type(hint)
        shown = "" if f.default in (dataclasses.MISSING, None, False, "") else f.default
        kw: dict = {"help": meta.get("help", "") + (f" (default: {shown})" if shown != "" else "")}
        if meta.get("choices"):
            kw["choices"] = meta["choices"]
        if meta.get("positional"):
            parser.add_argument(f.name, type=base, **kw)
            continue
        flag = "--" + f.name.replace("_", "-")
        if base is bool:
            action = argparse.BooleanOptionalAction if f.default is True else "store_true"
            parser.add_argument(flag, action=action, default=f.default, **kw)
            continue
        required = f.default is dataclasses.MISSING
        default = None if required else f.default
        parser.add_argument(flag, type=base, required=required, default=default, **kw)


def _base_type(hint) -> type:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def parse_into(cls: type, ns: argparse.Namespace):
    return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_info(o: InfoOptions) -> dict:
    from vlarun.models.presets import get_preset
    from vlarun.stages.families import Workload, build_graph, param_split, prefix_len

    cfg = get_preset(o.preset)
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
        "preset": cfg.name,
        "family": cfg.family,
        "params": params,
        "params_by_part": split,
        "visual_tokens": cfg.num_visual,
        "prefix_tokens": tokens,
        "actions_per_inference": cfg.horizon,
        "action_dim": cfg.action_dim,
        "dtype": o.dtype,
        "batch": o.batch,
        "stages": stages,
        "prefill_flops_vs_2_llm_params_tokens": prefill / (2 * llm * tokens),
        "notes": cfg.notes,
    }


def _print_info(r: dict) -> None:
    parts = ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in r["params_by_part"].items() if k != "total")
    print(f"{r['preset']} ({r['family']}): {r['params'] / 1e9:.3f} B parameters ({parts})")
    print(
        f"  {r['visual_tokens']} visual tokens, prefix {r['prefix_tokens']} tokens, "
        f"{r['actions_per_inference']} actions x {r['action_dim']} per inference, {r['dtype']}"
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


def _load_image(path: str, size: int, resize: bool):
    import numpy as np

    p = Path(path)
    if not p.exists():
        raise ValueError(f"image file {path} does not exist")
    if p.suffix == ".npy":
        arr = np.load(p, allow_pickle=False)
    else:
        from PIL import Image

        img = Image.open(p).convert("RGB")
        if resize:
            img = img.resize((size, size), Image.BILINEAR)
        arr = np.asarray(img)
    return arr


def cmd_act(o: ActOptions) -> dict:
    import statistics

    import torch

    from vlarun.models.policy import Policy
    from vlarun.models.presets import get_preset

    dtype = torch.bfloat16 if o.dtype == "bfloat16" else torch.float32
    if o.checkpoint:
        policy = Policy.from_checkpoint(o.checkpoint, o.unnorm_key, dtype)
    else:
        get_preset(o.preset)  # an unknown name fails here, before any allocation
        policy = Policy.from_preset(o.preset, o.seed, dtype)
    image = _load_image(o.image, policy.model.cfg.image_size, o.resize)
    policy.image_tensor(image)  # validate before any work
    policy.run_stages(image, o.instruction, seed=o.seed)  # warm-up: one-time allocations
    runs = [policy.run_stages(image, o.instruction, seed=o.seed) for _ in range(max(o.repeats, 1))]
    names = [t.name for t in runs[0].timings]
    per_stage = {n: [r.timings[i].seconds * 1e3 for r in runs] for i, n in enumerate(names)}
    totals = [sum(t.seconds for t in r.timings) * 1e3 for r in runs]
    actions = policy.unnormalize(runs[-1].outputs["actions"][0])
    return {
        "model": policy.model.cfg.name,
        "family": policy.model.cfg.family,
        "checkpoint": o.checkpoint,
        "instruction": o.instruction,
        "actions": actions.round(5).tolist(),
        "unnormalized": policy.norm is not None,
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
    print(f'{r["model"]} ({r["family"]}) - "{r["instruction"]}"')
    units = "robot units" if r["unnormalized"] else "normalised [-1, 1]: no statistics"
    for i, a in enumerate(r["actions"]):
        print(f"  action[{i}] ({units}): " + " ".join(f"{x:+.4f}" for x in a))
    print(f"  latency per stage ({r['timing_scope']}, n={r['repeats']}):")
    for s in r["stages"]:
        print(f"    {s['name']:<14}{s['median_ms']:>9.2f} ms  (max {s['max_ms']:.2f})")
    print(f"    {'total':<14}{r['total_median_ms']:>9.2f} ms")


def cmd_parity(o: ParityOptions) -> dict:
    from vlarun.parity import check_parity

    return check_parity(o.checkpoint, progress=lambda s: print(f"checking {s}", file=sys.stderr))


def _print_parity(r: dict) -> None:
    for c in r["checks"]:
        print(
            f"  {'ok ' if c['ok'] else 'FAIL'} {c['name']:<58} {c['max_abs_diff']:.2e}"
            f" (tol {c['tolerance']:.0e})"
        )
    print("all checks passed" if r["ok"] else "SOME CHECKS FAILED")


def cmd_bench_engine(o: BenchEngineOptions) -> dict:
    from vlarun.bench import engine

    return engine.run(quick=o.quick)


def _print_bench_engine(r: dict) -> None:
    from vlarun.bench import engine

    print(engine.format_table(r))


def _train_options() -> type:
    from vlarun.sim.train import TrainConfig

    return TrainConfig


def cmd_train(o) -> dict:
    from vlarun.sim.train import train

    return train(o)


def _print_train(r: dict) -> None:
    print(f"trained to step {r['step']} ({r['minutes']:.1f} min); exported:")
    for name, path in r["exported"].items():
        print(f"  {name}: {path}")


def _eval_options() -> type:
    from vlarun.sim.evaluate import EvalConfig

    return EvalConfig


def cmd_eval(o) -> dict:
    from vlarun.sim.evaluate import evaluate

    return evaluate(o)


def _print_eval(r: dict) -> None:
    from vlarun.sim.evaluate import format_report

    print(format_report(r))


def _fidelity_options() -> type:
    from vlarun.sim.fidelity import FidelityConfig

    return FidelityConfig


def cmd_fidelity(o) -> dict:
    from vlarun.sim.fidelity import run_fidelity

    return run_fidelity(o)


def _print_fidelity(r: dict) -> None:
    from vlarun.sim.fidelity import format_fidelity

    print(format_fidelity(r))


def _sched(name: str) -> tuple[Callable, Callable, Callable]:
    """predict, plan, profile, fleet, bench sched: defined in vlarun.sched.commands."""

    def options() -> type:
        from vlarun.sched import commands

        return commands.options_class(name)

    def run(o) -> dict:
        from vlarun.sched import commands

        return commands.RUN[name](o)

    def show(r: dict) -> None:
        from vlarun.sched import commands

        commands.SHOW[name](r)

    return options, run, show


def _runtime(name: str) -> tuple[Callable, Callable, Callable]:
    """keys, serve-edge, ping, run-robot, bench coinfer: defined in vlarun.runtime."""

    def module():
        if name == "bench-coinfer":
            from vlarun.runtime import bench as m
        else:
            from vlarun.runtime import commands as m
        return m

    return (
        lambda: module().OPTIONS[name],
        lambda o: module().RUN[name](o),
        lambda r: module().SHOW[name](r),
    )


def _drift_options() -> type:
    from vlarun.accel.drift_calibration import DriftCalibrationConfig

    return DriftCalibrationConfig


def cmd_calibrate_drift(o) -> dict:
    from vlarun.accel.drift_calibration import run_calibration

    return run_calibration(o)


def _print_drift(r: dict) -> None:
    from vlarun.accel.drift_calibration import format_calibration

    print(format_calibration(r))


def _distill_options() -> type:
    from vlarun.accel.distill import DistillConfig

    return DistillConfig


def cmd_distill(o) -> dict:
    from vlarun.accel.distill import distill

    return distill(o)


def _print_distill(r: dict) -> None:
    print(f"distilled to step {r['step']} ({r['minutes']:.1f} min); exported {r['exported']}")
    for k, v in (r.get("evaluation") or {}).items():
        print(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")


def _bench_decode_options() -> type:
    from vlarun.bench.decode import BenchDecodeOptions

    return BenchDecodeOptions


def cmd_bench_decode(o) -> dict:
    from vlarun.bench.decode import run

    return run(o)


def _print_bench_decode(r: dict) -> None:
    from vlarun.bench.decode import format_result

    print(format_result(r))


def _bench_accel_options() -> type:
    from vlarun.bench.accel import BenchAccelOptions

    return BenchAccelOptions


def cmd_bench_accel(o) -> dict:
    from vlarun.bench.accel import run

    return run(o)


def _print_bench_accel(r: dict) -> None:
    from vlarun.bench.accel import format_result

    print(format_result(r))


Command = tuple[type, Callable, Callable]
COMMANDS: dict[str, Command] = {
    "info": (InfoOptions, cmd_info, _print_info),
    "act": (ActOptions, cmd_act, _print_act),
    "check-parity": (ParityOptions, cmd_parity, _print_parity),
    "train": (_train_options, cmd_train, _print_train),
    "eval": (_eval_options, cmd_eval, _print_eval),
    "fidelity": (_fidelity_options, cmd_fidelity, _print_fidelity),
    "calibrate-drift": (_drift_options, cmd_calibrate_drift, _print_drift),
    "distill": (_distill_options, cmd_distill, _print_distill),
    "predict": _sched("predict"),
    "profile": _sched("profile"),
    "plan": _sched("plan"),
    "fleet": _sched("fleet"),
    "keys": _runtime("keys"),
    "serve-edge": _runtime("serve-edge"),
    "ping": _runtime("ping"),
    "run-robot": _runtime("run-robot"),
}
BENCH: dict[str, Command] = {
    "engine": (BenchEngineOptions, cmd_bench_engine, _print_bench_engine),
    "accel": (_bench_accel_options, cmd_bench_accel, _print_bench_accel),
    "decode": (_bench_decode_options, cmd_bench_decode, _print_bench_decode),
    "sched": _sched("bench-sched"),
    "validate": _sched("bench-validate"),
    "predictor": _sched("bench-predictor"),
    "coinfer": _runtime("bench-coinfer"),
}


def _resolve(cls):
    """Options classes of heavy sub-commands are imported only when the CLI is built."""
    return cls() if not isinstance(cls, type) else cls


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlarun", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (cls, _, _) in COMMANDS.items():
        cls = _resolve(cls)
        add_options(sub.add_parser(name, help=cls.__doc__, description=cls.__doc__), cls)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    for name, (cls, _, _) in BENCH.items():
        cls = _resolve(cls)
        add_options(bench.add_parser(name, help=cls.__doc__, description=cls.__doc__), cls)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    table = BENCH[ns.bench] if ns.command == "bench" else COMMANDS[ns.command]
    cls, run, show = table
    try:
        options = parse_into(_resolve(cls), ns)
        result = run(options)
    except (ValueError, RuntimeError, FileNotFoundError, OSError) as e:
        print(f"vlarun {ns.command}: error: {e}", file=sys.stderr)
        return 2
    if getattr(options, "json", False):
        print(json.dumps(result))
    else:
        show(result)
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
