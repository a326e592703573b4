"""The cost model against published latencies it was not fitted to (``published.json``).

Each row is a published time of pi0 / pi0.5 / SmolVLA on a catalog device under a named runtime,
at the shape it was measured at (camera views, prompt tokens, chunk, denoising steps). The
"prior" column is the catalog roofline (``cost.roofline``) with the catalog's efficiency priors,
summed over the stages the figure covers. A runtime is not a device: the same RTX 4090 runs
openpi's XLA program and Dexmal's hand-tuned CUDA graphs about 2x apart, so each runtime group
carries one runtime-efficiency factor that multiplies the prior, and says where it came from:
fitted on at most one of its rows (that row is then not scored), stated a priori, or carried
over from another group. The published figures live in the JSON, never in this code.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from vlarun.config import opt
from vlarun.models.presets import get_preset
from vlarun.models.vla import VLAConfig
from vlarun.sched.catalog import get_device
from vlarun.sched.cost import roofline, stage_works
from vlarun.stages.families import Workload

PUBLISHED_FILE = Path(__file__).with_name("published.json")
FACTOR_KINDS = ("fit", "a_priori", "from_group")


@dataclass(frozen=True)
class Published:
    """One published latency and the shape it was measured at. Invariant: a source URL and
    what it says are given, the time is positive, ``stages`` is not empty."""

    id: str
    model: str
    device: str
    group: str
    views: int
    text_tokens: int
    chunk: int
    steps: int
    quantity: str
    stages: tuple[str, ...]
    published_ms: float
    scope: str
    dtype: str
    batch: int
    source: dict

    def __post_init__(self) -> None:
        if not (self.source.get("url") and self.source.get("says")):
            raise ValueError(f"published row {self.id!r}: needs source.url and source.says")
        if self.published_ms <= 0 or not self.stages or self.views < 1:
            raise ValueError(f"published row {self.id!r}: bad time, stages or views")


def load_published(path: str | Path | None = None) -> tuple[dict, tuple[Published, ...]]:
    """(runtime groups, rows) of a published-latency file (``_parse``)."""
    return _parse(json.loads(Path(path or PUBLISHED_FILE).read_text()))


def _parse(data: dict) -> tuple[dict, tuple[Published, ...]]:
    """Groups and rows, checked: every row names a known group on its own device; every
    group's factor is one of: fitted on one of its own rows, stated a priori, or taken from a
    known group whose factor is not itself borrowed."""
    groups, rows = data["groups"], tuple(Published(**r) for r in data["rows"])
    ids = {r.id: r for r in rows}
    for r in rows:
        if r.group not in groups or groups[r.group]["device"] != r.device:
            raise ValueError(
                f"published row {r.id!r}: group {r.group!r} unknown or on another device"
            )
    for name, g in groups.items():
        f = g["factor"]
        if sum(k in f for k in FACTOR_KINDS) != 1:
            raise ValueError(f"group {name!r}: factor needs exactly one of {FACTOR_KINDS}")
        if "fit" in f and (f["fit"] not in ids or ids[f["fit"]].group != name):
            raise ValueError(f"group {name!r}: fitted on {f['fit']!r}, not one of its rows")
        if "from_group" in f:
            lender = groups.get(f["from_group"])
            if lender is None or "from_group" in lender["factor"]:
                raise ValueError(
                    f"group {name!r}: borrows from {f['from_group']!r}, "
                    "which is unknown or borrows itself"
                )
    return groups, rows


def shaped(r: Published) -> VLAConfig:
    """The model preset at the row's shape: camera views, chunk, denoising steps."""
    cfg = get_preset(r.model)
    if cfg.flow is None:
        raise ValueError(f"published row {r.id!r}: {r.model} is not a flow model")
    flow = dataclasses.replace(cfg.flow, horizon=r.chunk, num_steps=r.steps)
    return dataclasses.replace(cfg, num_images=r.views, chunk=r.chunk, flow=flow)


def prior_ms(r: Published) -> dict[str, float]:
    """Predicted ms of each stage the row covers: the catalog roofline with prior efficiencies
    (fitted to nothing), in bf16 (fp16 runs at the same tensor rate and bytes on these GPUs)."""
    works = {w.name: w for w in stage_works(shaped(r), Workload(r.batch, r.text_tokens))}
    device = get_device(r.device)
    return {s: roofline(works[s], device).seconds * 1e3 for s in r.stages}


def _err(pred: float, ref: float) -> float:
    return 100 * (pred - ref) / ref


