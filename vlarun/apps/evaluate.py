"""`vlarun eval | pair | fidelity | calibrate-drift | layer-importance`: closed loop on
Meta-World, two recorded evaluations paired, action fidelity, TRIAGE's drift diagnostic,
EfficientVLA's per-layer importance table."""

from __future__ import annotations

from vlarun.sim.drift_calibration import (
    DriftCalibrationConfig,
    format_calibration,
    run_calibration,
)
from vlarun.sim.evaluate import EvalConfig, evaluate, format_report
from vlarun.sim.fidelity import FidelityConfig, format_fidelity, run_fidelity
from vlarun.sim.layer_table import LayerTableConfig, format_layer_table, run_layer_table
from vlarun.sim.pair_results import PairConfig, format_pair, pair

OPTIONS = {
    "eval": EvalConfig,
    "pair": PairConfig,
    "fidelity": FidelityConfig,
    "calibrate-drift": DriftCalibrationConfig,
    "layer-importance": LayerTableConfig,
}
RUN = {
    "eval": evaluate,
    "pair": pair,
    "fidelity": run_fidelity,
    "calibrate-drift": run_calibration,
    "layer-importance": run_layer_table,
}
SHOW = {
    "eval": lambda r: print(format_report(r)),
    "pair": lambda r: print(format_pair(r)),
    "fidelity": lambda r: print(format_fidelity(r)),
    "calibrate-drift": lambda r: print(format_calibration(r)),
    "layer-importance": lambda r: print(format_layer_table(r)),
}
