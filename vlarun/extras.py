"""The optional extras of ``pyproject.toml``: which modules each installs, and a check that a
command runs before it loads anything, so a missing one is one line naming the extra (the
command line prints it) instead of a traceback minutes in, or in a worker process."""

from __future__ import annotations

import importlib.util

# Top-level module -> the extra that installs it.
EXTRAS: dict[str, str] = {
    "gymnasium": "sim",
    "metaworld": "sim",
    "mujoco": "sim",
    "matplotlib": "sim",
    "websockets": "serve",
    "prometheus_client": "serve",
    "ray": "scale",
    "transformers": "parity",
}
SIM = ("gymnasium", "metaworld", "mujoco")


def require(*modules: str) -> None:
    """ModuleNotFoundError (``name`` set) for the first of ``modules`` that is not installed;
    nothing is imported."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The one-line message for a module of an optional extra that is not installed; None
    when the module is no extra's (a real bug: its traceback is the useful thing to see)."""
    module = (error.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return f"needs the '{extra}' extra ({module} is not installed): pip install 'vlarun[{extra}]'"