def published_table(path: str | Path | None = None, bound_pct: float = 35.0) -> dict:
    """Every row's prior and factored prediction with its error (None for a fitted row), the
    factors and where each came from, and how many scored rows land within ``bound_pct``."""
    data = json.loads(Path(path or PUBLISHED_FILE).read_text())
    groups, rows = _parse(data)
    prior = {r.id: sum(prior_ms(r).values()) for r in rows}
    by_id = {r.id: r for r in rows}
    factors: dict[str, dict] = {}
    for name, g in sorted(groups.items(), key=lambda kv: "from_group" in kv[1]["factor"]):
        f = g["factor"]
        if "fit" in f:
            row = by_id[f["fit"]]
            value, how = row.published_ms / prior[row.id], f"fitted on {row.id}"
        elif "a_priori" in f:
            value, how = float(f["a_priori"]), "stated a priori"
        else:
            value, how = factors[f["from_group"]]["factor"], f"carried over from {f['from_group']}"
        factors[name] = {
            "device": g["device"],
            "runtime": g["runtime"],
            "factor": value,
            "how": how,
            "why": f.get("why", ""),
        }
    out = []
    for r in rows:
        fac = factors[r.group]
        anchor = groups[r.group]["factor"].get("fit") == r.id
        pred = prior[r.id] * fac["factor"]
        out.append(
            {
                "id": r.id,
                "model": r.model,
                "device": r.device,
                "group": r.group,
                "views": r.views,
                "quantity": r.quantity,
                "published_ms": r.published_ms,
                "prior_ms": prior[r.id],
                "prior_error_pct": _err(prior[r.id], r.published_ms),
                "factor": fac["factor"],
                "predicted_ms": pred,
                "error_pct": None if anchor else _err(pred, r.published_ms),
                "anchor": anchor,
                "scope": r.scope,
                "dtype": r.dtype,
                "batch": r.batch,
                "shape": {"text_tokens": r.text_tokens, "chunk": r.chunk, "steps": r.steps},
                "source": r.source,
            }
        )
    scored = [x["error_pct"] for x in out if x["error_pct"] is not None]
    return {
        "rows": out,
        "groups": factors,
        "scored": len(scored),
        "within_bound": sum(abs(e) <= bound_pct for e in scored),
        "bound_pct": bound_pct,
        "mape_pct": sum(abs(e) for e in scored) / len(scored) if scored else float("nan"),
        "missing": data.get("missing", []),
        "machine": "none: the cost model's arithmetic (catalog roofline), no device was run",
    }


def format_published(r: dict) -> str:
    head = (
        "model",
        "device",
        "runtime",
        "v",
        "quantity",
        "publ.",
        "prior",
        "err %",
        "x",
        "pred.",
        "err %",
    )
    fmt = "{:<8}{:<15}{:<18}{:>2}  {:<37}{:>7}{:>7}{:>7}{:>7}{:>7}{:>8}"
    lines = [fmt.format(*head)]
    for x in r["rows"]:
        err = "  anchor" if x["anchor"] else f"{x['error_pct']:>+8.1f}"
        lines.append(
            f"{x['model']:<8}{x['device']:<15}{x['group']:<18}{x['views']:>2}  "
            f"{x['quantity'][:36]:<37}{x['published_ms']:>7.1f}{x['prior_ms']:>7.1f}"
            f"{x['prior_error_pct']:>+7.1f}{x['factor']:>7.3f}{x['predicted_ms']:>7.1f}{err}"
        )
    lines.append(
        f"{r['within_bound']} of {r['scored']} scored rows within +-{r['bound_pct']:g}%; "
        f"MAPE {r['mape_pct']:.1f}% (anchors are not scored; latency only)"
    )
    for name, g in r["groups"].items():
        lines.append(f"factor {name} ({g['device']}): x{g['factor']:.3f}, {g['how']}: {g['why']}")
    for url in dict.fromkeys(x["source"]["url"] for x in r["rows"]):
        says = next(x["source"]["says"] for x in r["rows"] if x["source"]["url"] == url)
        lines.append(f"source {url}: {says}")
    lines += [f"missing: {m}" for m in r["missing"]]
    lines.append(f"machine: {r['machine']}")
    return "\n".join(lines)


# -- `vlarun bench published` ------------------------------------------------------------------
@dataclass(frozen=True)
class BenchPublishedOptions:
    """Cost-model predictions vs published pi0 / pi0.5 / SmolVLA latencies (RTX 4090 with 1-3
    camera views, Jetson Orin): one runtime-efficiency factor per device and runtime, sources
    and the error of every row not fitted to. Pure arithmetic: no device is run."""

    data: str | None = opt(None, "published-latency JSON (default: the package's published.json)")
    out: str | None = opt(None, "also write the result JSON here")
    json: bool = opt(False, "print one JSON object")


def cmd_bench_published(o: BenchPublishedOptions) -> dict:
    import json
    import time
    from pathlib import Path

    r = {
        "command": "vlarun bench published" + (f" --data {o.data}" if o.data else ""),
        "data": str(o.data or PUBLISHED_FILE.name),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    } | published_table(o.data)
    if o.out:
        Path(o.out).parent.mkdir(parents=True, exist_ok=True)
        Path(o.out).write_text(json.dumps(r, indent=1))
    return r


def show_bench_published(r: dict) -> None:
    print(format_published(r))


OPTIONS = {"bench-published": BenchPublishedOptions}
RUN = {"bench-published": cmd_bench_published}
SHOW = {"bench-published": show_bench_published}
