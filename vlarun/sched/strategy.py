"""The strategies a robot can run, named once, and the one rule that places a fixed one.

Fixed strategies place every stage the same way on every request: ``device-only`` (all on the
robot), ``edge-only`` (all on the edge) and ``fixed-split`` (EcoVLA's static partition: the
first stage, the vision encoder, on the robot and the rest on the edge). The scheduled ones
decide per request: ``vlarun-placement`` places the stages under one configured setting,
``vlarun-joint`` chooses placement and accelerator setting together. ``vlarun`` is the name
the robot agent and its command line have always used for ``vlarun-placement``.
"""

from __future__ import annotations

FIXED = ("device-only", "edge-only", "fixed-split")
SCHEDULED = ("vlarun-placement", "vlarun-joint")
STRATEGIES = FIXED + SCHEDULED
ALIASES = {"vlarun": "vlarun-placement"}


def canonical(name: str) -> str:
    """The strategy's one name (``vlarun`` -> ``vlarun-placement``); ValueError lists them."""
    name = ALIASES.get(name, name)
    if name not in STRATEGIES:
        names = ", ".join((*STRATEGIES, *ALIASES))
        raise ValueError(f"unknown strategy {name!r}; strategies: {names}")
    return name


def fixed_roles(strategy: str, n_stages: int) -> tuple[str, ...]:
    """Where a fixed strategy runs each of ``n_stages`` stages ("robot" / "edge")."""
    strategy = canonical(strategy)
    if strategy == "device-only":
        return ("robot",) * n_stages
    if strategy == "edge-only":
        return ("edge",) * n_stages
    if strategy == "fixed-split":  # the classic cut after the vision encoder
        return ("robot",) + ("edge",) * (n_stages - 1)
    raise ValueError(f"{strategy} is scheduled per request, not fixed")
