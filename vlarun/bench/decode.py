"""`vlarun bench decode`: CEED-VLA decoding of action tokens on Meta-World.

Methods (ids as in the issue):
  ar              greedy autoregressive decoding (n - 1 one-token forwards after the prefill);
  jacobi          plain Jacobi decoding to the fixed point (output == ar, token for token);
  jacobi-exit     Jacobi + early exit at sigma, on the teacher;
  distilled-exit  Jacobi + early exit at sigma, on the consistency-distilled student;
  distilled       plain Jacobi on the student (the paper's "consistency, no exit" ablation).

Speed: every method replays the same observations (recorded from ar's own closed-loop episodes),
after a warm-up; per query, tokens/s = action tokens / decode-stage seconds (the prefix is
prefilled once per query in every method and is not part of the decode time); mean, min and max
are over queries. Two ratios to ar: ``speedup`` (of the mean tokens/s, the issue's measure) and
``time_speedup`` (of the mean decode time, i.e. of total tokens over total time). A method whose
speed varies from query to query has a mean tokens/s above its tokens per mean time (fast
queries weigh more), so ``time_speedup`` is the lower, conservative one, and the one a control
loop's average latency follows. Control rate = actions per inference / end-to-end seconds
(vision + prefill + decode). Agreement: fraction of action tokens equal to ar's on the same
queries. Success: closed loop on held-out seeds, Wilson 95% intervals. ``--quick`` is a reduced
version (a few minutes); it is not a result to quote.

Exit rules (``--exit-over``): ``all``, the paper's minimum confidence over every action token,
and ``unsettled``, over the tokens the iterations so far have not made exact (``accel.jacobi``;
not in the paper). ``--exit-over all,unsettled`` times both in one interleaved run; each exit
row names its rule, and ``goals_by_exit_over`` holds the goals under each. ``--max-iters``
caps the exit methods' iterations (the issue's iteration cap; plain Jacobi is never capped, it
must stay exact): a query that does not exit then returns its state at the cap.

A preset's name (``--policy tiny-pi0-fast``) benchmarks its random weights: there is no closed
loop to run (success is "n/a"), and the queries are seeded random frames with a few prompts. A
FAST policy's codes vary in length: tokens/s counts each query's own code (END included), the
Jacobi rows slide a ``--window`` of guesses along it (``accel.jacobi_window``), and agreement
is over the autoregressive row's tokens.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vlarun.accel.jacobi import EXIT_OVER, INITS, make_decoder
from vlarun.bench.replay import interleaved_runs
from vlarun.config import POLICY_FLAGS_RETIRED, invoked_command, items, opt, to_dict
from vlarun.models.fast_head import code_lengths
from vlarun.policy.base import Policy
from vlarun.sim.evaluate import POLICY_DIR, TRAIN_TASKS

SIGMAS = (0.4, 0.5, 0.6, 0.7)
METHODS = ("ar", "jacobi", "jacobi-exit", "distilled-exit", "distilled")


@dataclass(frozen=True)
class BenchDecodeOptions:
    """Decoding benchmark: AR vs Jacobi vs Jacobi + early exit vs distilled + early exit."""

    quick: bool = opt(False, "reduced run (a few minutes): 2 tasks, 2 episodes, sigma 0.5")
    policy: str = opt(
        "tiny-ar",
        "autoregressive policy: shipped name or checkpoint directory",
        replaces=POLICY_FLAGS_RETIRED,
    )
    distilled: str = opt("tiny-ar-ceed", "distilled policy (shipped name or directory); '' = skip")
    sigmas: tuple[float, ...] = opt(SIGMAS, "early-exit thresholds")
    tasks: tuple[str, ...] = opt(tuple(TRAIN_TASKS), "Meta-World tasks (names, or mt10)")
    episodes: int = opt(10, "episodes per task and method")
    seed: int = opt(0, "first held-out seed")
    max_steps: int | None = opt(None, "episode step limit (default: each task's)")
    queries: int = opt(60, "replayed observations timed per method")
    # Pinned and recorded (torch's default follows the machine): one thread is what the
    # committed results used.
    threads: int = opt(1, "torch threads for the whole run; 0 = torch's default")
    exit_over: tuple[str, ...] = opt(
        ("all",), "tokens the exit rules test: all (the paper), unsettled; both: side by side"
    )
    max_iters: int = opt(0, "cap on the exit methods' Jacobi iterations; 0 = none (n - 1)")
    # Each student leaves the guess it was distilled from (`vlarun distill --init`); the
    # shipped one learned "repeat". Plain Jacobi stays exact from either.
    init: str = opt(
        "random",
        "initial guess of the teacher's Jacobi rows: random (the paper) or repeat (y_1 repeated)",
        choices=list(INITS),
    )
    distilled_init: str = opt(
        "repeat",
        "initial guess of the distilled rows (the one the student was distilled from)",
        choices=list(INITS),
    )
    window: int = opt(0, "FAST codes: guesses per Jacobi window; 0 = the expected code length")
    # A real-size preset (UniVLA's Emu3-8B, LLaVA's Vicuna-7B) does not fit this machine whole:
    # its random weights at the first N layers, each layer's shape unchanged, time the decode of
    # those N layers (speed only, labelled; a preset's random weights run no closed loop).
    llm_layers: int = opt(0, "a preset's random weights at this many LM layers (0: all)")
    dtype: str = opt(
        "float32", "a preset's random weights in this dtype", choices=["float32", "bfloat16"]
    )
    out: str | None = opt("benchmarks/results", "directory for the JSON and plot")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    json: bool = opt(False, "print one JSON object")

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.queries < 1:
            raise ValueError("need episodes >= 1 and queries >= 1")
        if self.max_iters < 0:
            raise ValueError(f"max_iters must be >= 0 (0: no cap), got {self.max_iters}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if self.llm_layers < 0:
            raise ValueError(f"llm_layers must be >= 0 (0: all), got {self.llm_layers}")
        if self.window < 0:
            raise ValueError(
                f"window must be >= 0 (0: the expected code length), got {self.window}"
            )
        for name in ("init", "distilled_init"):
            if getattr(self, name) not in INITS:
                raise ValueError(f"{name} must be one of {INITS}, got {getattr(self, name)!r}")
        for s in self.sigma_list:
            if not 0.0 < s <= 1.0:
                raise ValueError(f"sigma must be in (0, 1], got {s}")
        rules = self.exit_rules
        if not rules or any(r not in EXIT_OVER for r in rules) or len(set(rules)) < len(rules):
            raise ValueError(
                f"exit_over must list distinct rules from {EXIT_OVER}, got {self.exit_over!r}"
            )

    @property
    def sigma_list(self) -> list[float]:
        return items(self.sigmas, float)

    @property
    def exit_rules(self) -> list[str]:
        return items(self.exit_over)

    def reduced(self) -> BenchDecodeOptions:
        """The --quick settings (explicitly given smaller values are kept)."""
        from vlarun.sim.tasks import parse_tasks

        return dataclasses.replace(
            self,
            tasks=tuple(parse_tasks(self.tasks)[:2]),
            episodes=min(self.episodes, 2),
            sigmas=(0.5,) if items(self.sigmas, float) == list(SIGMAS) else self.sigmas,
            queries=min(self.queries, 12),
        )


def _load(name: str, presets: bool = False, dtype: str = "float32", llm_layers: int = 0):
    """A checkpoint directory or shipped policy; with ``presets``, also a preset's random
    weights (``Policy.from_preset``, in ``dtype``, at ``llm_layers`` of its LM layers)."""
    from vlarun.models.presets import PRESETS
    from vlarun.policy.base import Policy

    path = Path(name)
    if not (path / "config.json").exists():
        path = POLICY_DIR / name
    if not (path / "config.json").exists():
        if presets and name in PRESETS:
            return Policy.from_preset(
                name, dtype=getattr(torch, dtype), llm_layers=llm_layers or None
            )
        raise FileNotFoundError(f"no policy {name!r} (neither a directory nor under {POLICY_DIR})")
    return Policy.from_checkpoint(path)


def random_weights(name: str) -> bool:
    """``name`` means a preset's random weights (no checkpoint of that name or path)."""
    from vlarun.models.presets import PRESETS

    shipped = (Path(name) / "config.json").exists() or (POLICY_DIR / name / "config.json").exists()
    return name in PRESETS and not shipped


