"""Frozen-dataclass configs to and from plain JSON-able dicts.

Nested dataclasses, tuples of dataclasses and ``X | None`` fields are rebuilt from their type
hints, so a config written to ``config.json`` reads back equal to the original.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


# How every command that loads weights names its policy (``--policy``, read by ``Policy.load``),
# and the flags that did before: given, they fail in one line naming ``--policy``.
POLICY_HELP = "shipped policy name, checkpoint directory, or preset (random weights)"
POLICY_FLAGS_RETIRED = ("--checkpoint", "--preset")
# The policy a command runs when none is named: one for act, eval, serve-policy, serve-edge and
# run-robot, and a trained shipped one (a preset would be random weights, acting at random).
DEFAULT_POLICY = "tiny-ar"
# --compile-steps, as every command that runs a policy takes it.
COMPILE_HELP = (
    "torch.compile the prefill, decode, Jacobi steps, and the denoising steps on CUDA "
    "or in 'fused', in this mode: 'fused' is the CPU's (frozen weights, C++ GEMM "
    "templates and wrapper: mt10p-ar 2.1x end to end, benchmarks/engine.md), "
    "'reduce-overhead' CUDA graphs; empty, the default: eager"
)
# Where a model's shape is costed or measured without its weights: ``--model``.
MODEL_HELP = "model preset or shipped policy name, its shape only (see `vlarun info`)"


def opt(
    default=dataclasses.MISSING,
    help: str = "",
    positional: bool = False,
    choices=None,
    replaces: tuple[str, ...] = (),
    aliases: tuple[str, ...] = (),
    flag: str | None = None,
    deprecated: tuple[str | tuple[str, float], ...] = (),
):
    """A dataclass field carrying command-line metadata (help text, positional, choices, the
    flags it ``replaces``, or ``"NAME"`` for a positional argument it replaces: given, those
    fail in one line naming this option; and ``aliases``: other flags that set it, where the
    name other commands use for the same thing differs, e.g. ``info --policy``).

    ``flag``: the option's name where it is not the field's (a field other code and recorded
    configs read under its old name, e.g. ``FleetConfig.bw_before`` is ``--link-mbps``).
    ``deprecated``: names this option had before (one concept, one name across commands):
    they still set it, hidden from ``--help``, and print one line on stderr naming the new one;
    ``(old, factor)`` where the old one counted in other units (``--link-delay-ms`` one way:
    x2 -> ``--link-rtt-ms``)."""
    meta = {
        "help": help,
        "positional": positional,
        "choices": choices,
        "replaces": replaces,
        "aliases": aliases,
        "flag": flag,
        "deprecated": deprecated,
    }
    return dataclasses.field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field) -> str:
    """The command-line name of an options field: its ``flag``, else the field's name."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def deprecated_flags(f: dataclasses.Field) -> dict[str, float]:
    """The deprecated names of an options field -> the factor its value is multiplied by."""
    out = {}
    for old in f.metadata.get("deprecated", ()):
        name, factor = (old, 1.0) if isinstance(old, str) else old
        out[name] = factor
    return out


