"""The settings tables: each accelerator knob value with its *measured* accuracy cost (or none),
read from ``settings.json`` (the shipped table), ``settings_mt10.json`` (measured on the shipped
deep MT10 policies) or a `vlarun bench accel` result; which model a cost belongs to, and how
several tables merge. The plan space (``plans.py``) reads them; nothing here prices a plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from vlarun.paths import checkpoints_dir

SETTINGS_FILE = Path(__file__).with_name("settings.json")
# The accuracy costs measured on the shipped deep MT10 policies (`vlarun bench accel --table`).
MEASURED_SETTINGS_FILE = Path(__file__).with_name("settings_mt10.json")
# Which families each knob applies to. Layer pruning is not offered for flow models: their
# action expert attends to the VLM's KV layer by layer, so dropping VLM layers breaks the pairing.
KNOB_FAMILIES = {
    "token_budget": ("autoregressive", "parallel", "diffusion", "flow"),
    "layers_kept": ("autoregressive", "parallel", "diffusion"),
    "cache_interval": ("diffusion", "flow"),
    "early_exit_sigma": ("autoregressive",),
    # Weight-only int8 (``transforms.int8``) of the LM's and the action head's decoder layers.
    "weights": ("autoregressive", "parallel", "diffusion", "flow"),
}
IDENTITY = {
    "token_budget": 1.0,
    "layers_kept": 1.0,
    "cache_interval": 1,
    "early_exit_sigma": None,
    "weights": "native",
}


@dataclass(frozen=True)
class SettingRow:
    """One knob value and its measured accuracy cost (None: not measured). An accuracy cost
    belongs to the model it was measured on: ``models`` names them (None: any model, which only
    the identity values and unmeasured rows may claim)."""

    knob: str
    value: float | str | None  # a string for the weights knob ("native", "int8")
    relative_success: float | None
    source: str | None
    modelled: bool = True
    models: tuple[str, ...] | None = None
    # The 95% interval of the relative success, where the measurement gave one (None: a point
    # estimate only, e.g. a paper's table, which then stands for both bounds).
    lower: float | None = None
    upper: float | None = None

    @property
    def bounds(self) -> tuple[float, float] | None:
        if self.relative_success is None:
            return None
        return (
            self.relative_success if self.lower is None else self.lower,
            self.relative_success if self.upper is None else self.upper,
        )


# What every row of a settings table carries (``models``, ``lower``, ``upper`` are optional).
SETTING_FIELDS = ("knob", "value", "relative_success", "source")


def load_settings(path: str | Path | None = None) -> tuple[SettingRow, ...]:
    """A settings table (settings.json format), or the result file of `vlarun bench accel`,
    whose measured success rates become accuracy costs."""
    path = Path(path or SETTINGS_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"settings table {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"settings table {path} is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"settings table {path}: want a JSON object with a 'settings' list")
    if "settings" not in data and ("sweep" in data or "ablation" in data):
        return settings_from_accel_bench(data)
    rows = data.get("settings")
    if not isinstance(rows, list):
        raise ValueError(
            f"settings table {path} has no 'settings' list (nor is it a bench accel result)"
        )
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in SETTING_FIELDS if not isinstance(r, dict) or k not in r]
        if missing:
            raise ValueError(f"settings table {path}: row {i} lacks {', '.join(missing)}")
        if r["knob"] not in KNOB_FAMILIES:
            raise ValueError(f"unknown knob {r['knob']!r} in settings table")
        models = tuple(r["models"]) if r.get("models") else None
        measured = r["relative_success"] is not None and r["value"] != IDENTITY[r["knob"]]
        if measured and models is None:
            raise ValueError(f"{r['knob']}={r['value']}: a measured accuracy cost must name models")
        modelled = r.get("modelled", True)
        out.append(
            SettingRow(
                r["knob"],
                r["value"],
                r["relative_success"],
                r["source"],
                modelled,
                models,
                r.get("lower"),
                r.get("upper"),
            )
        )
    return tuple(out)


def merge_settings(files: list[str | Path], about: str) -> dict:
    """One settings table from the ``*_settings.json`` files `vlarun bench accel --table`
    writes, oldest first: a later file's measurement of a knob value replaces every earlier
    row of that knob and value (whatever model it named: the newest policies' costs are the
    ones to plan with), rows of other values are kept, each naming its model and its source.
    How `vlarun/sched/settings_mt10.json` is regenerated (``scripts/merge-settings.py``)."""
    measured: dict[tuple[str, object], dict] = {}
    for f in files:
        data = json.loads(Path(f).read_text())
        if "settings" not in data:
            raise ValueError(
                f"{f} holds no settings table (a `bench accel --table` *_settings.json)"
            )
        for r in data["settings"]:
            if r["knob"] not in KNOB_FAMILIES:
                raise ValueError(f"{f}: unknown knob {r['knob']!r}")
            if r.get("source") == "identity":
                continue
            if not r.get("models"):
                raise ValueError(f"{f}: {r['knob']}={r['value']} names no model")
            measured[(r["knob"], r["value"])] = r
    identity = [
        {"knob": k, "value": v, "relative_success": 1.0, "source": "identity"}
        for k, v in IDENTITY.items()
    ]
    order = list(KNOB_FAMILIES)
    rows = sorted(measured.values(), key=lambda r: (order.index(r["knob"]), -_num(r["value"])))
    return {"_about": about, "_merged_from": [str(f) for f in files], "settings": identity + rows}


def _num(value) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def carried_to(rows: tuple[SettingRow, ...], model: str) -> tuple[SettingRow, ...]:
    """``rows`` with every measured accuracy cost also claimed for ``model``, its source saying
    it is a proxy: an emulated real-size model (runtime.emulate) has no measured costs of its
    own, and the small policies' are the only evidence there is. The plan space's notes name
    the rows carried."""
    out = []
    for r in rows:
        if r.models is None or model in r.models:
            out.append(r)
            continue
        source = f"proxy for {model}: measured on {', '.join(r.models)} ({r.source})"
        out.append(replace(r, models=(*r.models, model), source=source))
    return tuple(out)


def _model_of(policy: str, checkpoints: Path) -> str:
    """The preset name a shipped policy was trained at (its checkpoint's config)."""
    cfg = checkpoints / policy / "config.json"
    return json.loads(cfg.read_text())["vla"]["name"] if cfg.exists() else policy


# EfficientVLA ablation rows of `vlarun bench accel` that change exactly one knob of ours.
_ABLATION_KNOB = {"tokens": "token_budget", "cache": "cache_interval"}


def settings_from_accel_bench(result: dict, checkpoints: Path | None = None):
    """Accuracy costs measured by `vlarun bench accel`: success with a setting / success of
    the full policy in the same run. TRIAGE sweep rows give token budgets of the sweep's
    policy; the EfficientVLA ablation gives the token and cache knobs of the diffusion policy
    (its layer row also sparsifies MLPs, which the cost model does not price, so it is left
    out). Reduced (--quick) runs are refused: they are not results."""
    if result.get("quick"):
        raise ValueError("a --quick `bench accel` run is not a measurement to plan with")
    checkpoints = checkpoints or checkpoints_dir()
    opts, when = result.get("options", {}), result.get("date", "?")
    rows = [SettingRow(k, v, 1.0, "identity") for k, v in IDENTITY.items()]
    sweep = result.get("sweep") or []
    full = next((r for r in sweep if r["method"] == "full"), None)
    if full and full["success_rate"] > 0:
        model = _model_of(opts.get("policy", "?"), checkpoints)
        for r in sweep:
            if r["method"] == "triage":
                base = full["success_rate"]
                rel = r["success_rate"] / base
                src = (
                    f"vlarun bench accel {when}: TRIAGE B={r['budget_fraction']:g}, success "
                    f"{r['success_rate']:.3f} vs {full['success_rate']:.3f}, n={r['episodes']}"
                )
                # The setting's own 95% interval over the full policy's rate: the full rate's
                # own uncertainty is not in it (the sweep is not paired), said in the source.
                ci = r.get("ci95")
                lo, hi = (ci[0] / base, ci[1] / base) if ci else (None, None)
                rows.append(
                    SettingRow(
                        "token_budget",
                        r["budget_fraction"],
                        rel,
                        src + "; bounds: the setting's Wilson 95% interval / full's rate",
                        True,
                        (model,),
                        lo,
                        hi,
                    )
                )
    abl = {r["config"]: r for r in result.get("ablation") or []}
    if "none" in abl and abl["none"]["success_rate"] > 0:
        model = _model_of(opts.get("diffusion_policy", "?"), checkpoints)
        base = abl["none"]["success_rate"]
        for name, knob in _ABLATION_KNOB.items():
            if name in abl:
                st = abl[name]["settings"]
                value = st["tokens"] if knob == "token_budget" else st["cache_interval"]
                src = f"vlarun bench accel {when}: EfficientVLA {name}-only ablation"
                rows.append(
                    SettingRow(knob, value, abl[name]["success_rate"] / base, src, True, (model,))
                )
    return tuple(rows)
