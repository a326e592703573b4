"""`vlarun predict | plan | profile | fleet`: options, commands and printers.

cli.py registers these by name and imports this module only when the parser is built; heavy
imports (torch, the model code) happen inside the commands.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.config import items, opt
from vlarun.sched.catalog import THIS_CPU
from vlarun.sched.plan_options import PlanOptions, make_scheduler

# ---------------------------------------------------------------------------------------------
# predict


@dataclass(frozen=True)
class PredictOptions:
    """Predicted per-stage and end-to-end latency and energy (modelled) of a whole model on one
    device."""

    model: str | None = opt(None, "model preset (see `vlarun info`)")
    # A catalog device is named by its role in every command (plan, fleet, run-robot: --robot-
    # device / --edge-device); --device is a torch device everywhere, so here it is an old name.
    robot_device: str | None = opt(
        None,
        "the robot's catalog device, the whole model on it (see --list-devices)",
        deprecated=("--device",),
    )
    edge_device: str | None = opt(
        None, "or the edge's: the same prediction, the whole model on that device"
    )
    batch: int = opt(1, "batch size")
    text_tokens: int = opt(24, "instruction tokens in the prompt")
    dtype: str | None = opt(
        None,
        "compute dtype (default: the device's best: on this CPU bf16 where it has native "
        "bf16, else fp32; bf16 on a GPU)",
        choices=["bfloat16", "float32"],
    )
    profile: str | None = opt(
        None,
        "measured profile file (from `vlarun profile`; default: the cached one for "
        "--model on this-cpu, where it exists)",
    )
    list_devices: bool = opt(False, "list the device catalog and exit")
    json: bool = opt(False, "print one JSON object")


def cmd_predict(o: PredictOptions) -> dict:
    from vlarun.models.presets import get_preset
    from vlarun.sched.catalog import get_device, load_catalog
    from vlarun.sched.cost import stage_works
    from vlarun.sched.predictor import predict_device
    from vlarun.sched.profile import Profile, cached_profile, default_dtype
    from vlarun.stages.families import Workload

    if o.list_devices:
        return {"devices": [_device_row(d) for d in load_catalog().values()]}
    if o.robot_device is not None and o.edge_device is not None:
        raise ValueError("give one of --robot-device and --edge-device (plan takes both)")
    device_id = o.robot_device or o.edge_device
    if o.model is None or device_id is None:
        raise ValueError("give --model and --robot-device (or --edge-device, or --list-devices)")
    if device_id == "cpu" or device_id.startswith("cuda"):  # a torch device, as --device is
        raise ValueError(
            f"{device_id!r} is a torch device; predict prices a catalog device: "
            "--robot-device this-cpu (or see --list-devices)"
        )
    cfg, device = get_preset(o.model), get_device(device_id)
    dtype = o.dtype or default_dtype(device)
    if dtype not in device.dtypes:
        raise ValueError(f"{device.id} does not support {dtype}")
    w = Workload(o.batch, o.text_tokens, dtype)
    path = o.profile or cached_profile(cfg.name, [device.id], dtype)
    profile = Profile.load(path) if path else None
    r = predict_device(
        stage_works(cfg, w), device, dtype, cfg.horizon, profile, cfg.name, o.batch, o.text_tokens
    )
    head = {"model": cfg.name, "device": device.id, "batch": o.batch, "dtype": dtype}
    return (
        head
        | r
        | {
            "profile_file": None if path is None else str(path),
            "estimate": _estimate(r["stages"], device.id, cfg.name, dtype),
        }
    )


def _estimate(stages: list[dict], device_id: str, model: str, dtype: str) -> str:
    """What a prediction stands on: every stage measured, or the roofline (and on this CPU,
    the command that measures it)."""
    if stages and all(s["latency_source"] == "measured" for s in stages):
        return "measured"
    how = f": run `vlarun profile --model {model} --dtype {dtype}`" if device_id == THIS_CPU else ""
    return f"roofline estimate, unprofiled{how}"


def _device_row(d) -> dict:
    return {
        "id": d.id,
        "name": d.name,
        "kind": d.kind,
        "bf16_tflops": d.bf16_tflops,
        "int8_tops": d.int8_tops,
        "mem_bw_gbs": d.mem_bw_gbs,
        "mem_gb": d.mem_gb,
        "idle_w": d.idle_w,
        "busy_w": d.busy_w,
        "compute_eff": d.compute_eff,
        "memory_eff": d.memory_eff,
        "sources": d.sources,
    }


def show_predict(r: dict) -> None:
    if "devices" in r:
        head = ("id", "bf16 TFLOPS", "BW GB/s", "mem GB", "idle W", "busy W")
        print("{:<15}{:>12}{:>9}{:>8}{:>8}{:>8}  name".format(*head))
        for d in r["devices"]:
            print(
                f"{d['id']:<15}{d['bf16_tflops']:>12.2f}{d['mem_bw_gbs']:>9.1f}{d['mem_gb']:>8.0f}"
                f"{d['idle_w']:>8.1f}{d['busy_w']:>8.1f}  {d['name']}"
            )
        return
    print(f"{r['model']} on {r['device']} (batch {r['batch']}, {r['dtype']}; energy modelled)")
    print(f"  {'stage':<14}{'ms':>10}{'J':>9}{'W':>8}  bound / source")
    for s in r["stages"]:
        print(
            f"  {s['name']:<14}{s['latency_ms']:>10.2f}{s['energy_j']:>9.3f}{s['power_w']:>8.1f}"
            f"  {s['bound']} / {s['latency_source']}"
        )
    print(f"  {'total':<14}{r['latency_ms']:>10.2f}{r['energy_j']:>9.3f}")
    print(f"  {r['actions']} actions -> {r['actions_per_joule']:.3f} actions/J (modelled)")
    print(f"  latency: {r['estimate']}" + (f" ({r['profile_file']})" if r["profile_file"] else ""))


# ---------------------------------------------------------------------------------------------
# profile


@dataclass(frozen=True)
class ProfileOptions:
    """Measure this machine: device peaks (matmul, memory copy) and every stage of a preset over
    batch sizes and prompt lengths; stores a profile file the cost model uses."""

    model: str | None = opt(
        None,
        "model preset(s) to profile at random weights, comma-separated (tiny presets run "
        "in seconds)",
        replaces=("--preset",),
    )
    batches: tuple[int, ...] = opt((1,), "batch sizes")
    text_tokens: tuple[int, ...] = opt((24,), "instruction lengths")
    dtype: str | None = opt(
        None,
        "compute dtype (default: this CPU's best, as predict and plan default to: bf16 "
        "where it has native bf16, else fp32)",
        choices=["bfloat16", "float32"],
    )
    repeats: int = opt(5, "timed repetitions per shape after one warm-up")
    out: str | None = opt(None, "profile file (default: the cache directory)")
    device_only: bool = opt(False, "only measure the device peaks (matmul, memory bandwidth)")
    device: str = opt("cpu", "cpu | cuda | cuda:N (CUDA where there is none fails at once)")
    json: bool = opt(False, "print one JSON object")


def _ints(value) -> tuple[int, ...]:
    try:
        return tuple(items(value, int))
    except ValueError as e:
        raise ValueError(f"expected integers, got {value!r}") from e


def cmd_profile(o: ProfileOptions) -> dict:
    from vlarun.models.device import cpu_only

    cpu_only(o.device, "vlarun profile")
    from vlarun.sched.catalog import measure_this_cpu
    from vlarun.sched.profile import cpu_dtype, default_profile_path, profile_preset, save_profile

    out: dict = {"device_peaks": measure_this_cpu()}
    if o.device_only:
        return out
    if o.model is None:
        raise ValueError("give --model (or --device-only)")
    presets = items(o.model)
    result: dict = {}
    for name in presets:  # one file: the host's header once, every preset's entries
        r = profile_preset(
            name, _ints(o.batches), _ints(o.text_tokens), o.dtype or cpu_dtype(), o.repeats
        )
        result = r | {"entries": result.get("entries", []) + r["entries"]}
    # The host's peaks travel with its samples: what the fleet simulator scales them from.
    result["device_peaks"] = {k: v for k, v in out["device_peaks"].items() if k != "cache_file"}
    path = save_profile(result, o.out or default_profile_path("+".join(presets)))
    return out | {"profile_file": str(path), "profile": result}


def show_profile(r: dict) -> None:
    p = r["device_peaks"]
    print(
        f"this-cpu ({p['threads']} threads): bf16 {p['bf16_gflops']:.0f} GFLOP/s, "
        f"fp32 {p['fp32_gflops']:.0f} GFLOP/s, memory {p['mem_bw_gbs']:.1f} GB/s "
        f"-> {p['cache_file']}"
    )
    if "profile" in r:
        for e in r["profile"]["entries"]:
            print(
                f"  {e['stage']:<14} batch {e['batch']:<3} text {e['text_tokens']:<4}"
                f" median {e['median_ms']:8.2f} ms  p90 {e['p90_ms']:8.2f} ms"
            )
        print(f"profile written to {r['profile_file']}")


OPTIONS = {"predict": PredictOptions, "profile": ProfileOptions}
RUN = {"predict": cmd_predict, "profile": cmd_profile}
SHOW = {"predict": show_predict, "profile": show_profile}


# ---------------------------------------------------------------------------------------------
# plan


def cmd_plan(o: PlanOptions) -> dict:
    import time

    from vlarun.sched.link import Link
    from vlarun.sched.plans import DEFAULT_FLOOR
    from vlarun.sched.predictor import DeviceState
    from vlarun.sched.scheduler import plan_row

    sched, chunk, profiles = make_scheduler(o)
    fit, reason = _fit(o, sched)
    head = {"model": sched.space.model, "robot": o.robot, "edge": o.edge, "chunk": chunk}
    if reason is not None:  # nothing may run: say why, with the numbers, instead of a plan
        return head | {"ok": False, "reason": reason, "fit": fit, "notes": list(sched.space.notes)}
    link = Link(o.bandwidth, o.rtt)
    t0 = time.perf_counter()
    d = sched.decide(link, 0.0, DeviceState(available_at=o.edge_busy_ms * 1e-3), o.top)
    decision_ms = (time.perf_counter() - t0) * 1e3
    notes = list(sched.space.notes)
    if not d.feasible:
        notes.append(
            f"no plan reaches the on-time target {sched.target:.1%} on its own (the "
            f"cost model's prior spread, {sched.cal.prior_rel:.0%}, while nothing was "
            "measured): the plan the miss budget allows, or the most punctual"
        )
    if d.relative_success is None:
        notes.append("the chosen setting's accuracy cost has not been measured")
    if THIS_CPU in (o.robot, o.edge) and not profiles:
        notes.append(
            f"{THIS_CPU}'s times are roofline estimates, unprofiled (a CPU runs small models "
            f"far off its roofline): run `vlarun profile --model {o.model} --dtype "
            f"{sched.dtype}` and plan again"
        )
    return head | {
        "slo_ms": sched.slo_s * 1e3,
        "on_time_target": sched.target,
        "dtype": sched.dtype,
        "profile_files": profiles,
        "bandwidth_mbps": o.bandwidth,
        "rtt_ms": o.rtt,
        "accuracy_floor": o.accuracy_floor
        if o.accuracy_floor is not None
        else (
            "none (unmeasured settings admitted)"
            if o.unmeasured_settings
            else f"{DEFAULT_FLOOR} (the 95% lower bound of measured success)"
        ),
        **plan_row(d),
        "fallback": not d.feasible,
        "candidates": d.candidates,
        "eligible": d.eligible,
        "decision_ms": decision_ms,
        "alternatives": d.alternatives,
        "fit": fit,
        "notes": notes,
    }


def _fit(o: PlanOptions, sched) -> tuple[list[dict], str | None]:
    """Does the whole model fit the robot and the edge (bf16 and weight-only int8)? And, when
    no candidate may run, the one-line reason (None while some candidate may)."""
    from vlarun.models.presets import get_preset
    from vlarun.sched.cost import stage_works
    from vlarun.sched.fit import fit_report, no_plan_reason
    from vlarun.stages.families import Workload

    cfg = get_preset(o.model)
    works = stage_works(cfg, Workload(1, o.text_tokens, sched.dtype))
    fit = [f.as_dict() for f in fit_report(cfg, works, sched.devices, sched.dtype)]
    if sched.allowed.any():
        return fit, None
    return fit, no_plan_reason(cfg, sched.space, works, sched.devices, sched.dtype)


def _plan_line(p: dict) -> str:
    where = " ".join(f"{s}@{r}" for s, r in p["placement"].items())
    knobs = ", ".join(f"{k}={v}" for k, v in p["settings"].items() if v is not None) or "-"
    flag = "ok  " if p["feasible"] else "SLO!"
    acc = "measured" if p["accuracy_cost_measured"] else "unmeasured"
    on = "" if p.get("on_time_p") is None else f" {100 * p['on_time_p']:5.1f}% on time"
    return (
        f"{flag} {p['latency_ms']:9.1f} ms{on} {p['energy_j']:8.3f} J "
        f"{p['actions_per_joule']:8.3f} act/J  {where}  [{knobs}; accuracy {acc}]"
    )


def show_plan(r: dict) -> None:
    if not r.get("ok", True):
        print(f"{r['model']}: robot {r['robot']} + edge {r['edge']}: no plan")
        print(f"  reason: {r['reason']}")
        for f in r["fit"]:
            print(f"  fit: {f['line']}")
        return
    print(
        f"{r['model']}: robot {r['robot']} + edge {r['edge']}, {r['bandwidth_mbps']:g} Mbps / "
        f"{r['rtt_ms']:g} ms, {r['chunk']} actions per inference, SLO {r['slo_ms']:.0f} ms on "
        f"time for {100 * r['on_time_target']:g}% of requests ({r['candidates']} candidates, "
        f"{r['eligible']} eligible, {r['decision_ms']:.2f} ms)"
    )
    print("  chosen: " + _plan_line(r))
    for a in r["alternatives"]:
        print("  alt:    " + _plan_line(a))
    for f in r["fit"]:
        print(f"  fit: {f['line']}")
    print("  energy is modelled (no power meter read)")
    for n in r["notes"]:
        print(f"  note: {n}")


OPTIONS |= {"plan": PlanOptions}
RUN |= {"plan": cmd_plan}
SHOW |= {"plan": show_plan}


# ---------------------------------------------------------------------------------------------
# fleet


def _fleet_options() -> type:
    from vlarun.world.fleet import FleetConfig

    return FleetConfig


def cmd_fleet(o) -> dict:
    """One fleet run over the load levels, or with ``--matrix`` the condition matrix; the
    result is also written to ``--out`` when given."""
    import json
    from pathlib import Path

    if o.world_sweep:
        from vlarun.bench.fleet_grid import run_world_sweep

        r = run_world_sweep(o)
    elif o.hindsight:
        from vlarun.bench.fleet_study import run_fleet_study

        r = run_fleet_study(o)
    elif o.power_sweep:
        from vlarun.bench.power_sweep import run_power_sweep

        r = run_power_sweep(o)
    elif o.matrix:
        from vlarun.bench.fleet_matrix import run_fleet_matrix

        r = run_fleet_matrix(o)
    else:
        from vlarun.world.fleet import run_fleet

        r = run_fleet(o)
    if o.out:
        Path(o.out).parent.mkdir(parents=True, exist_ok=True)
        Path(o.out).write_text(json.dumps(r, indent=1))
    return r


def show_fleet(r: dict) -> None:
    if r.get("command") == "vlarun fleet --world-sweep":
        from vlarun.bench.fleet_grid import format_sweep

        print(format_sweep(r))
    elif "cells" in r and r.get("command") == "vlarun fleet --hindsight":
        from vlarun.bench.fleet_study import format_study

        print(format_study(r))
    elif "variants" in r:
        from vlarun.bench.power_sweep import format_sweep

        print(format_sweep(r))
    elif "rows" in r:
        from vlarun.bench.fleet_matrix import format_matrix

        print(format_matrix(r))
    else:
        from vlarun.world.fleet import format_fleet

        print(format_fleet(r))


OPTIONS["fleet"] = _fleet_options
RUN["fleet"] = cmd_fleet
SHOW["fleet"] = show_fleet


def options_class(name: str) -> type:
    """The options dataclass of a command (fleet's is imported only when asked for)."""
    cls = OPTIONS[name]
    return cls if isinstance(cls, type) else cls()
