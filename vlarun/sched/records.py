"""Run records and their one summariser.

A run record is one dict per request, whoever ran it: the robot agent (``Inference.row()``,
real processes: ``vlarun run-robot``, ``vlarun bench coinfer``) or the fleet simulator
(``world.fleet``). Every record carries ``latency_ms``, ``energy_j``, ``slo_met``,
``fallback`` (None: ran as planned) and ``ran`` ("stage@role ..."); the rest is optional
(``energy_source``, ``edge_batch``, ``predicted_ms`` / ``predicted_j``, ``rtc_delay``, ...).
``summarise`` is the one place that turns records into p50 / p99, SLO share, fallbacks and
actions per joule, so the real-process and simulated matrices read alike.
"""

from __future__ import annotations

import math


def summarise(infs: list[dict], actions: int) -> dict:
    """Latency percentiles and mean, SLO share, fallbacks and actions per joule of one run's
    records (``actions``: actions each request yields)."""
    if not infs:
        return {"inferences": 0}
    lat = sorted(r["latency_ms"] for r in infs)
    energy = sum(r["energy_j"] for r in infs)
    pick = lambda q: lat[min(int(q * len(lat)), len(lat) - 1)]  # noqa: E731
    return {
        "inferences": len(infs),
        "latency_p50_ms": pick(0.5),
        "latency_p99_ms": pick(0.99),
        "latency_mean_ms": sum(lat) / len(lat),
        "slo_met_fraction": sum(r["slo_met"] for r in infs) / len(infs),
        # the on-time share's exact 95% bounds: 0 misses in 30 requests bound the miss rate
        # at 11.6%, not at 0
        "slo_met_ci95": clopper_pearson(sum(r["slo_met"] for r in infs), len(infs)),
        "fallbacks": sum(r["fallback"] is not None for r in infs),
        # answered by the edge (no fallback) yet after the deadline: what admission and the
        # edge's expiry exist to prevent
        "late_edge_answers": sum(
            r["fallback"] is None and "@edge" in r["ran"] and not r["slo_met"] for r in infs
        ),
        # of which the answer itself reached the robot after what the deadline allowed (its
        # later stages counted); the rest were made late by the robot's own reading of the
        # answer or its own stages
        "edge_answered_late": sum(bool(r.get("late_edge")) for r in infs),
        "explored": sum(bool(r.get("explored")) for r in infs),
        "edge_requests": sum("@edge" in r["ran"] for r in infs),
        "actions_per_joule": actions * len(infs) / energy if energy > 0 else 0.0,
        "energy_source": _source(infs),
        "measured_robot_j_mean": _mean([r.get("measured_robot_j") for r in infs]),
        "mean_batch": mean_batch(infs),
        # real-time chunking: the requests that froze queued actions, and how many on average
        "rtc_requests": sum(r.get("rtc_delay") is not None for r in infs),
        "rtc_delay_mean": _mean([r.get("rtc_delay") for r in infs]),
        **prediction_error(infs),
    }


def prediction_error(infs: list[dict]) -> dict:
    """Mean absolute percentage error of the executed plan's predicted latency and energy
    against what the request realised (the calibration's target), over the requests that
    ran as planned (a fallback did not execute the plan it was predicted for); None where no
    request had a scheduler's prediction."""
    ran = [r for r in infs if r.get("predicted_ms") is not None and r["fallback"] is None]

    def mape(pred: str, real: str) -> float | None:
        pairs = [(r[pred], r[real]) for r in ran if r.get(pred) is not None and r[real] > 0]
        return 100 * sum(abs(p - m) / m for p, m in pairs) / len(pairs) if pairs else None

    return {
        "latency_mape_pct": mape("predicted_ms", "latency_ms"),
        "energy_mape_pct": mape("predicted_j", "energy_j"),
        "predicted_requests": len(ran),
    }


def _source(infs: list[dict]) -> str:
    """ "modelled" unless every request's robot side was also read from a meter."""
    sources = {r.get("energy_source", "modelled") for r in infs}
    return sources.pop() if len(sources) == 1 else "modelled; robot measured for some requests"


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def mean_batch(infs: list[dict]) -> float | None:
    """Mean batch size of the edge stage executions these requests ran in (None: none ran on
    the edge)."""
    sizes = [b for r in infs for b in (r.get("edge_batch") or {}).values()]
    return sum(sizes) / len(sizes) if sizes else None


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a binomial share ``k / n``: the shares p whose
    binomial tail at ``k`` is at least (1 - level) / 2 on each side, found by bisection."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    tail = (1 - level) / 2

    def cdf(x: int, p: float) -> float:  # P(X <= x), X ~ Binomial(n, p)
        if p <= 0:
            return 1.0
        if p >= 1:
            return 1.0 if x >= n else 0.0
        lp, lq = math.log(p), math.log1p(-p)
        return min(
            1.0,
            sum(
                math.exp(
                    math.lgamma(n + 1)
                    - math.lgamma(i + 1)
                    - math.lgamma(n - i + 1)
                    + i * lp
                    + (n - i) * lq
                )
                for i in range(x + 1)
            ),
        )

    def solve(f, lo: float = 0.0, hi: float = 1.0) -> float:  # f decreasing in p, f(root) = 0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: (1 - cdf(k - 1, p)) * -1 + tail)
    upper = 1.0 if k == n else solve(lambda p: cdf(k, p) - tail)
    return lower, upper
