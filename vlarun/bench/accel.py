"""`vlarun bench accel`: TRIAGE and EfficientVLA against their baselines on Meta-World.

Three parts, each optional (``--parts``):

* sweep: for each budget B (fraction of visual tokens recomputed) and each token method,
  closed-loop success on held-out seeds (Wilson 95% intervals) and action fidelity: the mean
  absolute action error against full recompute on the observations full recompute itself met
  (``sim.fidelity``), replayed episode by episode with the policy reset in between;
* latency: a Table-I-like table on this CPU at one budget: prefill FLOPs ratio, prefill ms,
  end-to-end ms (vision + prefill + head) and p99, replaying a recorded observation stream, for
  the trained tiny policy and for a random-weight ~1B OpenVLA-like shape (TinyLlama-1.1B LM,
  256 visual tokens, bf16) where compute rather than per-call overhead dominates;
* ablation: EfficientVLA on the diffusion policy: tokens only, cache only, layers only, MLP
  sparsity only, all; speedup (end-to-end) and success.

Every policy runs under its hooks (``Policy.with_hooks``) through ``sim.evaluate.run_episode``;
episodes are separated by ``reset()`` so no state leaks between them. Results: JSON and plots under
``--out``. ``--quick`` is a reduced version for a few minutes; it is not a result to quote.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vlarun.bench.replay import time_streams
from vlarun.bench.shapes import large_label, large_policy, synthetic_stream
from vlarun.config import POLICY_FLAGS_RETIRED, invoked_command, items, opt, to_dict
from vlarun.policy.base import Policy
from vlarun.policy.methods import (
    BUDGETLESS,
    DEPTH_PARTS,
    METHODS,
    EfficientVLAConfig,
    token_policy,
)
from vlarun.sim.evaluate import POLICY_DIR, TRAIN_TASKS, run_episode, wilson

SWEEP_BUDGETS = (0.34, 0.25, 0.18, 0.11, 0.07)
# Every budgeted token method but EfficientVLA's (its own ablation): derived, so a method added
# to policy.methods joins the sweep.
SWEEP_METHODS = tuple(m for m in METHODS if m not in (*BUDGETLESS, "efficientvla"))
LATENCY_METHODS = METHODS  # every method, full recompute first


@dataclass(frozen=True)
class BenchAccelOptions:
    """Accelerator benchmark: budget sweep, latency table, EfficientVLA ablation."""

    quick: bool = opt(False, "reduced run (a few minutes): 2 tasks, 2 episodes, 2 budgets")
    policy: str | None = opt(
        None,
        "policy of the sweep, latency table and the table's token rows "
        "(default: tiny-oft; with --table mt10p-oft)",
        replaces=POLICY_FLAGS_RETIRED,
    )
    diffusion_policy: str | None = opt(
        None,
        "diffusion policy of the ablation and the table's "
        "EfficientVLA rows (default: tiny-dit; --table mt10p-dit)",
    )
    tasks: tuple[str, ...] | None = opt(
        None,
        "Meta-World tasks (names, or mt10; default: the six tiny-policy tasks; with --table mt10)",
    )
    episodes: int = opt(10, "episodes per task and configuration")
    seed: int = opt(0, "first held-out seed")
    max_steps: int | None = opt(None, "episode step limit (default: each task's)")
    budgets: tuple[float, ...] = opt(
        SWEEP_BUDGETS, "budget fractions of the sweep (--table: 34, 18, 7%)"
    )
    methods: tuple[str, ...] = opt(
        SWEEP_METHODS, "token methods of the sweep (--table adds vla-cache-uncapped)"
    )
    latency_budget: float = opt(0.34, "budget fraction of the latency table")
    latency_queries: int = opt(60, "replayed queries per latency row")
    large: bool = opt(True, "also time the ~1B random-weight OpenVLA-like shape")
    parts: tuple[str, ...] = opt(("sweep", "latency", "ablation"), "which parts to run")
    out: str | None = opt("benchmarks/results", "directory for the JSON and plots")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    json: bool = opt(False, "print one JSON object")
    # -- the paired accuracy table (bench/accel_table.py) -----------------------------------
    table: bool = opt(False, "the paired accuracy table instead of the parts (accel_table.py)")
    groups: tuple[str, ...] = opt(("tokens", "efficientvla", "decode"), "table row groups")
    configs: tuple[str, ...] = opt(
        (),
        "table: exactly these configurations (e.g. triage:0.34,"
        "evla:all,exit:0.5; drop-all:0.07@0: TRIAGE's family with its shared layer "
        "0 instead of 2), each in its group, instead of the groups' defaults",
    )
    evla_parts: tuple[str, ...] = opt(tuple(DEPTH_PARTS), "EfficientVLA parts of the table")
    ar_policy: str = opt("mt10p-ar", "autoregressive policy of the table's decode rows")
    student: str = opt(
        "",
        "distilled (CEED) student the decode rows run on (default: none, the "
        "autoregressive policy itself)",
    )
    sigmas: tuple[float, ...] = opt((0.4, 0.5, 0.6), "early-exit sigmas of the decode rows")
    workers: int = opt(2, "table: episode worker processes (one thread each)")
    demos: str = opt("data/mt10p-clean", "table: demo frames calibrating EfficientVLA's parts")
    fidelity_episodes: int = opt(1, "table: full-compute episodes per task replayed for fidelity")
    bootstrap: int = opt(2000, "table: bootstrap resamples of each paired interval")
    timing: bool = opt(True, "table: time every row by replay on the quiet machine")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.latency_queries < 1:
            raise ValueError("need episodes >= 1 and latency_queries >= 1")
        if self.workers < 1 or self.fidelity_episodes < 0 or self.bootstrap < 100:
            raise ValueError("need workers >= 1, fidelity_episodes >= 0 and bootstrap >= 100")
        unknown = set(self.part_list) - {"sweep", "latency", "ablation"}
        if unknown:
            raise ValueError(f"unknown parts {sorted(unknown)}; use sweep, latency, ablation")

    @property
    def part_list(self) -> list[str]:
        return items(self.parts)

    @property
    def _default_budgets(self) -> bool:
        return items(self.budgets, float) == list(SWEEP_BUDGETS)

    def resolved(self) -> BenchAccelOptions:
        """Defaults that depend on the mode: the table runs on the deep MT10 policies."""
        import dataclasses

        deep = self.table
        methods = items(self.methods)
        if deep and list(self.methods) == list(SWEEP_METHODS):
            methods = [*methods, "vla-cache-uncapped"]
        return dataclasses.replace(
            self,
            policy=self.policy or ("mt10p-oft" if deep else "tiny-oft"),
            diffusion_policy=self.diffusion_policy or ("mt10p-dit" if deep else "tiny-dit"),
            tasks=self.tasks or (("mt10",) if deep else tuple(TRAIN_TASKS)),
            methods=tuple(methods),
        )

    def reduced(self) -> BenchAccelOptions:
        """The --quick settings (explicitly given smaller values are kept)."""
        import dataclasses

        from vlarun.sim.tasks import parse_tasks

        if self.table:
            return dataclasses.replace(
                self,
                tasks=tuple(parse_tasks(self.tasks)[:1]),
                episodes=min(self.episodes, 1),
                budgets=(0.34,) if self._default_budgets else self.budgets,
                latency_queries=min(self.latency_queries, 6),
                large=False,
            )
        return dataclasses.replace(
            self,
            tasks=tuple(parse_tasks(self.tasks)[:2]),
            episodes=min(self.episodes, 2),
            budgets=(0.34, 0.07) if self._default_budgets else self.budgets,
            latency_queries=min(self.latency_queries, 12),
        )


# ---------------------------------------------------------------------------------------------
# Closed loop and fidelity


def _load(name: str):
    from vlarun.policy.base import Policy

    return Policy.from_checkpoint(POLICY_DIR / name)


def closed_loop(policy, o: BenchAccelOptions, record: bool = False) -> dict:
    """Success over tasks x episodes; with ``record``, each episode's observations and chunks."""
    from vlarun.sim.env import MetaWorldEnv, env_views
    from vlarun.sim.tasks import EVAL_SEED_OFFSET, parse_tasks

    wins, episodes = 0, []
    tasks = parse_tasks(o.tasks)
    for task in tasks:
        env = MetaWorldEnv(task, max_steps=o.max_steps, **env_views(policy.model.cfg))
        for i in range(o.episodes):
            policy.reset()
            seen: list[tuple[np.ndarray, np.ndarray]] = []

            def keep(obs, run, out=seen):
                # What the policy saw (all views, the state) and the chunk it answered.
                out.append((*policy.observation(obs), run.outputs["actions"][0].float().numpy()))

            r = run_episode(
                policy, env, EVAL_SEED_OFFSET + o.seed + i, on_inference=keep if record else None
            )
            wins += r["success"]
            episodes.append({"task": task, "instruction": env.instruction, "obs": seen})
        env.close()
    n = len(episodes)
    return {
        "success_rate": wins / n,
        "ci95": list(wilson(wins, n)),
        "episodes": n,
        "recorded": episodes,
    }


