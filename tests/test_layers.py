"""The house's layering, read from the import statements of every module under vlarun/.

Layers, lowest first (docs/architecture.md, "The layers and their rules"): a module may
import its own package and any package of a strictly lower layer, never a sibling of the same
layer or anything above. Imports inside
functions and under ``TYPE_CHECKING`` count too: a lazy import that points up is still a
dependency that points up. No two modules may import each other, directly or in a ring.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "vlarun"

# Package (or top-level module) -> layer. Everything under vlarun/ must be listed.
LAYERS: dict[str, float] = {
    "vlarun": 0,  # the package's own __init__ (version only)
    "vlarun.config": 0,
    "vlarun.paths": 0,
    "vlarun.machine": 0,
    "vlarun.extras": 0,
    "vlarun.models": 1,
    "vlarun.accel": 2,
    "vlarun.stages": 2,
    "vlarun.transforms": 2,
    "vlarun.policy": 3,
    "vlarun.sched": 4,
    "vlarun.world": 5,  # what emulated devices really do: above the scheduler, never read by it
    "vlarun.runtime": 6,  # what the rooms share: transport, protocol records, segments, emulation
    # The runtime's rooms: the robot and the edge never import each other; the scale-out front
    # and the openpi server hold an edge core; the testbed drives robots and edges.
    "vlarun.runtime.robot": 6.1,
    "vlarun.runtime.edge": 6.1,
    "vlarun.runtime.scaleout": 6.2,
    "vlarun.runtime.openpi": 6.2,
    "vlarun.runtime.testbed": 6.3,
    "vlarun.sim": 7,
    "vlarun.bench": 8,  # benchmark programs
    "vlarun.parity": 8,
    "vlarun.apps": 9,  # the commands: options, run, show
    "vlarun.cli": 10,
    "vlarun.__main__": 11,  # `python -m vlarun`: the command line, above everything
}

# The front door: ``vlarun/__init__.py`` re-exports these inside its module ``__getattr__``,
# loaded on first attribute access (``vlarun.Policy``), so ``import vlarun`` (or
# ``from vlarun import config``) loads none of them. Only these, and only there.
FRONT_DOOR = {"vlarun.policy.base"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str) -> set[str]:
    """Every vlarun module ``source`` imports (absolute names; relative imports resolved)."""
    found = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "vlarun"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "vlarun":
                continue
            found.add(base)
            # `from vlarun.sim import env` imports the module vlarun.sim.env.
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def without_front_door(source: str) -> tuple[str, set[str]]:
    """The top package's source without its module ``__getattr__``, and what that imports."""
    tree = ast.parse(source)
    lazy = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    tree.body = [n for n in tree.body if n not in lazy]
    return ast.unparse(tree), set().union(*(imports_of(ast.unparse(n), "vlarun") for n in lazy))


def unit_of(module: str) -> str:
    """The LAYERS key a module belongs to (its longest listed prefix)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return key
    raise KeyError(module)


def check(sources: dict[str, str]) -> list[str]:
    """Layering violations and import cycles among ``{module name: source}``."""
    problems = []
    graph: dict[str, set[str]] = {}
    for mod, src in sources.items():
        try:
            unit = unit_of(mod)
        except KeyError:
            problems.append(f"{mod}: not in LAYERS (add its package to tests/test_layers.py)")
            continue
        if mod == "vlarun":
            src, lazy = without_front_door(src)
            lazy = {d for d in lazy if d in sources}  # modules, not the names taken from them
            problems += [
                f"vlarun re-exports {d}, not in FRONT_DOOR" for d in sorted(lazy - FRONT_DOOR)
            ]
        deps = {d for d in imports_of(src, mod) if d in sources}
        graph[mod] = deps
        for dep in sorted(deps):
            dep_unit = unit_of(dep)
            if dep_unit == unit or unit == "vlarun" and dep_unit == "vlarun":
                continue
            if LAYERS[dep_unit] >= LAYERS[unit]:
                problems.append(
                    f"{mod} (layer {LAYERS[unit]}, {unit}) imports {dep} "
                    f"(layer {LAYERS[dep_unit]}, {dep_unit})"
                )
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One representative ring per strongly connected component of size > 1 (or self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_sources() -> dict[str, str]:
    return {module_name(p, ROOT): p.read_text() for p in sorted(ROOT.rglob("*.py"))}


def test_layers_point_down_and_nothing_cycles():
    problems = check(package_sources())
    assert not problems, "\n".join(problems)


def test_no_empty_packages():
    empty = [
        str(d.relative_to(ROOT.parent))
        for d in ROOT.rglob("*")
        if d.is_dir()
        and d.name != "__pycache__"
        and not any(d.glob("*.py"))
        and not any(d.iterdir())
    ]
    lone_inits = [
        str(d.relative_to(ROOT.parent))
        for d in ROOT.rglob("*")
        if d.is_dir()
        and d.name != "__pycache__"
        and [p.name for p in d.glob("*.py")] == ["__init__.py"]
        and not (d / "__init__.py").read_text().strip()
    ]
    assert not empty and not lone_inits, empty + lone_inits


# -- the checker itself: each of these must be caught --------------------------------------------


def test_a_backward_import_is_caught():
    sources = package_sources()
    sources["vlarun.models.vla"] += "\nfrom vlarun.runtime.robot.agent import RobotAgent\n"
    problems = check(sources)
    assert any(
        "vlarun.models.vla (layer 1" in p and "vlarun.runtime.robot.agent" in p for p in problems
    )


@pytest.mark.parametrize(
    "line",
    [
        "    from vlarun.sim import env\n",  # lazy, inside a function
        "from ..sim.env import MetaWorldEnv\n",  # relative
        "import vlarun.sched.scheduler\n",
    ],
)
def test_lazy_relative_and_plain_imports_count(line):
    src = "def f():\n" + (line if line.startswith("    ") else "    " + line)
    problems = check({"vlarun.models.x": src, **{m: "" for m in _targets()}})
    assert problems and "vlarun.models.x" in problems[0], problems


def _targets() -> list[str]:
    return ["vlarun.sim", "vlarun.sim.env", "vlarun.sched", "vlarun.sched.scheduler"]


def test_a_cycle_inside_one_package_is_caught():
    sources = {
        "vlarun.models.a": "from vlarun.models.b import x\n",
        "vlarun.models.b": "def f():\n    from vlarun.models.a import y\n",
    }
    assert check(sources) == ["import cycle: vlarun.models.a -> vlarun.models.b -> vlarun.models.a"]


def test_a_sibling_of_the_same_layer_is_refused():
    sources = {
        "vlarun.accel.x": "from vlarun.stages.graph import GraphRun\n",
        "vlarun.stages.graph": "",
    }
    assert check(sources)[0].startswith("vlarun.accel.x (layer 2, vlarun.accel) imports")


def test_the_front_door_is_lazy_and_listed():
    sources = package_sources()
    top = sources["vlarun"]
    sources["vlarun"] = top + "\nfrom vlarun.policy.base import Policy\n"  # eager: points up
    assert any(p.startswith("vlarun (layer 0") for p in check(sources))
    sources["vlarun"] = top.replace(
        "vlarun.policy.base import", "vlarun.runtime.robot.agent import"
    )
    assert "vlarun re-exports vlarun.runtime.robot.agent, not in FRONT_DOOR" in check(sources)
