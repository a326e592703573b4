"""The Meta-World tasks the closed-loop benchmark uses: instruction, scripted expert, step limit.

This module imports neither MuJoCo nor Meta-World (the expert class is resolved on demand), so
listing tasks or validating a name is cheap and never touches the GL backend selection that
``vlarun.sim.env`` has to do before MuJoCo is first imported.

``max_steps`` is the episode limit for a *learned* policy. It is 1.5x the 95th-percentile step at
which the scripted expert first succeeds, over seeds 0..19 of ``MetaWorldEnv`` (rounded up to a
multiple of 10), so the expert meets it comfortably while a policy that dithers is cut off well
before Meta-World's own 500-step horizon. Measured with ``python -m vlarun.sim.step_limits``
(20 seeds each; rendering does not change the physics):

    task                     mean  p95 success step   max_steps   expert successes
    reach-v3                 46.8         56               90           20/20
    push-v3                  61.0         69              110           20/20
    pick-place-v3            52.4         57               90           20/20
    drawer-open-v3           89.6         92              140           20/20
    button-press-topdown-v3  65.6         75              120           20/20
    door-open-v3             86.3        107              170           19/20 (*)
    window-open-v3           87.0         95              150           20/20
    drawer-close-v3          78.1         79              120           20/20
    peg-insert-side-v3      111.3        249              380           19/20
    window-close-v3          80.2         87              140           20/20

(*) the door expert never succeeds (within 500 steps) when the door sits near x = 0: seeds 11
and 28 of 0..39. Demo collection drops such episodes and records them in the manifest.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Literal

EVAL_SEED_OFFSET = 10_000
"""First evaluation seed. Demo seeds must be below it, so training and evaluation layouts never
overlap: evaluate episode ``i`` of a task with ``env.reset(seed=EVAL_SEED_OFFSET + i)``."""

# Meta-World raises if an episode runs past this many steps (SawyerXYZEnv.max_path_length).
METAWORLD_HORIZON = 500

Difficulty = Literal["precise", "coarse"]


@dataclass(frozen=True)
class TaskSpec:
    """One benchmark task.

    Attributes:
        name: Meta-World v3 environment name, e.g. ``"drawer-open-v3"``.
        instruction: The natural-language command given to the policy.
        expert: Class name of the scripted policy in ``metaworld.policies``.
        max_steps: Episode limit (truncation) for this task; see the module docstring.
        difficulty: ``"precise"`` tasks need the object/goal located to a few centimetres (a small
            marker in the image); ``"coarse"`` ones manipulate a large fixture.
    """

    name: str
    instruction: str
    expert: str
    max_steps: int
    difficulty: Difficulty

    def __post_init__(self) -> None:
        if not self.name.endswith("-v3"):
            raise ValueError(f"task {self.name!r}: only Meta-World v3 environments are supported")
        if not self.instruction.strip():
            raise ValueError(f"task {self.name!r}: empty instruction")
        if not 0 < self.max_steps <= METAWORLD_HORIZON:
            raise ValueError(
                f"task {self.name!r}: max_steps must be in 1..{METAWORLD_HORIZON}, "
                f"got {self.max_steps}"
            )
        if self.difficulty not in ("precise", "coarse"):
            raise ValueError(f"task {self.name!r}: unknown difficulty {self.difficulty!r}")

    def expert_policy(self) -> Any:
        """A fresh instance of the task's scripted Meta-World policy (imports Meta-World)."""
        policies = importlib.import_module("metaworld.policies")
        return getattr(policies, self.expert)()


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("reach-v3", "reach the red goal", "SawyerReachV3Policy", 90, "precise"),
        TaskSpec("push-v3", "push the puck to the goal", "SawyerPushV3Policy", 110, "precise"),
        TaskSpec(
            "pick-place-v3",
            "pick up the puck and place it at the goal",
            "SawyerPickPlaceV3Policy",
            90,
            "precise",
        ),
        TaskSpec("drawer-open-v3", "open the drawer", "SawyerDrawerOpenV3Policy", 140, "coarse"),
        TaskSpec(
            "button-press-topdown-v3",
            "press the button from the top",
            "SawyerButtonPressTopdownV3Policy",
            120,
            "coarse",
        ),
        TaskSpec("door-open-v3", "open the door", "SawyerDoorOpenV3Policy", 170, "coarse"),
        TaskSpec("window-open-v3", "open the window", "SawyerWindowOpenV3Policy", 150, "coarse"),
        TaskSpec("drawer-close-v3", "close the drawer", "SawyerDrawerCloseV3Policy", 120, "coarse"),
        TaskSpec(
            "peg-insert-side-v3",
            "insert the peg into the hole from the side",
            "SawyerPegInsertionSideV3Policy",
            380,
            "precise",
        ),
        TaskSpec("window-close-v3", "close the window", "SawyerWindowCloseV3Policy", 140, "coarse"),
    )
}


# Meta-World's MT10 suite (Yu et al., 2019): the deep policies' benchmark.
MT10: tuple[str, ...] = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)


def parse_tasks(spec) -> list[str]:
    """A task list as the command line gives it: names (a tuple, or comma-joined), or ``mt10``
    (the suite); unknown names raise ValueError listing the valid ones."""
    from vlarun.config import items

    names = items(spec)
    names = list(MT10) if names == ["mt10"] else names
    for name in names:
        get_task(name)
    return names


def task_names() -> list[str]:
    """All registered task names, in registry order."""
    return list(TASKS)


def get_task(name: str) -> TaskSpec:
    """The task called ``name``; an unknown name raises ValueError listing the valid ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}") from None


def max_steps_from(success_steps: list[int]) -> int:
    """1.5x the 95th-percentile success step, rounded up to a multiple of 10 (the rule above)."""
    if not success_steps:
        raise ValueError("no successful episodes to measure")
    ordered = sorted(success_steps)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return min(METAWORLD_HORIZON, 10 * math.ceil(1.5 * p95 / 10))
