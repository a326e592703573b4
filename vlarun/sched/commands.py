"""`vlarun predict | plan | profile | fleet | bench sched`: options, commands and printers.

cli.py registers these by name and imports this module only when the parser is built; heavy
imports (torch, the model code) happen inside the commands.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlarun.cli import opt

# ---------------------------------------------------------------------------------------------
# predict


@dataclass(frozen=True)
class PredictOptions:
    """Predicted per-stage and end-to-end latency and energy (modelled) of a whole model on one
    device."""

    model: str | None = opt(None, "model preset (see `vlarun info`)")
    device: str | None = opt(None, "device id (see --list-devices)")
    batch: int = opt(1, "batch size")
    text_tokens: int = opt(24, "instruction tokens in the prompt")
    dtype: str = opt("bfloat16", "compute dtype", choices=["bfloat16", "float32"])
    profile: str | None = opt(None, "measured profile file (from `vlarun profile`) to use")
    list_devices: bool = opt(False, "list the device catalog and exit")
    json: bool = opt(False, "print one JSON object")


def cmd_predict(o: PredictOptions) -> dict:
    from vlarun.models.presets import get_preset
    from vlarun.sched.catalog import get_device, load_catalog
    from vlarun.sched.cost import stage_works
    from vlarun.sched.predictor import predict_device
    from vlarun.sched.profile import Profile
    from vlarun.stages.families import Workload

    if o.list_devices:
        return {"devices": [_device_row(d) for d in load_catalog().values()]}
    if o.model is None or o.device is None:
        raise ValueError("give --model and --device (or --list-devices)")
    cfg, device = get_preset(o.model), get_device(o.device)
    if o.dtype not in device.dtypes:
        raise ValueError(f"{device.id} does not support {o.dtype}")
    w = Workload(o.batch, o.text_tokens, o.dtype)
    profile = Profile.load(o.profile) if o.profile else None
    r = predict_device(
        stage_works(cfg, w), device, o.dtype, cfg.horizon, profile, cfg.name, o.batch, o.text_tokens
    )
    return {"model": cfg.name, "device": device.id, "batch": o.batch, "dtype": o.dtype} | r


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


# ---------------------------------------------------------------------------------------------
# profile


@dataclass(frozen=True)
class ProfileOptions:
    """Measure this machine: device peaks (matmul, memory copy) and every stage of a preset over
    batch sizes and prompt lengths; stores a profile file the cost model uses."""

    preset: str | None = opt(None, "model preset to profile (tiny presets run in seconds)")
    batches: str = opt("1", "comma-separated batch sizes")
    text_tokens: str = opt("24", "comma-separated instruction lengths")
    dtype: str = opt("float32", "compute dtype", choices=["bfloat16", "float32"])
    repeats: int = opt(5, "timed repetitions per shape after one warm-up")
    out: str | None = opt(None, "profile file (default: the cache directory)")
    device_only: bool = opt(False, "only measure the device peaks (matmul, memory bandwidth)")
    json: bool = opt(False, "print one JSON object")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from e


def cmd_profile(o: ProfileOptions) -> dict:
    from vlarun.sched.catalog import measure_this_cpu
    from vlarun.sched.profile import default_profile_path, profile_preset, save_profile

    out: dict = {"device_peaks": measure_this_cpu()}
    if o.device_only:
        return out
    if o.preset is None:
        raise ValueError("give --preset (or --device-only)")
    result = profile_preset(o.preset, _ints(o.batches), _ints(o.text_tokens), o.dtype, o.repeats)
    path = save_profile(result, o.out or default_profile_path(o.preset))
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
