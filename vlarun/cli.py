"""`vlarun` command line: one registry of sub-commands; only the chosen one's module is imported.

Each entry names the module that defines the command (its ``OPTIONS``, ``RUN`` and ``SHOW``
tables); the flags are generated from that frozen options dataclass (field name -> flag, default
-> default, metadata "help" -> help, ``Literal`` -> choices, ``tuple``/``list`` -> several
values; ``opt(flag=...)`` where a field keeps an older name, ``opt(deprecated=...)`` for the
names an option had before: hidden, still working, one line on stderr), so an option and its
config field can never drift apart. ``vlarun --help`` lists the
registry without importing any command. Errors print one line on stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import typing

from vlarun.config import add_options, flag_of, parse_into
from vlarun.extras import missing_extra

# name -> (module defining it, one-line summary shown by `vlarun --help`).
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("vlarun.apps.model", "parameters, per-stage FLOPs/bytes and packets of a preset"),
    "act": ("vlarun.apps.model", "one inference on an image file, per-stage latency"),
    "check-parity": ("vlarun.apps.model", "compare the engine with transformers"),
    "convert": ("vlarun.apps.model", "OpenVLA-OFT's pickled heads -> safetensors, once"),
    "train": ("vlarun.apps.train", "behaviour cloning on Meta-World demonstrations"),
    "distill": ("vlarun.apps.train", "CEED-VLA consistency distillation of a student"),
    "eval": ("vlarun.apps.evaluate", "closed-loop success on held-out Meta-World seeds"),
    "pair": ("vlarun.apps.evaluate", "paired difference of two recorded `eval --json` runs"),
    "fidelity": ("vlarun.apps.evaluate", "action fidelity of accelerated policies"),
    "calibrate-drift": ("vlarun.apps.evaluate", "TRIAGE's drift diagnostic"),
    "layer-importance": ("vlarun.apps.evaluate", "EfficientVLA's per-layer LM importance table"),
    "predict": ("vlarun.apps.sched", "predicted latency/energy of one placement"),
    "profile": ("vlarun.apps.sched", "stage medians on this machine"),
    "plan": ("vlarun.apps.sched", "choose placement and accelerator settings"),
    "fleet": ("vlarun.apps.sched", "simulate N robots on one edge"),
    "keys": ("vlarun.apps.runtime", "CurveZMQ key pairs"),
    "serve-edge": ("vlarun.apps.runtime", "the edge server"),
    "serve-policy": ("vlarun.apps.runtime", "whole-policy inference for openpi clients"),
    "ping": ("vlarun.apps.runtime", "edge health, link RTT and bandwidth"),
    "run-robot": ("vlarun.apps.runtime", "the robot agent in closed loop"),
    "demos": ("vlarun.apps.train", "scripted-expert Meta-World demonstrations"),
}
BENCH: dict[str, tuple[str, str]] = {
    "engine": ("vlarun.bench.engine", "prefill and decode against transformers"),
    "accel": ("vlarun.bench.accel", "accelerators: success, fidelity, FLOPs and time"),
    "decode": ("vlarun.bench.decode", "Jacobi decoding with early exit vs autoregressive"),
    "sched": ("vlarun.bench.sched", "scheduler vs fixed strategies"),
    "validate": ("vlarun.world.validate", "cost model vs the papers' published times"),
    "published": (
        "vlarun.world.published",
        "cost model vs published pi0 / pi0.5 / SmolVLA latencies",
    ),
    "predictor": ("vlarun.world.predictor_check", "every plan of a tiny preset run here"),
    "coinfer": ("vlarun.bench.coinfer", "co-inference over real processes and links"),
    "serve": ("vlarun.bench.serve", "openpi-protocol serving overhead and concurrency"),
    "hostile": ("vlarun.bench.attacks", "the servers under attack: RSS, a legitimate client"),
    "scaleout": ("vlarun.bench.scaleout", "robots against 1 and 2 Ray edge workers, a kill"),
    "gpu-check": ("vlarun.bench.gpucheck", "one-call GPU check: parity, engine, policies, JSON"),
    "compile": ("vlarun.bench.compile_probe", "torch.compile vs eager: engine steps, policies"),
    "load": ("vlarun.bench.load_memory", "peak memory of loading a checkpoint vs its size"),
    "cpu": ("vlarun.bench.cpu_probe", "fp32 vs bf16 on this CPU: matmul, one training step"),
    "roofline": ("vlarun.bench.roofline", "a policy's stages against this machine's roofline"),
    "floor": ("vlarun.bench.floor", "the floor of a ZeroMQ relay hop and a Ray actor call"),
    "paired": ("vlarun.bench.paired", "one accel-table row minus another table's, paired"),
    "rtc": ("vlarun.bench.rtc", "chunk execution under delay: sync, naive, blend, real-time"),
    "side-by-side": ("vlarun.bench.side_by_side", "a benchmark at another commit and here"),
}


def _usage() -> str:
    width = max(map(len, [*COMMANDS, *(f"bench {b}" for b in BENCH)])) + 2
    lines = [
        "usage: vlarun COMMAND [options]   (vlarun COMMAND --help for its options)",
        "       vlarun --version",
        "",
    ]
    lines += [f"  {n:<{width}}{s}" for n, (_, s) in COMMANDS.items()]
    lines += [f"  {'bench ' + n:<{width}}{s}" for n, (_, s) in BENCH.items()]
    return "\n".join(lines)


def resolve(argv: list[str]) -> tuple[str, str, list[str]]:
    """(registry key, defining module, remaining argv) for a command line; unknown commands
    raise ValueError listing the valid ones."""
    if not argv:
        raise ValueError("no command given; valid: " + ", ".join([*COMMANDS, "bench"]))
    name, rest = argv[0], argv[1:]
    if name == "bench":
        if not rest or rest[0] not in BENCH:
            got = repr(rest[0]) if rest else "nothing"
            raise ValueError(f"unknown benchmark {got}; valid: {', '.join(BENCH)}")
        return f"bench-{rest[0]}", BENCH[rest[0]][0], rest[1:]
    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r}; valid: {', '.join([*COMMANDS, 'bench'])}")
    return name, COMMANDS[name][0], rest


def command(key: str, module: str) -> tuple[type, typing.Callable, typing.Callable]:
    """(options class, run, show) of one command: imports its module, and only that one."""
    mod = importlib.import_module(module)
    cls = mod.OPTIONS[key]
    if not isinstance(cls, type):  # a module may still defer its options class
        cls = cls()
    return cls, mod.RUN[key], mod.SHOW[key]


def replaced_option(cls: type, argv: list[str]) -> str | None:
    """The one-line error for a flag (or a positional name) this command took under another
    name before, naming the option that replaces it; None when there is none."""
    positional = any(f.metadata.get("positional") for f in dataclasses.fields(cls))
    for f in dataclasses.fields(cls):
        new = flag_of(f)
        for old in f.metadata.get("replaces", ()):
            if old == "NAME":
                if argv and not argv[0].startswith("-") and not positional:
                    return f"give {argv[0]!r} as {new} {argv[0]} ({f.metadata['help']})"
            elif any(a == old or a.startswith(old + "=") for a in argv):
                return f"{old} is now {new} ({f.metadata['help']})"
    return None


def build_parser(key: str, cls: type) -> argparse.ArgumentParser:
    prog = "vlarun " + key.replace("bench-", "bench ", 1)
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    add_options(parser, cls)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from vlarun import __version__

        print(f"vlarun {__version__}")
        return 0
    if argv[0] == "bench" and (len(argv) == 1 or argv[1] in ("-h", "--help")):
        width = max(map(len, BENCH))
        print("usage: vlarun bench NAME [options]   (vlarun bench NAME --help: its options)\n")
        print("\n".join(f"  {n:<{width}}  {what}" for n, (_, what) in BENCH.items()))
        return 0 if len(argv) > 1 else 2
    try:
        key, module, rest = resolve(argv)
    except ValueError as e:
        print(f"vlarun: error: {e}", file=sys.stderr)
        return 2
    prog = "vlarun " + key.replace("bench-", "bench ", 1)
    try:
        cls, run, show = command(key, module)
        replaced = replaced_option(cls, rest)
        if replaced is not None:
            print(f"{prog}: error: {replaced}", file=sys.stderr)
            return 2
        ns = build_parser(key, cls).parse_args(rest)
        options = parse_into(cls, ns)
        result = run(options)
    except ModuleNotFoundError as e:
        message = missing_extra(e)
        if message is None:
            raise
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, FileNotFoundError, OSError) as e:
        print(f"vlarun {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    if getattr(options, "json", False):
        print(json.dumps(result))
    else:
        show(result)
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