# (method, sigma, exit rule): sigma and rule are None for the methods without early exit.
Method = tuple[str, float | None, str | None]


def method_rows(o: BenchDecodeOptions, have_distilled: bool) -> list[Method]:
    exits = [(s, rule) for rule in o.exit_rules for s in o.sigma_list]
    rows: list[Method] = [("ar", None, None), ("jacobi", None, None)]
    rows += [("jacobi-exit", s, rule) for s, rule in exits]
    if have_distilled:
        rows += [("distilled-exit", s, rule) for s, rule in exits] + [("distilled", None, None)]
    return rows


def decoding(
    base: Policy,
    method: Method,
    seed: int = 0,
    max_iters: int = 0,
    init: str = "random",
    window: int = 0,
) -> Policy:
    """The policy decoding with ``method``; ``max_iters`` (0: none) caps exit methods only;
    Jacobi methods start from ``init`` guesses (and slide ``window`` guesses along a FAST
    code; 0: its expected length)."""
    name, sigma, rule = method
    decoder = {"distilled-exit": "jacobi-exit", "distilled": "jacobi"}.get(name, name)
    dec = make_decoder(decoder, sigma, seed, rule or "all", max_iters or None, init, window or None)
    return base.with_hooks(decoder=dec)


# ---------------------------------------------------------------------------------------------
# Timing on a replayed stream