def fidelity(policy: Policy, recorded: list[dict]) -> float:
    """Mean |action - full recompute's| over every recorded observation, episode by episode."""
    from vlarun.sim.evaluate import replay_errors

    errors = replay_errors(policy, tuple((ep["instruction"], ep["obs"]) for ep in recorded))
    return float(np.mean(errors)) if errors else float("nan")


def with_method(policy: Policy, name: str, budget: float = 0.34) -> Policy:
    """``policy`` running token method ``name`` at ``budget`` (with its calibrated knobs)."""
    return policy.with_hooks(token_policy(name, budget, policy.calibration))


def sweep(o: BenchAccelOptions, log) -> list[dict]:
    policy = _load(o.policy)
    full = closed_loop(policy.with_setting("full"), o, record=True)
    rows = [
        {
            "method": "full",
            "budget_fraction": 1.0,
            "success_rate": full["success_rate"],
            "ci95": full["ci95"],
            "action_error": 0.0,
            "episodes": full["episodes"],
        }
    ]
    log(f"sweep full: {full['success_rate']:.1%}")
    for b in items(o.budgets, float):
        for name in items(o.methods):
            fast = with_method(policy, name, b)
            res = closed_loop(fast, o)
            err = fidelity(with_method(policy, name, b), full["recorded"])
            rows.append(
                {
                    "method": name,
                    "budget_fraction": b,
                    "success_rate": res["success_rate"],
                    "ci95": res["ci95"],
                    "action_error": err,
                    "episodes": res["episodes"],
                    "flops_ratio": fast.stats.summary().get("flops_ratio"),
                }
            )
            log(f"sweep {name} B={b:.0%}: {res['success_rate']:.1%}, error {err:.4f}")
    return rows


