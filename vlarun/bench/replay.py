"""Replay one observation stream through several (hooked) policies, query by query.

Benchmarks compare methods side by side on this shared machine: the policies take turns on
each query, so a change in the machine's load reaches every method alike instead of whichever
happened to run at that moment.
"""

from __future__ import annotations

import statistics

import numpy as np

from vlarun.policy.base import Policy
from vlarun.stages.graph import GraphRun


def interleaved_runs(
    policies: list[Policy],
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
        policy.stats.clear()
        if policy.hooks is not None and policy.hooks.decoder is not None:
            policy.hooks.decoder.steps.clear()
    runs: list[list[GraphRun]] = [[] for _ in policies]
    for instruction, image, state in stream:
        for policy, out in zip(policies, runs, strict=True):
            out.append(policy.run_stages(image, instruction, state=state))
    return runs


def time_streams(policies: list[Policy], stream: list[tuple[str, np.ndarray]]) -> list[dict]:
    """Timings of each policy over the stream, replayed as one episode per policy, the
    policies taking turns query by query (``replay.interleaved_runs``). Stateful methods
    recompute every token at an episode's first query, so that query is reported apart
    (``first_query_ms``); mean and p99 are over the other, steady-state queries (``p99_all_ms``
    includes the first)."""
    out = []
    for policy, runs in zip(policies, interleaved_runs(policies, stream), strict=True):
        times = [{s.name: s.seconds * 1e3 for s in run.timings} for run in runs]
        # An OFT graph has no separate prefill: its "prefill_head" stage (prefill + the one
        # parallel pass of the action slots) is what token methods shorten.
        prefill = [t["prefill"] if "prefill" in t else t["prefill_head"] for t in times]
        out.append(_timing(policy, prefill, [sum(t.values()) for t in times]))
    return out


def _timing(policy: Policy, prefill: list[float], e2e: list[float]) -> dict:
    steady = slice(1, None) if len(e2e) > 1 else slice(None)
    return {
        "flops_ratio": float(np.mean([s.flops_ratio for s in policy.stats.steps[steady]])),
        "prefill_ms": statistics.mean(prefill[steady]),
        "e2e_ms": statistics.mean(e2e[steady]),
        "p99_ms": float(np.percentile(e2e[steady], 99)),
        "first_query_ms": e2e[0],
        "p99_all_ms": float(np.percentile(e2e, 99)),
        "queries": len(e2e),
    }
