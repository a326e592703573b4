"""Every module under vlarun/ imports: a name a refactor removed from one module but left in
another's import line fails here, not only when some test happens to import that module (the
rooms' move left ``coinfer_trace`` importing a table that was gone)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import vlarun

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(vlarun.__path__, "vlarun.")
    if not m.name.endswith("__main__")  # runs the command line when imported
)


def test_the_walk_sees_every_room():
    assert {
        "vlarun.runtime.robot.agent",
        "vlarun.runtime.edge.core",
        "vlarun.sched.calibration",
    } <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    importlib.import_module(name)
