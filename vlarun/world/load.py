"""Finding a world by name or file: ``catalog`` (built from the scheduler's own model), the
shipped ``published`` and ``adversarial``, or a user's JSON file (schema: :mod:`model`)."""

from __future__ import annotations

import json
from pathlib import Path

from vlarun.world.catalog_world import catalog_world
from vlarun.world.model import WORLDS_DIR, World, WorldError, parse_world


def shipped_worlds() -> list[str]:
    return ["catalog", *sorted(p.stem for p in WORLDS_DIR.glob("*.json"))]


def load_world(spec: str, model: str, devices: tuple[str, ...] = ()) -> World:
    """The world called ``spec`` (``catalog``, a shipped name, or a JSON file) for ``model``;
    ``devices`` (catalog ids) must all be in it. WorldError names what is wrong."""
    if spec == "catalog":
        return catalog_world(model, devices)
    path = Path(spec)
    if not path.suffix and (WORLDS_DIR / f"{spec}.json").exists():
        path = WORLDS_DIR / f"{spec}.json"
    if not path.is_file():
        raise WorldError(f"no world {spec!r}: not a file, nor one of {', '.join(shipped_worlds())}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise WorldError(f"{path}: not JSON ({e})") from None
    world = parse_world(data, str(path))
    if world.model != model:
        raise WorldError(f"{path} describes {world.model}; this run emulates {model}")
    for d in devices:
        world.device(d)
    return world
