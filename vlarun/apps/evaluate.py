"""`vlarun eval | fidelity | calibrate-drift`: closed loop on Meta-World, action fidelity,
TRIAGE's drift diagnostic."""

from __future__ import annotations

from vlarun.sim.drift_calibration import (
    DriftCalibrationConfig,
    format_calibration,
    run_calibration,
)
from vlarun.sim.evaluate import EvalConfig, evaluate, format_report
from vlarun.sim.fidelity import FidelityConfig, format_fidelity, run_fidelity

OPTIONS = {
    "eval": EvalConfig,
    "fidelity": FidelityConfig,
    "calibrate-drift": DriftCalibrationConfig,
}
RUN = {"eval": evaluate, "fidelity": run_fidelity, "calibrate-drift": run_calibration}
SHOW = {
    "eval": lambda r: print(format_report(r)),
    "fidelity": lambda r: print(format_fidelity(r)),
    "calibrate-drift": lambda r: print(format_calibration(r)),
}
