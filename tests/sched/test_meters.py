"""Meter parsers on recorded sample files (tests/sched/samples, see its README)."""

import shutil
import sys
import types
from pathlib import Path

import pytest

from vlarun.sched.meters import (
    Ina3221Meter,
    NvmlMeter,
    RaplMeter,
    TegrastatsMeter,
    integrate,
    parse_nvidia_smi_csv,
    parse_tegrastats_line,
    rapl_joules,
    read_ina3221,
    read_rapl,
)

DATA = Path(__file__).parent / "samples"


def test_tegrastats_orin_rails_and_total():
    lines = (DATA / "tegrastats_orin.log").read_text().splitlines()
    rails = parse_tegrastats_line(lines[0])
    assert rails["VDD_GPU_SOC"] == pytest.approx(2.389)
    assert rails["VDDQ_VDD2_1V8AO"] == pytest.approx(0.403)
    meter = TegrastatsMeter(DATA / "tegrastats_orin.log")  # reads the latest line
    assert meter.read_watts() == pytest.approx(14.781 + 1.993 + 4.532)
    gpu_only = TegrastatsMeter(DATA / "tegrastats_orin.log", rails=("VDD_GPU_SOC",))
    assert gpu_only.read_watts() == pytest.approx(14.781)


def test_tegrastats_jetpack4_format():
    lines = (DATA / "tegrastats_xavier.log").read_text().splitlines()
    assert parse_tegrastats_line(lines[0]) == pytest.approx(
        {"VDD_IN": 3.94, "VDD_CPU_GPU_CV": 0.556, "VDD_SOC": 1.269}
    )
    assert TegrastatsMeter(DATA / "tegrastats_xavier.log").read_watts() == pytest.approx(7.012)
    with pytest.raises(ValueError, match="rails seen"):
        TegrastatsMeter(DATA / "tegrastats_xavier.log", rails=("VDD_GPU_SOC",)).read_watts()


def test_ina3221_hwmon_and_iio_layouts():
    rails = read_ina3221(DATA / "ina3221")
    assert rails["VDD_GPU_SOC"] == pytest.approx(5.072 * 2.914)
    assert set(rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"}
    total = 5.072 * 2.914 + 5.072 * 0.393 + 5.048 * 0.898
    assert Ina3221Meter(DATA / "ina3221").read_watts() == pytest.approx(total)
    assert read_ina3221(DATA / "ina3221_iio") == pytest.approx(
        {"GPU": 2.741, "CPU": 1.233, "SOC": 1.18}
    )
    with pytest.raises(FileNotFoundError):
        read_ina3221(DATA / "rapl")


def test_rapl_energy_with_wraparound(tmp_path):
    root = tmp_path / "rapl"
    shutil.copytree(DATA / "rapl", root)
    before = read_rapl(root)
    assert set(before) == {"package-0@intel-rapl:0", "package-1@intel-rapl:1"}  # no sub-domains
    (root / "intel-rapl:0" / "energy_uj").write_text("41244567890\n")  # +10 J
    (root / "intel-rapl:1" / "energy_uj").write_text("671150\n")  # wrapped: +1 J
    after = read_rapl(root)
    assert rapl_joules(before, after) == pytest.approx(10.0 + 1.0, abs=1e-6)


def test_rapl_meter_average_power(tmp_path):
    root = tmp_path / "rapl"
    shutil.copytree(DATA / "rapl", root)
    times = iter([0.0, 2.0])
    meter = RaplMeter(root, clock=lambda: next(times))
    (root / "intel-rapl:0" / "energy_uj").write_text("41254567890\n")  # +20 J over 2 s
    assert meter.read_watts() == pytest.approx(10.0)


def test_nvidia_smi_csv():
    rows = parse_nvidia_smi_csv((DATA / "nvidia_smi.csv").read_text())
    assert rows == [(0, pytest.approx(31.42)), (0, pytest.approx(278.9))]


def test_nvml_reader_with_a_stub_library(monkeypatch):
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
        nvmlDeviceGetPowerUsage=lambda h: 281_000,  # milliwatts
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 5_000_000,  # millijoules
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    meter = NvmlMeter(0)
    assert meter.read_watts() == pytest.approx(281.0)
    assert meter.energy_joules() == pytest.approx(5000.0)


def test_nvml_missing_library_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(RuntimeError, match="nvidia-ml-py"):
        NvmlMeter().read_watts()


def test_integrate_trapezoid():
    assert integrate([(0.0, 10.0), (1.0, 20.0), (3.0, 20.0)]) == pytest.approx(15 + 40)