def time_methods(policies: list[Policy], stream: list[tuple[str, np.ndarray]]) -> list[dict]:
    """Per-query decode speed and end-to-end latency of each policy over (instruction, image)
    queries, the methods taking turns query by query (``replay.interleaved_runs``)."""
    runs = interleaved_runs(policies, stream, warmup=3)
    return [summarise_runs(p, r) for p, r in zip(policies, runs, strict=True)]


def decoded_tokens(policy: Policy, ids: torch.Tensor) -> int:
    """Tokens one query decoded (ids (1, n)): all n, or a FAST code's own, END included."""
    fast = policy.model.cfg.fast
    return int(code_lengths(ids, fast.end_id)[0]) if fast is not None else ids.shape[1]


def summarise_runs(policy: Policy, runs: list) -> dict:
    cfg = policy.model.cfg
    times = [{s.name: s.seconds for s in run.timings} for run in runs]
    ids = [run.outputs["action_ids"] for run in runs]
    counts = [decoded_tokens(policy, x) for x in ids]
    speeds = [n / t["decode"] for n, t in zip(counts, times, strict=True)]
    room = cfg.action_token_room  # FAST codes END-padded to the cap, to stack and compare
    end = cfg.fast.end_id if cfg.fast is not None else 0
    padded = [torch.cat((x[0], x.new_full((room - x.shape[1],), end))) for x in ids]
    e2e_ms = [sum(t.values()) * 1e3 for t in times]
    s = policy.hooks.decoder.summary()
    return {
        "tokens_per_s_mean": statistics.mean(speeds),
        "tokens_per_s_min": min(speeds),
        "tokens_per_s_max": max(speeds),
        "decode_ms_mean": statistics.mean(t["decode"] * 1e3 for t in times),
        "e2e_ms_mean": statistics.mean(e2e_ms),
        # actions/s: a chunk of ``horizon`` actions per inference, executed open loop
        "control_rate_hz": policy.model.cfg.horizon * 1e3 / statistics.mean(e2e_ms),
        "iterations_mean": s["iterations_mean"],
        "iterations_max": s["iterations_max"],
        "iterations_histogram": s["iterations_histogram"],
        "fixed_per_iteration_mean": s["fixed_per_iteration_mean"],
        "exited_fraction": s["exited_fraction"],
        "queries": len(runs),
        "tokens_mean": statistics.mean(counts),
        "_ids": torch.stack(padded),
        "_counts": torch.tensor(counts),
    }


def agreement(ids: torch.Tensor, ar_ids: torch.Tensor, ar_counts: torch.Tensor) -> float:
    """Fraction of the autoregressive rows' tokens (each query's own count) equal to ``ids``'
    at the same place."""
    inside = torch.arange(ar_ids.shape[1])[None] < ar_counts[:, None]
    return float(((ids == ar_ids) & inside).sum() / inside.sum())


