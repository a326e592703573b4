"""Replay one observation stream through several accelerated policies, query by query.

Benchmarks compare methods side by side on this shared machine: the policies take turns on
each query, so a change in the machine's load reaches every method alike instead of whichever
happened to run at that moment.
"""

from __future__ import annotations

import numpy as np

from vlarun.policy.accelerated import AcceleratedPolicy
from vlarun.stages.graph import GraphRun


def interleaved_runs(
    policies: list[AcceleratedPolicy],
    stream: list[tuple[str, np.ndarray, np.ndarray | None]],
    warmup: int = 2,
) -> list[list[GraphRun]]:
    """Each policy's runs over the (instruction, image or views, state) ``stream``, as one
    episode per policy.

    Before timing, each policy runs the first ``warmup`` queries (allocations, oneDNN kernels of
    every shape) and is then reset with its per-step statistics cleared, so those describe the
    timed queries only."""
    for policy in policies:
        for instruction, image, state in stream[:warmup]:
            policy.run_stages(image, instruction, state=state)
        policy.reset()
        policy.steps.clear()
        if policy.decoder is not None:
            policy.decoder.steps.clear()
    runs: list[list[GraphRun]] = [[] for _ in policies]
    for instruction, image, state in stream:
        for policy, out in zip(policies, runs, strict=True):
            out.append(policy.run_stages(image, instruction, state=state))
    return runs
