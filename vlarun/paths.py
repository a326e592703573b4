"""Where vlarun finds its shipped policies and its data: the one place that knows.

``VLARUN_CHECKPOINTS`` (a directory of policy directories) and ``VLARUN_DATA`` override the
defaults. Without them, shipped policies are looked up in the ``checkpoints/`` folder of the
source checkout this package runs from (the repository's layout; an installed wheel does not
carry the weights, so it needs ``VLARUN_CHECKPOINTS``), and data in ``./data``.
"""

from __future__ import annotations

import os
from pathlib import Path

_SOURCE_ROOT = Path(__file__).resolve().parents[1]


def checkpoints_dir() -> Path:
    """The directory holding the shipped policies (``tiny-ar``, ``mt10p-ar``, ...)."""
    env = os.environ.get("VLARUN_CHECKPOINTS")
    return Path(env) if env else _SOURCE_ROOT / "checkpoints"


def training_dir() -> Path:
    """Where training runs keep their resumable state: ``training/`` of the source checkout
    (``VLARUN_TRAINING`` overrides), committed so that a run outlives the machine."""
    env = os.environ.get("VLARUN_TRAINING")
    return Path(env) if env else _SOURCE_ROOT / "training"


def data_dir() -> Path:
    """Where demonstrations and recorded rollouts are written by default."""
    return Path(os.environ.get("VLARUN_DATA", "data"))


# Shipped policies retired from checkpoints/ (superseded generations, issue 63): their weights
# stay in git history at this commit, and ``git checkout RETIRED_AT -- checkpoints/NAME``
# brings one back (docs/checkpoints.md#retired-policies). Their names still mean them: a
# refusal or a preset load says where the weights went instead of a bare "no policy".
RETIRED_AT = "8bdb6fb465c91b737c5518add837376151700b47"
RETIRED = ("mt10-ar", "mt10-oft", "mt10-dit", "mt10-ar-ceed", "mt10w-ar", "mt10w-oft", "mt10w-dit")


def retired_note(name: str) -> str:
    """Where a retired shipped policy's weights went (empty for any other name)."""
    if str(name) not in RETIRED:
        return ""
    rev = RETIRED_AT[:12]
    return (
        f"{name} was retired from checkpoints/ (superseded by the mt10p policies); "
        f"`git checkout {rev} -- checkpoints/{name}` brings it back"
    )


def shipped_policies() -> list[str]:
    """Names of the policy directories under :func:`checkpoints_dir` (sorted)."""
    root = checkpoints_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "config.json").exists())


# What an openpi JAX checkpoint holds instead of config.json (orbax's parameter tree and its
# metadata), so the refusal can name what the directory is.
ORBAX_MARKERS = ("params", "_CHECKPOINT_METADATA", "_METADATA", "assets/norm_stats.json")


def policy_dir(name_or_dir: str | os.PathLike[str]) -> Path:
    """A policy directory given by path, or by the name of a shipped policy.

    Raises ValueError naming the shipped policies when neither exists."""
    path = Path(name_or_dir)
    if (path / "config.json").exists():
        return path
    shipped = checkpoints_dir() / str(name_or_dir)
    if (shipped / "config.json").exists():
        return shipped
    if path.is_dir():  # a directory, but not a checkpoint: say what it lacks
        if any((path / m).exists() for m in ORBAX_MARKERS):
            raise ValueError(
                f"{path} is an openpi JAX / orbax checkpoint (no config.json; "
                f"{', '.join(m for m in ORBAX_MARKERS if (path / m).exists())}): vlarun loads "
                "PyTorch safetensors only; use the LeRobot export of the same model "
                "(pi0 / pi05 / pi0_fast)"
            )
        raise ValueError(
            f"{path} is a directory without config.json: not a checkpoint (a "
            "vlarun, OpenVLA or LeRobot checkpoint directory has one)"
        )
    retired = retired_note(str(name_or_dir))
    raise ValueError(
        f"no policy {str(name_or_dir)!r}: neither a checkpoint directory nor a shipped policy "
        f"(shipped, under {checkpoints_dir()}: {', '.join(shipped_policies()) or 'none'})"
        + (f"; {retired}" if retired else "")
    )