def preset_stream(policy: Policy, queries: int) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """``queries`` observations of ``shapes.synthetic_stream``'s moving block (each view the
    same frame), for a policy with random weights: nothing to succeed at, nothing to replay."""
    from vlarun.bench.shapes import synthetic_stream

    cfg = policy.model.cfg
    instruction = "pick up the cup"
    try:
        policy.text_ids(instruction)
    except ValueError:
        # A real-size preset's byte-level stand-in tokenizer spells it in more tokens than the
        # model takes (UniVLA: 62 against 48); the template alone still fits (as bench roofline).
        instruction = ""
    stream = synthetic_stream(cfg.image_size, queries, instruction, policy.state_size)
    if cfg.num_images == 1:
        return stream
    return [(text, np.stack([f] * cfg.num_images), st) for text, f, st in stream]


NO_EPISODES = {"success_rate": None, "ci95": None, "episodes": 0}


def recorded_stream(
    recorded: list[dict], queries: int
) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """``queries`` (instruction, image, state) observations spread evenly over the recorded
    episodes' observations."""
    obs = [(ep["instruction"], img, st) for ep in recorded for img, st, _ in ep["obs"]]
    if not obs:
        raise RuntimeError("the autoregressive run recorded no observations")
    pick = np.linspace(0, len(obs) - 1, min(queries, len(obs))).round().astype(int)
    return [obs[i] for i in pick]


# ---------------------------------------------------------------------------------------------
# Driver


def run(o: BenchDecodeOptions, progress: bool = True) -> dict:
    """The benchmark under ``o.threads`` torch threads (the caller's count is restored)."""
    from vlarun.models.device import cpu_only

    cpu_only(o.device, "vlarun bench decode")
    before = torch.get_num_threads()
    if o.threads:
        torch.set_num_threads(o.threads)
    try:
        return _run(o, progress)
    finally:
        torch.set_num_threads(before)


def _run(o: BenchDecodeOptions, progress: bool) -> dict:
    from vlarun.bench.accel import closed_loop  # duck-typed: tasks, episodes, seed, max_steps

    if o.quick:
        o = o.reduced()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    t0 = time.time()
    timing_only = random_weights(o.policy)
    if (o.llm_layers or o.dtype != "float32") and not timing_only:
        raise ValueError(
            f"--llm-layers and --dtype shape a preset's random weights; {o.policy} is a trained "
            "policy (it runs as saved)"
        )
    teacher = _load(o.policy, True, o.dtype, o.llm_layers)
    if teacher.model.cfg.family != "autoregressive":
        raise ValueError(f"{o.policy} is not an autoregressive (action-token) policy")
    student = None
    if o.distilled:
        try:
            student = _load(o.distilled)
        except FileNotFoundError as e:
            log(f"skipping distilled-exit: {e}")
    if student is not None and not same_shape(student, teacher):
        log(f"skipping distilled-exit: {o.distilled} is not a student of {o.policy}'s shape")
        student = None
    if timing_only:
        log(f"{o.policy}: a preset's random weights; timing on synthetic frames, no closed loop")
        ar, stream = None, preset_stream(teacher, o.queries)
    else:
        ar = closed_loop(decoding(teacher, ("ar", None, None)), o, record=True)
        stream = recorded_stream(ar["recorded"], o.queries)
    methods = method_rows(o, student is not None)
    bases = [student if m[0].startswith("distilled") else teacher for m in methods]
    inits = [o.distilled_init if m[0].startswith("distilled") else o.init for m in methods]
    policies = [
        decoding(b, m, o.seed, o.max_iters, i, o.window)
        for b, m, i in zip(bases, methods, inits, strict=True)
    ]
    timings = time_methods(policies, stream)
    log(f"timed {len(methods)} methods on {len(stream)} queries")
    rows, ar_ids, ar_counts = [], timings[0]["_ids"], timings[0]["_counts"]
    for m, base, policy, timing, init in zip(methods, bases, policies, timings, inits, strict=True):
        (method, sigma, rule), ids = m, timing.pop("_ids")
        timing.pop("_counts")
        fresh = decoding(base, m, o.seed, o.max_iters, init, o.window)  # no timing-run state
        res = NO_EPISODES if ar is None else ar if method == "ar" else closed_loop(fresh, o)
        # The cap the decoder ran with (``decoding`` applies it to exit methods only).
        dcfg = getattr(policy.hooks.decoder, "cfg", None)
        cap, guess = getattr(dcfg, "max_iters", None), getattr(dcfg, "init", None)
        row = (
            {"method": method, "sigma": sigma, "exit_over": rule, "max_iters": cap, "init": guess}
            | timing
            | {
                "token_agreement_with_ar": agreement(ids, ar_ids, ar_counts),
                "success_rate": res["success_rate"],
                "ci95": res["ci95"],
                "episodes": res["episodes"],
            }
        )
        rows.append(row)
        log(
            f"{_label(row, ' ')}: {row['tokens_per_s_mean']:.0f} tokens/s "
            f"({row['iterations_mean']:.2f} it), success {_success(row)}"
        )
    ar_speed, ar_ms = rows[0]["tokens_per_s_mean"], rows[0]["decode_ms_mean"]
    for r in rows:
        r["speedup"] = r["tokens_per_s_mean"] / ar_speed
        r["time_speedup"] = ar_ms / r["decode_ms_mean"]
    result = {
        "quick": o.quick,
        "options": to_dict(o),
        "policy": o.policy,
        "random_weights": timing_only,
        "llm_layers": teacher.model.cfg.llm.num_layers,
        "dtype": o.dtype,
        "distilled": o.distilled if student is not None else None,
        "action_tokens": teacher.model.cfg.num_action_tokens,  # FAST: the expected count
        "max_tokens": teacher.model.cfg.action_token_room,
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "command": invoked_command("vlarun bench decode" + (" --quick" if o.quick else "")),
        "rows": rows,
        # The first listed rule's (the paper's by default); every rule's when several ran.
        "goals": goals(rows, exit_over=o.exit_rules[0]),
        "goals_by_exit_over": {rule: goals(rows, exit_over=rule) for rule in o.exit_rules},
        "wall_s": round(time.time() - t0, 1),
    }
    if o.out:
        result["files"] = write_results(result, Path(o.out))
    return result