# ---------------------------------------------------------------------------------------------
# Latency


def latency_rows(name: str, policy, stream, budget: float, log) -> list[dict]:
    fast = [with_method(policy, m, budget) for m in LATENCY_METHODS]
    rows = []
    for m, r in zip(LATENCY_METHODS, time_streams(fast, stream), strict=True):
        rows.append({"model": name, "method": m, "budget_fraction": budget} | r)
        log(f"latency {name} {m}: prefill {r['prefill_ms']:.1f} ms, e2e {r['e2e_ms']:.1f}")
    return rows


def latency(o: BenchAccelOptions, log) -> list[dict]:
    from vlarun.sim.tasks import get_task, parse_tasks

    policy = _load(o.policy)
    task = parse_tasks(o.tasks)[0]
    instruction = get_task(task).instruction
    recorded = closed_loop(
        policy.with_setting("full"), _with(o, tasks=task, episodes=1), record=True
    )["recorded"]
    stream = [(instruction, img, st) for img, st, _ in recorded[0]["obs"]][: o.latency_queries]
    if len(stream) < o.latency_queries:  # a short episode: pad with a synthetic continuation
        cfg = policy.model.cfg
        stream += synthetic_stream(
            cfg.image_size, o.latency_queries - len(stream), instruction, cfg.proprio_dim
        )
    rows = latency_rows(o.policy, policy, stream, o.latency_budget, log)
    if o.large:
        big = large_policy()
        queries = max(4, o.latency_queries // 4)  # ~1-2 s a query on two cores
        stream = synthetic_stream(big.model.cfg.image_size, queries, instruction)
        rows += latency_rows(large_label(big), big, stream, o.latency_budget, log)
    return rows


# ---------------------------------------------------------------------------------------------
# EfficientVLA ablation


# The shipped LMs have 4 layers: tokens are selected after layer 1 so that, with one layer
# removed, two layers still run on the selected tokens only (at layer 2 none would).
ABLATION = {
    "none": EfficientVLAConfig(tokens=None),
    "tokens": EfficientVLAConfig(tokens=0.22, token_layer=1),
    "cache": EfficientVLAConfig(tokens=None, cache_interval=5),
    "layers": EfficientVLAConfig(tokens=None, layers_removed=1),
    # MLP sparsity is EfficientVLA's optional extra; apart, so its cost is not the layers'
    "mlp": EfficientVLAConfig(tokens=None, mlp_sparsity=0.25),
    "all": EfficientVLAConfig(
        tokens=0.22, token_layer=1, layers_removed=1, mlp_sparsity=0.25, cache_interval=5
    ),
}


def ablation(o: BenchAccelOptions, log) -> list[dict]:
    policy = _load(o.diffusion_policy)
    full = closed_loop(policy.with_setting("full"), o, record=True)
    frames = [(ep["instruction"], img, st) for ep in full["recorded"] for img, st, _ in ep["obs"]]
    samples = [
        (policy.image_tensor(img), policy.text_ids(ins, st), policy.state_tensor(st))
        for ins, img, st in frames[:16]
    ]
    stream = frames[: o.latency_queries]
    fast = {name: cfg.apply(policy, samples) for name, cfg in ABLATION.items()}
    timings = dict(zip(fast, time_streams(list(fast.values()), stream), strict=True))
    rows, base_ms = [], timings["none"]["e2e_ms"]
    for name, cfg in ABLATION.items():
        timing = timings[name]
        res = full if name == "none" else closed_loop(fast[name], o)
        rows.append(
            {
                "config": name,
                "settings": to_dict(cfg),
                "success_rate": res["success_rate"],
                "ci95": res["ci95"],
                "speedup": base_ms / timing["e2e_ms"],
            }
            | timing
        )
        log(f"ablation {name}: {res['success_rate']:.1%}, x{base_ms / timing['e2e_ms']:.2f}")
    return rows


# ---------------------------------------------------------------------------------------------
# Driver


def _with(o: BenchAccelOptions, **kw) -> BenchAccelOptions:
    import dataclasses

    return dataclasses.replace(o, **kw)


def run(o: BenchAccelOptions, progress: bool = True) -> dict:
    from vlarun.models.device import cpu_only

    cpu_only(o.device, "vlarun bench accel")
    o = o.resolved()
    if o.quick:
        o = o.reduced()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    if o.table:
        from vlarun.bench import accel_table

        result = accel_table.run_table(o, log)
        if o.out:
            result["files"] = accel_table.write_table(result, Path(o.out))
        return result
    t0 = time.time()
    result: dict = {
        "quick": o.quick,
        "options": to_dict(o),
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "command": invoked_command("vlarun bench accel" + (" --quick" if o.quick else "")),
    }
    parts = {"sweep": sweep, "latency": latency, "ablation": ablation}
    for name in o.part_list:
        result[name] = parts[name](o, log)
    result["wall_s"] = round(time.time() - t0, 1)
    if o.out:
        result["files"] = write_results(result, Path(o.out))
    return result


def write_results(result: dict, out: Path) -> dict:
    """accel_<date>.json and, where there is a sweep, accel_sweep_<date>.png."""
    out.mkdir(parents=True, exist_ok=True)
    # A run of some parts only gets their names in its file name, so runs of different parts
    # (e.g. the sweep in one process, latency in a quiet window) do not overwrite each other.
    parts = items(result["options"]["parts"])
    which = "" if set(parts) >= {"sweep", "latency", "ablation"} else "_" + "-".join(parts)
    stem = f"accel{'_quick' if result['quick'] else ''}{which}_{result['date'][:10]}"
    files = {"json": str(out / f"{stem}.json")}
    if result.get("sweep"):
        files["plot"] = str(out / f"{stem}_sweep.png")
        plot_sweep(result["sweep"], files["plot"])
    if result.get("latency"):
        files["latency_plot"] = str(out / f"{stem}_latency.png")
        plot_latency(result["latency"], files["latency_plot"])
    Path(files["json"]).write_text(json.dumps(result | {"files": files}, indent=1))
    return files


def plot_sweep(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    full = next((r for r in rows if r["method"] == "full"), None)
    methods = list(dict.fromkeys(r["method"] for r in rows if r["method"] != "full"))
    for i, method in enumerate(methods):
        rs = sorted((r for r in rows if r["method"] == method), key=lambda r: r["budget_fraction"])
        x = [r["budget_fraction"] * 100 for r in rs]
        shift = 0.5 * (i - (len(methods) - 1) / 2)  # side by side, so the intervals stay legible
        xs = [v + shift for v in x]
        lo = [r["success_rate"] - r["ci95"][0] for r in rs]
        hi = [r["ci95"][1] - r["success_rate"] for r in rs]
        ax_s.errorbar(
            xs,
            [r["success_rate"] for r in rs],
            yerr=[lo, hi],
            label=method,
            capsize=3,
            marker="o",
            lw=1,
        )
        ax_e.plot(x, [r["action_error"] for r in rs], marker="o", label=method)
    if full is not None:
        ax_s.axhline(full["success_rate"], color="k", ls="--", label="full")
    ax_s.set(xlabel="budget B (% of visual tokens)", ylabel="success", title="closed loop")
    ax_e.set(
        xlabel="budget B (% of visual tokens)",
        ylabel="mean |action error|",
        title="fidelity to full recompute",
    )
    ax_s.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(rows: list[dict], path: str) -> None:
    """Prefill and end-to-end time relative to full recompute, per model and method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        rs = [r for r in rows if r["model"] == model]
        full = next(r for r in rs if r["method"] == "full")
        x = np.arange(len(rs))
        ax.bar(x - 0.2, [r["prefill_ms"] / full["prefill_ms"] for r in rs], 0.4, label="prefill")
        ax.bar(x + 0.2, [r["e2e_ms"] / full["e2e_ms"] for r in rs], 0.4, label="end-to-end")
        ax.plot(x, [r["flops_ratio"] for r in rs], "k_", markersize=20, label="prefill FLOPs")
        ax.set_xticks(x, [r["method"] for r in rs], rotation=30)
        ax.set(title=model, ylabel="relative to full recompute")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_result(r: dict) -> str:
    if "table" in r:
        from vlarun.bench.accel_table import format_table

        return format_table(r)
    lines = [
        f"vlarun bench accel ({'quick' if r['quick'] else 'full'}), {r['date']}, "
        f"{r['threads']} threads, {r['wall_s']} s"
    ]
    if r.get("sweep"):
        lines += [
            "",
            "| method | B | success (95% CI) | action error | FLOPs |",
            "|---|---|---|---|---|",
        ]
        for s in r["sweep"]:
            flops = f"{s['flops_ratio']:.2f}" if s.get("flops_ratio") is not None else "1.00"
            lines.append(
                f"| {s['method']} | {s['budget_fraction']:.0%} | {s['success_rate']:.1%} "
                f"({s['ci95'][0]:.0%}-{s['ci95'][1]:.0%}) | {s['action_error']:.4f} "
                f"| {flops} |"
            )
    if r.get("latency"):
        lines += [
            "",
            "| model | method | FLOPs | prefill ms | e2e ms | p99 ms |",
            "|---|---|---|---|---|---|",
        ]
        for x in r["latency"]:
            lines.append(
                f"| {x['model']} | {x['method']} | {x['flops_ratio']:.2f} | "
                f"{x['prefill_ms']:.1f} | {x['e2e_ms']:.1f} | {x['p99_ms']:.1f} |"
            )
    if r.get("ablation"):
        lines += [
            "",
            "| EfficientVLA | success (95% CI) | e2e ms | speedup | FLOPs |",
            "|---|---|---|---|---|",
        ]
        for a in r["ablation"]:
            lines.append(
                f"| {a['config']} | {a['success_rate']:.1%} ({a['ci95'][0]:.0%}-"
                f"{a['ci95'][1]:.0%}) | {a['e2e_ms']:.1f} | x{a['speedup']:.2f} | "
                f"{a['flops_ratio']:.2f} |"
            )
    for kind, path in r.get("files", {}).items():
        lines.append(f"{kind}: {path}")
    return "\n".join(lines)


# `vlarun bench accel` (vlarun.cli's registry points here)
OPTIONS = {"bench-accel": BenchAccelOptions}
RUN = {"bench-accel": run}
SHOW = {"bench-accel": lambda r: print(format_result(r))}
