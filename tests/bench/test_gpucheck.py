"""`python -m vlarun bench gpu-check --device cpu --quick` (what CI runs of the GPU check, as a bare
GPU machine runs it) completes, and its JSON has every section with measured numbers, not
errors."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from vlarun.bench import gpucheck  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _numbers(x) -> list[float]:
    if isinstance(x, bool):
        return []
    if isinstance(x, int | float):
        return [float(x)]
    if isinstance(x, dict):
        return [n for v in x.values() for n in _numbers(v)]
    if isinstance(x, list):
        return [n for v in x for n in _numbers(v)]
    return []


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlarun",
            "bench",
            "gpu-check",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--quick",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    path = out / "gpu-check.json"
    return proc, json.loads(path.read_text()) if path.exists() else {}


def test_quick_cpu_run_has_every_section_with_numbers(quick_run):
    proc, r = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert r["ok"] and r["quick"] and r["device"]["type"] == "cpu" and r["device"]["name"]
    assert r["dtype"] == "fp32" and r["torch"] and r["date"]
    assert r["command"].startswith("vlarun bench gpu-check") and "--device cpu" in r["command"]
    assert (Path(r["file"]).parent / "gpu-check.log").read_text().startswith("gpu-check on")
    assert list(r["sections"]) == list(gpucheck.SECTIONS)
    for name, section in r["sections"].items():
        assert section["ok"] and "error" not in section, (name, section.get("error"))
        numbers = _numbers({k: v for k, v in section.items() if k != "seconds"})
        assert all(math.isfinite(n) for n in numbers), name
        if name != "energy":
            assert numbers and any(n > 0 for n in numbers), name
    s = r["sections"]
    assert s["parity"]["passed"] and s["parity"]["greedy_tokens_agree"] == 1.0  # fp32
    assert s["parity"]["greedy_tokens_agree_teacher_forced"] == 1.0
    assert s["engine"]["prefill_ms"]["vlarun"] > 0 and s["engine"]["copy_bandwidth_gbs"] > 0
    assert {row["views"] for row in s["policies"]["rows"]} == {1, 3}
    assert all(row["latency_ms_median"] > 0 for row in s["policies"]["rows"])
    assert 0 < s["triage"]["flops_ratio_cost_model"] < 1
    assert s["jacobi"]["iterations_mean"] >= 1
    # No meter on a CPU run: said, and no energy figure made up.
    assert s["energy"] == {
        "ok": True,
        "energy_source": "none (no meter)",
        "seconds": s["energy"]["seconds"],
    }
    assert r["energy_source"] == "none (no meter)"


def test_refusals_are_one_line_errors():
    with pytest.raises(ValueError, match="--quick"):
        gpucheck.make_env(gpucheck.GpuCheckOptions(device="cpu"))
    with pytest.raises(ValueError, match="unknown sections"):
        gpucheck.GpuCheckOptions(sections=("nope",))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_cuda_where_there_is_none_fails_naming_what_is_missing():
    with pytest.raises(ValueError, match="--device cuda"):
        gpucheck.make_env(gpucheck.GpuCheckOptions(device="cuda", quick=True))