def to_dict(obj: Any) -> Any:
    """A dataclass (possibly nested) as JSON-able dicts/lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(x) for x in obj]
    return obj


def from_dict(cls: type[T], data: dict) -> T:
    """Rebuild ``cls`` from ``to_dict`` output; unknown keys raise naming them."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
    kwargs = {k: _convert(hints[k], v) for k, v in data.items()}
    return cls(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    if origin is tuple:
        args = typing.get_args(hint)
        inner = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        if inner is not None:
            return tuple(_convert(inner, v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value, strict=True))
    return value


def items(value, kind: type = str) -> list:
    """The values of a list option: a tuple from the command line (``--tasks a b``), whose
    elements may also be comma-joined (``--tasks a,b``, as older scripts write it), or one
    comma-joined string (configs and code that predate list options). Converted by ``kind``."""
    parts = [value] if isinstance(value, str) else list(value)
    out = []
    for part in parts:
        if isinstance(part, str):
            out += [kind(x.strip()) for x in part.split(",") if x.strip()]
        else:
            out.append(kind(part))
    return out


def invoked_command(default: str) -> str:
    """The command line this process was started with, as a user would retype it (so a result
    file names exactly what produced it); ``default`` when not run from the ``vlarun`` CLI."""
    import shlex
    import sys

    if not sys.argv or not sys.argv[0].endswith("vlarun"):
        return default
    return shlex.join(["vlarun", *sys.argv[1:]])


# Command-line flags generated from an options dataclass (``vlarun.cli``, and the modules
# that keep a ``python -m`` entry point).


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """The flags of an options dataclass (field name -> flag, default -> default, ``opt``'s
    help, ``Literal`` -> choices, ``tuple``/``list`` -> several values) on ``parser``."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta, hint = f.metadata, hints[f.name]
        base = _base_type(hint)
        shown = "" if f.default in (dataclasses.MISSING, None, False, "") else f.default
        if isinstance(shown, tuple):  # as it is typed: --tasks a b
            shown = " ".join(map(str, shown))
        text = meta.get("help", "") + (f" (default: {shown})" if shown != "" else "")
        kw: dict = {"help": text.replace("%", "%%")}  # argparse formats help with %
        if meta.get("choices"):
            kw["choices"] = meta["choices"]
        if typing.get_origin(base) is typing.Literal:
            kw["choices"], base = list(typing.get_args(base)), type(typing.get_args(base)[0])
        if typing.get_origin(base) in (tuple, list):
            kw["nargs"] = "+"
            base = typing.get_args(base)[0]
        if meta.get("positional"):
            parser.add_argument(f.name, type=base, **kw)
            continue
        flags = [flag_of(f), *meta.get("aliases", ())]
        kw["dest"] = f.name
        old = deprecated_flags(f)
        if base is bool:
            if old:
                raise TypeError(f"{f.name}: deprecated names of a switch are not supported")
            action = argparse.BooleanOptionalAction if f.default is True else "store_true"
            parser.add_argument(*flags, action=action, default=f.default, **kw)
            continue
        if meta.get("flag"):  # --link-mbps LINK_MBPS, not the field's name
            kw["metavar"] = meta["flag"].lstrip("-").replace("-", "_").upper()
        # A required option with an old name: argparse would refuse the old name alone, so
        # parse_into checks it is there instead (and the help says it is required).
        required = f.default is dataclasses.MISSING and not old
        default = None if f.default is dataclasses.MISSING else f.default
        if f.default is dataclasses.MISSING and old:
            kw["help"] += " (required)"
        parser.add_argument(*flags, type=base, required=required, default=default, **kw)
        for name, factor in old.items():
            hidden = {k: v for k, v in kw.items() if k != "help"}
            parser.add_argument(
                name,
                type=base,
                action=_Deprecated,
                new=flags[0],
                factor=factor,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
                **hidden,
            )


class _Deprecated(argparse.Action):
    """An option's old name: sets it (times ``factor``) and says once, on stderr, what it is
    called now. The old name goes in the release after the one that renamed it."""

    def __init__(self, option_strings, dest, new: str, factor: float = 1.0, **kw):
        super().__init__(option_strings, dest, **kw)
        self.new, self.factor = new, factor

    def __call__(self, parser, namespace, values, option_string=None):
        import sys

        how = ""
        if self.factor != 1.0:  # an old name in other units (nargs=1 options only)
            values = values * self.factor
            how = f" (in its units: {self.new} {values:g})"
        print(
            f"{parser.prog}: warning: {option_string} is deprecated, use {self.new}{how}; "
            "the old name goes in the next release",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def _base_type(hint) -> type:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def parse_into(cls: type, ns: argparse.Namespace):
    """The options dataclass ``cls`` from parsed flags (validated by its ``__post_init__``)."""
    for f in dataclasses.fields(cls):  # a required option argparse could not check (old names)
        if f.default is dataclasses.MISSING and getattr(ns, f.name, None) is None:
            raise ValueError(f"the following arguments are required: {flag_of(f)}")
    return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})