def goals(rows: list[dict], sigma: float = 0.5, exit_over: str = "all") -> dict:
    """The issue's goals for distilled-exit at ``sigma`` under the ``exit_over`` rule (None
    where that row is absent)."""
    ar = rows[0]
    d = next(
        (
            r
            for r in rows
            if r["method"] == "distilled-exit"
            and r["sigma"] == sigma
            and r.get("exit_over", "all") == exit_over
        ),
        None,
    )
    if d is None:
        return {"speedup_ge_4_5": None, "min_above_ar_mean": None, "success_within_3pp": None}
    return {
        "speedup": d["speedup"],
        "speedup_ge_4_5": d["speedup"] >= 4.5,
        "speedup_ge_3": d["speedup"] >= 3.0,
        "time_speedup": d["time_speedup"],
        "time_speedup_ge_3": d["time_speedup"] >= 3.0,
        "min_above_ar_mean": d["tokens_per_s_min"] > ar["tokens_per_s_mean"],
        "success_within_3pp": None
        if ar["success_rate"] is None
        else d["success_rate"] >= ar["success_rate"] - 0.03,
    }


def same_shape(student: Policy, teacher: Policy) -> bool:
    """Could ``student`` be a distilled copy of ``teacher`` (same LM, head and action shape)?"""
    a, b = student.model.cfg, teacher.model.cfg
    keys = ("llm", "family", "action_dim", "chunk", "fast", "num_action_tokens")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _success(r: dict) -> str:
    if r["success_rate"] is None:
        return "n/a"
    return f"{r['success_rate']:.1%} ({r['ci95'][0]:.0%}-{r['ci95'][1]:.0%})"


