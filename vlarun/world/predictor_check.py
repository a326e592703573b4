"""Predicted vs measured latency of every plan of a tiny preset, executed on this machine.

Robot and edge are both this CPU; a cut edge of the plan is a real packet encode/decode plus an
emulated link (a sleep of rtt/2 + bytes/bandwidth). The predictor gets the stage medians of a
separate profiling run and the link figures, nothing from the runs it is judged on. A second
column shows the same predictions after online calibration: each plan's first ``warmup`` runs
feed the EWMA (boundary overhead, placement residual) and only the later runs are scored.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass

from vlarun.config import opt
from vlarun.sched.calibration import Calibration
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import works_from_graph
from vlarun.sched.link import Link
from vlarun.sched.predictor import predict_placement
from vlarun.sched.profile import Profile, profile_preset
from vlarun.stages import wire
from vlarun.stages.packet import Packet

role_any = "any"


def run_plan(graph, inputs: Packet, roles: dict[str, str], link: Link) -> float:
    """Wall seconds of one inference with ``roles``; cut edges are encoded, decoded and held
    for the emulated link time. Returns the end-to-end time."""
    t0 = time.perf_counter()
    # Camera frames start on the robot; the prompt, noise and state travel with the request
    # message and are available on both sides (the predictor models it the same way).
    pool = dict(inputs.tensors)
    where = {n: ("robot" if n == "images" else role_any) for n in inputs.tensors}
    for st in graph.stages:
        role = roles[st.name]
        pk = Packet({s.name: pool[s.name] for s in st.inputs})
        if any(where[s.name] not in (role, role_any) for s in st.inputs):
            pk = _cross(pk, link)
        out = st(pk)
        pool.update(out.tensors)
        where.update(dict.fromkeys(out.tensors, role))
    if roles[graph.stages[-1].name] != "robot":
        _cross(Packet({s.name: pool[s.name] for s in graph.stages[-1].outputs}), link)
    return time.perf_counter() - t0


def _cross(pk: Packet, link: Link) -> Packet:
    frames = wire.encode(wire.Message("data", packet=pk))
    time.sleep(link.transfer_s(pk.nbytes))
    return wire.decode(frames).packet


def _errors(pred: list[float], meas: list[float]) -> dict:
    errs = [abs(p - m) / m for p, m in zip(pred, meas, strict=True)]
    return {
        "mape_pct": 100 * statistics.fmean(errs),
        "within_10pct": sum(e <= 0.10 for e in errs) / len(errs),
        "within_20pct": sum(e <= 0.20 for e in errs) / len(errs),
        "n": len(errs),
    }


def check_host(
    preset: str,
    repeats: int = 6,
    warmup: int = 2,
    bandwidth_mbps: float = 100.0,
    rtt_ms: float = 2.0,
    text_tokens: int = 24,
    dtype: str = "float32",
    seed: int = 0,
) -> dict:
    import torch

    from vlarun.models.presets import get_preset
    from vlarun.models.vla import VLA
    from vlarun.stages.families import Workload, build_graph, example_inputs

    if repeats <= warmup:
        raise ValueError("repeats must exceed warmup")
    cfg = get_preset(preset)
    prof = Profile()
    for row in profile_preset(preset, (1,), (text_tokens,), dtype, repeats=5, seed=seed)["entries"]:
        prof.add("this-cpu", row)
    measured = prof.stage_table(preset, 1, text_tokens, dtype)
    torch.manual_seed(seed)
    model = VLA(cfg).to(getattr(torch, dtype)).eval()
    graph = build_graph(cfg, model, Workload(1, text_tokens, dtype))
    images = torch.rand(1, cfg.num_images, 3, cfg.image_size, cfg.image_size)
    inputs = example_inputs(cfg, images, [[(7 * i) % 200 + 3 for i in range(text_tokens)]])
    cpu = get_device("this-cpu")
    devices, link = {"robot": cpu, "edge": cpu}, Link(bandwidth_mbps, rtt_ms)
    works = works_from_graph(cfg, graph)
    names = [s.name for s in graph.stages]
    plans, raw_p, raw_m, cal_p, cal_m = [], [], [], [], []
    with torch.no_grad():
        run_plan(graph, inputs, dict.fromkeys(names, "robot"), link)  # warm-up
        for combo in itertools.product(("robot", "edge"), repeat=len(names)):
            roles = dict(zip(names, combo, strict=True))
            cal = Calibration(alpha=0.5)
            base = predict_placement(works, roles, devices, link, measured=measured).latency_s
            times = []
            for r in range(repeats):
                m = run_plan(graph, inputs, roles, link)
                pred = predict_placement(works, roles, devices, link, cal=cal, measured=measured)
                times.append(m)
                raw_p.append(base)
                raw_m.append(m)
                if r >= warmup:
                    cal_p.append(pred.latency_s)
                    cal_m.append(m)
                cal.observe_total(combo, base, m)
            plans.append(
                {
                    "placement": roles,
                    "predicted_ms": base * 1e3,
                    "measured_median_ms": statistics.median(times) * 1e3,
                }
            )
    return {
        "preset": preset,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "link": {"bandwidth_mbps": bandwidth_mbps, "rtt_ms": rtt_ms, "emulated": True},
        "plans": plans,
        "uncalibrated": _errors(raw_p, raw_m),
        "calibrated": _errors(cal_p, cal_m),
        "scope": "in process on this CPU; cut edges = encode/decode + sleep(link time)",
    }


def format_host(r: dict) -> str:
    lines = [
        f"{r['preset']} on this CPU ({r['threads']} threads, {r['dtype']}), emulated link "
        f"{r['link']['bandwidth_mbps']:g} Mbps / {r['link']['rtt_ms']:g} ms"
    ]
    for p in r["plans"]:
        where = " ".join(f"{s}@{x}" for s, x in p["placement"].items())
        lines.append(
            f"  {where:<48} predicted {p['predicted_ms']:8.2f} ms  measured "
            f"{p['measured_median_ms']:8.2f} ms"
        )
    for key in ("uncalibrated", "calibrated"):
        e = r[key]
        lines.append(
            f"  {key:<13} MAPE {e['mape_pct']:5.1f}%  within 10%: {100 * e['within_10pct']:5.1f}%"
            f"  within 20%: {100 * e['within_20pct']:5.1f}%  (n={e['n']})"
        )
    return "\n".join(lines)


# -- `vlarun bench predictor` ------------------------------------------------------------------
@dataclass(frozen=True)
class BenchPredictorOptions:
    """Predicted vs measured latency of every plan of a tiny preset on this machine (robot and
    edge both this CPU, emulated link): MAPE and the share within 10% and 20%."""

    model: str = opt("tiny-openvla", "tiny model preset", replaces=("--preset",))
    repeats: int = opt(6, "runs per plan")
    warmup: int = opt(2, "runs per plan that only feed the calibration")
    link_mbps: float = opt(100.0, "emulated link bandwidth, Mbit/s", deprecated=("--bandwidth",))
    link_rtt_ms: float = opt(2.0, "emulated link round-trip time, ms", deprecated=("--rtt",))
    json: bool = opt(False, "print one JSON object")


def cmd_bench_predictor(o: BenchPredictorOptions) -> dict:
    return check_host(o.model, o.repeats, o.warmup, o.link_mbps, o.link_rtt_ms)


def show_bench_predictor(r: dict) -> None:
    print(format_host(r))


OPTIONS = {"bench-predictor": BenchPredictorOptions}
RUN = {"bench-predictor": cmd_bench_predictor}
SHOW = {"bench-predictor": show_bench_predictor}
