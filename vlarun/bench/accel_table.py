"""`vlarun bench accel --table`: what each accelerator costs in success, paired.

Rows, each a configuration spec of ``sim.evaluate.build_candidate`` on one policy:

  tokens        on ``--policy`` (an OFT policy): full compute, then every token method of
                ``--methods`` at every budget of ``--budgets`` (TRIAGE, drop-all, keep-all,
                FastV, capped VLA-Cache, VLA-Pruner, ...) and the uncapped VLA-Cache;
  efficientvla  on ``--diffusion-policy``: full compute, each EfficientVLA part on depth
                (``policy.methods.DEPTH_PARTS``: tokens, DiT cache, layers, MLP by magnitude or
                by activation) and all together;
  decode        on ``--ar-policy``: greedy decoding, then Jacobi with CEED's early exit at each
                sigma of ``--sigmas`` (on ``--student`` when given, a distilled checkpoint:
                the rows then say so; without one, on the autoregressive policy itself).

Every configuration of a group runs the very same (task, seed) episodes as that group's full
compute, so the difference to full is paired: a bootstrap over episodes (resampled together,
so layout difficulty cancels) gives its 95% interval, overall and per task. Each row also has
the action error (mean |chunk - full's chunk| on the observations full itself met, replayed
with the configuration reset per episode), the prefill FLOPs ratio and, for token methods,
the share of non-recomputed tokens whose cache was reused (TRIAGE: valid by drift) rather than
pruned. Episodes run in ``--workers`` processes of one thread each.

Time ratios are measured apart, by replaying one recorded stream with every configuration of a
group taking turns query by query (``bench.replay.time_streams``) on the quiet machine: on the
group's own policy, and for the token rows also on the ~1B random-weight OpenVLA-like shape.

The settings file (``*_settings.json``, the format of ``sched/settings.json``) carries what the
runtime executes exactly as measured: TRIAGE token budgets, the DiT cache interval, the
early-exit sigma and int8 weights (a row of the tokens group, on its policy), each with its
relative success (rate / full's rate) and paired 95% bounds ((full + difference bound) /
full), for ``vlarun plan --settings FILE --accuracy-floor F``.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

from vlarun.config import invoked_command, items, to_dict

GROUPS = ("tokens", "efficientvla", "decode")
TABLE_BUDGETS = (0.34, 0.18, 0.07)
UNCAPPED = "vla-cache-uncapped"


# ---------------------------------------------------------------------------------------------
# Which rows


def spec_group(spec: str) -> str:
    """The group a configuration spec belongs to (which policy it runs on)."""
    head = spec.partition(":")[0]
    return {"evla": "efficientvla", "exit": "decode"}.get(head, "tokens")


def group_specs(o, group: str) -> tuple[str, list[str]]:
    """(policy, the group's configuration specs after its full compute) for ``group``:
    ``--configs`` where given (each spec to its group), else the group's defaults."""
    from vlarun.policy.methods import DEPTH_PARTS
    from vlarun.sim.evaluate import check_candidate

    policy = {"tokens": o.policy, "efficientvla": o.diffusion_policy, "decode": o.ar_policy}.get(
        group
    )
    if o.configs:
        for spec in items(o.configs):
            check_candidate(spec)
        return policy, [s for s in items(o.configs) if spec_group(s) == group and s != "full"]
    if group == "tokens":
        budgets = items(o.budgets, float) if not o._default_budgets else list(TABLE_BUDGETS)
        methods = [m for m in items(o.methods) if m != UNCAPPED]
        specs = [f"{m}:{b:g}" for b in budgets for m in methods]
        return o.policy, specs + ([UNCAPPED] if UNCAPPED in items(o.methods) else [])
    if group == "efficientvla":
        parts = items(o.evla_parts)
        unknown = sorted(set(parts) - set(DEPTH_PARTS))
        if unknown:
            raise ValueError(f"unknown EfficientVLA parts {unknown}; valid: {list(DEPTH_PARTS)}")
        return o.diffusion_policy, [f"evla:{p}" for p in parts]
    if group == "decode":
        return o.ar_policy, [f"exit:{s:g}" for s in items(o.sigmas, float)]
    raise ValueError(f"unknown table group {group!r}; use {', '.join(GROUPS)}")


def _checkpoint(name: str) -> str:
    from vlarun.paths import policy_dir

    path = Path(name)
    return str(path if (path / "config.json").exists() else policy_dir(name))


# ---------------------------------------------------------------------------------------------
# Closed loop, paired


def _episodes(o, checkpoint: str, spec: str | None, replay: dict, record: int) -> list:
    from vlarun.sim.evaluate import EpisodeJob, split_seeds
    from vlarun.sim.tasks import EVAL_SEED_OFFSET, parse_tasks

    tasks = parse_tasks(o.tasks)
    seeds = [EVAL_SEED_OFFSET + o.seed + i for i in range(o.episodes)]
    jobs = []
    for task in tasks:
        for k, chunk in enumerate(split_seeds(seeds, o.workers, len(tasks))):
            jobs.append(
                EpisodeJob(
                    checkpoint,
                    task,
                    chunk,
                    spec,
                    o.device,
                    record=record if k == 0 else 0,
                    replay=tuple(replay.get(task, ())) if k == 0 else (),
                    demos=o.demos,
                    max_steps=o.max_steps,
                )
            )
    return jobs


def closed_loop(o, log) -> dict:
    """Per group: full compute recorded, then every configuration on the same episodes."""
    from vlarun.sim.evaluate import merge_summaries, run_jobs

    progress = lambda msg: log(f"table: {msg}")  # noqa: E731
    groups = {}
    full_jobs = {}
    for group in items(o.groups):
        policy, specs = group_specs(o, group)
        if o.configs and not specs:
            continue  # --configs named nothing of this group
        # Full compute is the group's policy; a distilled student's rows run on the student.
        rows_on = o.student if group == "decode" and o.student else policy
        groups[group] = {
            "policy": policy,
            "specs": specs,
            "checkpoint": _checkpoint(policy),
            "rows_checkpoint": _checkpoint(rows_on),
            "rows_on": rows_on,
        }
        full_jobs[group] = _episodes(o, groups[group]["checkpoint"], None, {}, o.fidelity_episodes)
    flat = [j for js in full_jobs.values() for j in js]
    log(f"table: full compute of {len(full_jobs)} groups, {len(flat)} jobs")
    results = iter(run_jobs(flat, o.workers, progress))
    for group, jobs in full_jobs.items():
        res = [next(results) for _ in jobs]
        episodes = [e for r in res for e in r["episodes"]]
        replay: dict[str, list] = {}
        for e in episodes:
            if "recorded" in e:
                replay.setdefault(e["task"], []).append(e.pop("recorded"))
        groups[group]["full"] = {
            "episodes": episodes,
            "summary": merge_summaries([r["summary"] for r in res]),
        }
        groups[group]["replay"] = replay
    other_jobs = []
    for group, g in groups.items():
        for spec in g["specs"]:
            jobs = _episodes(o, g["rows_checkpoint"], spec, g["replay"], 0)
            other_jobs += [(group, spec, j) for j in jobs]
    log(f"table: {len(other_jobs)} jobs of accelerated configurations")
    res = run_jobs([j for _, _, j in other_jobs], o.workers, progress)
    for group, g in groups.items():
        g["rows"] = {}
        for spec in g["specs"]:
            mine = [
                r
                for (gr, sp, _), r in zip(other_jobs, res, strict=True)
                if (gr, sp) == (group, spec)
            ]
            g["rows"][spec] = {
                "episodes": [e for r in mine for e in r["episodes"]],
                "summary": merge_summaries([r["summary"] for r in mine]),
                "action_errors": [x for r in mine for x in r["action_errors"]],
            }
    return groups


def episode_outcomes(rows: list[dict]) -> dict[str, dict[tuple[str, int], bool]]:
    """Per configuration of one group's table rows, success by (task, seed): the outcomes in
    the order of the "full" row's ``keys``, for pairing rows of different runs later."""
    keys = [tuple(k) for k in next(r for r in rows if r["config"] == "full")["keys"]]
    return {r["config"]: dict(zip(keys, map(bool, r["outcomes"]), strict=True)) for r in rows}


def analyse(o, groups: dict) -> list[dict]:
    """One row per configuration: success, paired difference to full, per task, fidelity."""
    from vlarun.sim.evaluate import paired_difference, wilson

    key = lambda e: (e["task"], e["seed"])  # noqa: E731
    rows = []
    for group, g in groups.items():
        full = {key(e): e for e in g["full"]["episodes"]}
        order = sorted(full)
        tasks = list(dict.fromkeys(k[0] for k in order))
        base_lat = _p50(g["full"]["episodes"])
        entries = [("full", g["full"] | {"action_errors": [0.0]})] + list(g["rows"].items())
        for spec, r in entries:
            by = {key(e): e for e in r["episodes"]}
            if set(by) != set(full):
                raise RuntimeError(f"{spec} did not run the same episodes as full compute")
            wins = [bool(by[k]["success"]) for k in order]
            base = [bool(full[k]["success"]) for k in order]
            s = r["summary"]
            not_recomputed = s.get("reused", 0.0) + s.get("pruned", 0.0)
            per_task = {}
            for t in tasks:
                ks = [k for k in order if k[0] == t]
                d = paired_difference(
                    [full[k]["success"] for k in ks], [by[k]["success"] for k in ks], o.bootstrap
                )
                per_task[t] = {
                    "success_rate": float(np.mean([by[k]["success"] for k in ks])),
                    "difference": d["difference"],
                    "ci95": d["ci95"],
                }
            diff = paired_difference(base, wins, o.bootstrap)
            n_win = sum(wins)
            rows.append(
                {
                    "group": group,
                    "policy": g["policy"] if spec == "full" else g["rows_on"],
                    "config": spec,
                    "success_rate": n_win / len(wins),
                    "ci95": list(wilson(n_win, len(wins))),
                    "episodes": len(wins),
                    "difference": diff,
                    "tasks": per_task,
                    "action_error": float(np.mean(r["action_errors"]))
                    if r["action_errors"]
                    else None,
                    "flops_ratio": s.get("flops_ratio"),
                    "recomputed": s.get("recomputed"),
                    "reused": s.get("reused"),
                    "pruned": s.get("pruned"),
                    "reused_share": (s["reused"] / not_recomputed) if not_recomputed else None,
                    "closed_loop_p50_ratio": _p50(r["episodes"]) / base_lat if base_lat else None,
                    # Each episode's outcome in (task, seed) order, so any two rows of the group
                    # can be paired later (the order is the group's "full" row's "keys").
                    "outcomes": [int(w) for w in wins],
                }
            )
            if spec == "full":
                rows[-1]["keys"] = [list(k) for k in order]
    triage_leads(rows, o.bootstrap)
    return rows


def triage_leads(rows: list[dict], resamples: int = 2000) -> None:
    """TRIAGE's paired lead over every other token method at the same budget (the paper's
    "beats the strongest baseline by 24.4 pp" is this, at B = 7%): ``row["triage_lead"]``."""
    from vlarun.sim.evaluate import paired_difference

    by = {(r["group"], r["config"]): r for r in rows}
    for r in rows:
        method, _, budget = r["config"].partition(":")
        tri = by.get((r["group"], f"triage:{budget}"))
        if not budget or method == "triage" or tri is None or r["group"] != "tokens":
            continue
        d = paired_difference(r["outcomes"], tri["outcomes"], resamples)
        r["triage_lead"] = {k: d[k] for k in ("difference", "ci95", "only_base", "only_other")}


def _p50(episodes: list[dict]) -> float | None:
    lat = [x for e in episodes for x in e["latency_ms"]]
    return float(np.percentile(lat, 50)) if lat else None


# ---------------------------------------------------------------------------------------------
# Time ratios, quiet, by replay


def timing(o, groups: dict, log) -> list[dict]:
    """Per group: every configuration and full compute over one recorded stream, taking turns
    (``time_streams``); the token rows also on the ~1B random-weight shape."""
    from vlarun.bench.replay import time_streams
    from vlarun.bench.shapes import large_label, large_policy, synthetic_stream
    from vlarun.policy.base import Policy
    from vlarun.sim.evaluate import build_candidate

    out = []
    for group, g in groups.items():
        policy = Policy.from_checkpoint(g["checkpoint"])
        rows_policy = Policy.from_checkpoint(g["rows_checkpoint"])
        stream = [
            (ins, views, st)
            for ins, obs in (ep for eps in g["replay"].values() for ep in eps)
            for views, st, _ in obs
        ][: o.latency_queries]
        if not stream:
            continue
        specs = ["full"] + g["specs"]
        candidates = [
            build_candidate(policy if s == "full" else rows_policy, s, o.demos) for s in specs
        ]
        out += _timed(group, g["policy"], specs, candidates, stream, time_streams, log)
        if o.large and group in ("tokens", "efficientvla"):
            # ~1B shapes: the token rows on the OpenVLA-like AR, EfficientVLA's parts on the
            # CogACT-like DiT (layers and MLP channels calibrated on the synthetic frames).
            family = "autoregressive" if group == "tokens" else "diffusion"
            big = large_policy(family=family)
            synth = synthetic_stream(
                big.model.cfg.image_size, max(4, o.latency_queries // 10), stream[0][0]
            )
            calib = [(big.image_tensor(f), big.text_ids(ins)) for ins, f, _ in synth]
            cands = [_large_candidate(big, s, calib) for s in specs]
            out += _timed(group, large_label(big), specs, cands, synth, time_streams, log)
    return out


def _large_candidate(big, spec: str, samples: list):
    """A configuration on a random-weight ~1B policy (EfficientVLA parts calibrated on
    ``samples`` instead of demo frames, which a random model has none of)."""
    from vlarun.policy.methods import DEPTH_PARTS
    from vlarun.sim.evaluate import build_candidate

    head, _, part = spec.partition(":")
    if head == "evla":
        return DEPTH_PARTS[part].apply(big, samples)
    return build_candidate(big, spec)


def _timed(group, model, specs, candidates, stream, time_streams, log) -> list[dict]:
    rows = []
    timings = time_streams(candidates, stream)
    full = timings[0]
    for spec, t in zip(specs, timings, strict=True):
        rows.append(
            {"group": group, "model": model, "config": spec}
            | t
            | {
                "prefill_ratio": t["prefill_ms"] / full["prefill_ms"],
                "e2e_ratio": t["e2e_ms"] / full["e2e_ms"],
            }
        )
        log(
            f"timing {model} {spec}: prefill x{t['prefill_ms'] / full['prefill_ms']:.2f}, "
            f"e2e x{t['e2e_ms'] / full['e2e_ms']:.2f}"
        )
    return rows


# ---------------------------------------------------------------------------------------------
# The settings file


def settings_rows(rows: list[dict]) -> list[dict]:
    """Rows the runtime executes exactly as measured, in ``sched/settings.json``'s format, each
    naming the model it was measured on (a distilled student's rows name its checkpoint in the
    source: the runtime must run that student for them to hold)."""
    from vlarun.sched.settings_table import IDENTITY

    out = [
        {"knob": k, "value": v, "relative_success": 1.0, "source": "identity"}
        for k, v in IDENTITY.items()
    ]
    by_group = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    for rs in by_group.values():
        full = next(r for r in rs if r["config"] == "full")
        base = full["success_rate"]
        if base <= 0:
            continue
        for r in rs:
            knob, value = _knob(r["config"])
            if knob is None:
                continue
            d = r["difference"]
            out.append(
                {
                    "knob": knob,
                    "value": value,
                    "models": [_model_name(r["policy"])],
                    "relative_success": r["success_rate"] / base,
                    "lower": max(0.0, (base + d["ci95"][0]) / base),
                    "upper": (base + d["ci95"][1]) / base,
                    "source": (
                        f"vlarun bench accel --table: {r['config']} on {r['policy']}, "
                        f"success {r['success_rate']:.3f} vs full {base:.3f}, paired "
                        f"difference {d['difference']:+.3f} (95% CI {d['ci95'][0]:+.3f} .. "
                        f"{d['ci95'][1]:+.3f}), n={d['episodes']}"
                    ),
                }
            )
    return out


def _knob(spec: str) -> tuple[str | None, float | None]:
    """The plan-space knob a table configuration sets, where the runtime runs it the same way
    (TRIAGE's budget, the DiT cache, the exit sigma, int8 weights); (None, None) for the rest."""
    head, _, value = spec.partition(":")
    if "@" in spec:  # another shared layer than the runtime's (2): not a plan-space setting
        return None, None
    if head == "triage":
        return "token_budget", float(value)
    if head == "exit":
        return "early_exit_sigma", float(value)
    if spec == "int8":
        return "weights", "int8"
    if spec == "evla:cache":
        from vlarun.policy.methods import DEPTH_PARTS

        return "cache_interval", DEPTH_PARTS["cache"].cache_interval
    return None, None


def _model_name(policy: str) -> str:
    cfg = Path(_checkpoint(policy)) / "config.json"
    return json.loads(cfg.read_text())["vla"]["name"]


# ---------------------------------------------------------------------------------------------
# Driver, files, plots, text


def run_table(o, log) -> dict:
    t0 = time.time()
    groups = closed_loop(o, log)
    rows = analyse(o, groups)
    result = {
        "table": rows,
        "options": to_dict(o),
        "quick": o.quick,
        "student": bool(o.student),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "command": invoked_command("vlarun bench accel --table"),
        "closed_loop_wall_s": round(time.time() - t0, 1),
        "tasks": sorted({t for r in rows for t in r["tasks"]}),
    }
    if o.timing:
        t1 = time.time()
        result["timing"] = timing(o, groups, log)
        result["timing_wall_s"] = round(time.time() - t1, 1)
    result["settings"] = settings_rows(rows)
    return result


def write_table(result: dict, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    # Runs of different groups (e.g. the token rows at 100 episodes, the EfficientVLA parts at
    # 30) get their own files, so one does not overwrite the other.
    groups = "-".join(dict.fromkeys(r["group"] for r in result["table"]))
    stem = f"accel_table{'_quick' if result['quick'] else ''}_{groups}_{result['date'][:10]}"
    files = {
        "json": str(out / f"{stem}.json"),
        "settings": str(out / f"{stem}_settings.json"),
        "plot": str(out / f"{stem}.png"),
    }
    about = (
        "Accelerator settings measured by `vlarun bench accel --table` on vlarun's own "
        "policies in closed loop (Meta-World, paired seeds): relative_success = success "
        "with the setting / success of full compute on the same episodes; lower/upper = "
        "(full + paired bootstrap 95% bound of the difference) / full. Only settings the "
        "runtime executes exactly as measured are listed (TRIAGE budgets, the DiT cache, "
        "the early-exit sigma); layer and MLP pruning are model transforms it does not "
        f"load yet. Measured {result['date']}: {result['command']}"
    )
    Path(files["settings"]).write_text(
        json.dumps({"_about": about, "settings": result["settings"]}, indent=1)
    )
    plot_table(result["table"], files["plot"])
    Path(files["json"]).write_text(json.dumps(result | {"files": files}, indent=1))
    return files


def plot_table(rows: list[dict], path: str) -> None:
    """Paired difference to full compute with its 95% interval, per configuration, beside the
    action error: one panel pair per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r["group"] for r in rows))
    heights = [max(2.0, 0.28 * sum(r["group"] == g for r in rows)) for g in groups]
    fig, axes = plt.subplots(
        len(groups),
        2,
        figsize=(11, sum(heights) + 1),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for (ax_d, ax_e), g in zip(axes, groups, strict=True):
        rs = [r for r in rows if r["group"] == g and r["config"] != "full"]
        y = np.arange(len(rs))[::-1]
        d = [r["difference"]["difference"] * 100 for r in rs]
        lo = [(r["difference"]["difference"] - r["difference"]["ci95"][0]) * 100 for r in rs]
        hi = [(r["difference"]["ci95"][1] - r["difference"]["difference"]) * 100 for r in rs]
        ax_d.errorbar(d, y, xerr=[lo, hi], fmt="o", capsize=3)
        ax_d.axvline(0, color="k", lw=0.8)
        ax_d.axvline(-3, color="grey", ls=":", lw=0.8)
        ax_d.set_yticks(y, [r["config"] for r in rs], fontsize=8)
        full = next(r for r in rows if r["group"] == g and r["config"] == "full")
        ax_d.set(
            xlabel="success - full compute (pp), paired 95% CI",
            title=f"{g} on {full['policy']} (full {full['success_rate']:.0%}, "
            f"n={full['episodes']})",
        )
        ax_e.barh(y, [r["action_error"] or 0.0 for r in rs])
        ax_e.set_yticks(y, [])
        ax_e.set(xlabel="mean |action - full's| on full's observations", title="fidelity")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(r: dict) -> str:
    lines = [f"vlarun bench accel --table, {r['date']}, closed loop {r['closed_loop_wall_s']} s"]
    lines += [
        "",
        "| group | config | success (95% CI) | paired diff (95% CI) | n | action error "
        "| FLOPs | reused share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in r["table"]:
        d = x["difference"]
        err = f"{x['action_error']:.4f}" if x["action_error"] is not None else "-"
        flops = f"{x['flops_ratio']:.2f}" if x.get("flops_ratio") is not None else "-"
        share = f"{x['reused_share']:.0%}" if x.get("reused_share") is not None else "-"
        lines.append(
            f"| {x['group']} | {x['config']} | {x['success_rate']:.1%} ({x['ci95'][0]:.0%}-"
            f"{x['ci95'][1]:.0%}) | {d['difference'] * 100:+.1f} pp ({d['ci95'][0] * 100:+.1f} "
            f"to {d['ci95'][1] * 100:+.1f}) | {x['episodes']} | {err} | {flops} | {share} |"
        )
    leads = [x for x in r["table"] if x.get("triage_lead")]
    if leads:
        lines += [
            "",
            "| TRIAGE vs | paired lead (95% CI) | only TRIAGE | only the baseline |",
            "|---|---|---|---|",
        ]
        for x in leads:
            d = x["triage_lead"]
            lines.append(
                f"| {x['config']} | {d['difference'] * 100:+.1f} pp "
                f"({d['ci95'][0] * 100:+.1f} to {d['ci95'][1] * 100:+.1f}) | "
                f"{d['only_other']} | {d['only_base']} |"
            )
    tasks = r["tasks"]
    lines += [
        "",
        "| config | " + " | ".join(t.removesuffix("-v3") for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for x in r["table"]:
        cells = [f"{x['tasks'][t]['success_rate']:.0%}" if t in x["tasks"] else "" for t in tasks]
        lines.append(f"| {x['group']}/{x['config']} | " + " | ".join(cells) + " |")
    if r.get("timing"):
        lines += [
            "",
            "| model | config | prefill ms | x full | e2e ms | x full |",
            "|---|---|---|---|---|---|",
        ]
        for t in r["timing"]:
            lines.append(
                f"| {t['model']} | {t['config']} | {t['prefill_ms']:.1f} | "
                f"{t['prefill_ratio']:.2f} | {t['e2e_ms']:.1f} | {t['e2e_ratio']:.2f} |"
            )
    for kind, path in r.get("files", {}).items():
        lines.append(f"{kind}: {path}")
    return "\n".join(lines)


def log_to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