def write_results(result: dict, out: Path) -> dict:
    """decode_<date>.json and decode_<date>.png (tokens/s with min-max; success with CI)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"decode{'_quick' if result['quick'] else ''}_{result['date'][:10]}"
    files = {"json": str(out / f"{stem}.json"), "plot": str(out / f"{stem}.png")}
    plot(result["rows"], files["plot"])
    Path(files["json"]).write_text(json.dumps(result | {"files": files}, indent=1))
    return files


def _label(r: dict, sep: str = "\n") -> str:
    """Method, sigma and the exit rule when not the paper's ('... sigma 0.5 unsettled')."""
    if r["sigma"] is None:
        return r["method"]
    rule = r.get("exit_over", "all")
    return f"{r['method']}{sep}sigma {r['sigma']:g}" + ("" if rule == "all" else f" {rule}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Two rules x four sigmas make ~20 bars: widen with the row count so labels stay apart.
    fig, (ax_v, ax_s) = plt.subplots(1, 2, figsize=(max(13.0, 1.0 + 0.75 * len(rows)), 5.0))
    x = np.arange(len(rows))
    mean = np.array([r["tokens_per_s_mean"] for r in rows])
    lo = mean - np.array([r["tokens_per_s_min"] for r in rows])
    hi = np.array([r["tokens_per_s_max"] for r in rows]) - mean
    palette = {"ar": "C0", "jacobi": "C0", "jacobi-exit": "C1", "distilled-exit": "C2"}
    unsettled = {"jacobi-exit": "C4", "distilled-exit": "C3"}  # the rule not in the paper
    colors = [
        (unsettled if r.get("exit_over") == "unsettled" else palette).get(r["method"], "C2")
        for r in rows
    ]
    ax_v.bar(x, mean, yerr=[lo, hi], capsize=3, color=colors)
    ax_v.axhline(rows[0]["tokens_per_s_mean"], color="k", ls="--", lw=1, label="ar mean")
    ax_v.set(ylabel="action tokens / s (mean, min-max)", title="decode speed")
    ax_v.legend(fontsize=8)
    if rows[0]["success_rate"] is not None:
        succ = np.array([r["success_rate"] for r in rows])
        err = [
            succ - np.array([r["ci95"][0] for r in rows]),
            np.array([r["ci95"][1] for r in rows]) - succ,
        ]
        ax_s.bar(x, succ, yerr=err, capsize=3, color=colors)
    ax_s.set(ylabel="success (95% CI)", title="closed loop", ylim=(0, 1))
    for ax in (ax_v, ax_s):
        ax.set_xticks(x, [_label(r, " ") for r in rows], rotation=60, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_result(r: dict) -> str:
    weights = ", random weights (no closed loop)" if r.get("random_weights") else ""
    if r.get("random_weights") and r.get("llm_layers"):
        weights += f", {r['llm_layers']} LM layers in {r.get('dtype', 'float32')}"
    cap = r.get("max_tokens", r["action_tokens"])
    tokens = f"{r['action_tokens']}" + (
        f" expected, at most {cap}" if cap != r["action_tokens"] else ""
    )
    lines = [
        f"vlarun bench decode ({'quick' if r['quick'] else 'full'}), {r['policy']} "
        f"({tokens} action tokens{weights}), distilled {r['distilled']}, "
        f"{r['date']}, {r['threads']} threads, {r['wall_s']} s",
        "",
        "| method | sigma | exit rule | tokens/s mean (min-max) | speedup | time speedup "
        "| iterations | tokens | control rate | agreement | success (95% CI) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        sigma = "-" if x["sigma"] is None else f"{x['sigma']:g}"
        lines.append(
            f"| {x['method']} | {sigma} | {x.get('exit_over') or '-'} "
            f"| {x['tokens_per_s_mean']:.0f} "
            f"({x['tokens_per_s_min']:.0f}-{x['tokens_per_s_max']:.0f}) | x{x['speedup']:.2f} "
            f"| x{x['time_speedup']:.2f} | {x['iterations_mean']:.2f} "
            f"| {x.get('tokens_mean', r['action_tokens']):.1f} "
            f"| {x['control_rate_hz']:.1f} Hz "
            f"| {x['token_agreement_with_ar']:.1%} | {_success(x)} |"
        )
    for rule, g in r.get("goals_by_exit_over", {"all": r["goals"]}).items():
        lines.append(f"goals (distilled-exit, sigma 0.5, exit rule {rule}): {g}")
    for kind, path in r.get("files", {}).items():
        lines.append(f"{kind}: {path}")
    return "\n".join(lines)


# `vlarun bench decode` (vlarun.cli's registry points here)
OPTIONS = {"bench-decode": BenchDecodeOptions}
RUN = {"bench-decode": run}
SHOW = {"bench-decode": lambda r: print(format_result(r))}
