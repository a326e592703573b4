"""Catalog, roofline stage cost, energy model and `vlarun predict`."""

import json

import pytest

from vlarun.cli import main
from vlarun.models.presets import get_preset
from vlarun.sched.catalog import CATALOG_FILE, Device, get_device, load_catalog, measure_this_cpu
from vlarun.sched.cost import StageWork, at_batch, roofline, stage_works
from vlarun.sched.energy import stage_energy

NEEDED = {"orin-agx-32gb", "orin-agx-64gb", "orin-nx-16gb", "rtx4090", "a40", "a100-80gb"}
NEEDED |= {"h100", "l4", "this-cpu"}
# Issue 35: the devices users ask about (openpi #657, #826; lerobot #2753).
DEPLOYED = ("jetson-thor", "orin-nano-8gb", "rtx5090")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLARUN_CACHE_DIR", str(tmp_path))


def test_catalog_has_every_device_with_sources():
    devices = load_catalog()
    assert set(devices) >= NEEDED
    rows = json.loads(CATALOG_FILE.read_text())["devices"]
    for row in rows:
        for key in ("bf16_tflops", "mem_bw_gbs", "mem_gb", "idle_w", "busy_w"):
            assert key in row["sources"], (row["id"], key)


def test_deployment_rows_load_with_a_source_for_every_figure(capsys):
    rows = {r["id"]: r for r in json.loads(CATALOG_FILE.read_text())["devices"]}
    figures = ("bf16_tflops", "int8_tops", "fp32_tflops", "mem_bw_gbs", "mem_gb")
    for name in DEPLOYED:
        device = get_device(name)
        assert "int8" in device.dtypes and device.int8_tops > device.bf16_tflops
        for key in (*figures, "idle_w", "busy_w"):
            source = rows[name]["sources"][key]
            assert source[:2] in ("V:", "P:", "U:"), (name, key, source)
            # A derived figure says so: every U-tagged peak names what it was derived from.
            if source.startswith("U:") and key in figures[:2]:
                assert "derived" in source, (name, key, source)
        assert main(["predict", "--model", "openvla-7b", "--robot-device", name, "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert r["latency_ms"] > 0 and r["energy_source"] == "modelled"
    # Orderings the datasheets imply: Thor over the AGX Orin, the 5090 over the 4090. (The Orin
    # Nano Super's 1.02 GHz GPU clock puts it above the catalog's Orin NX at 918 MHz.)
    peak = {n: get_device(n).bf16_tflops for n in ("jetson-thor", "orin-agx-64gb")}
    assert peak["jetson-thor"] > peak["orin-agx-64gb"]
    assert get_device("rtx5090").mem_bw_gbs > get_device("rtx4090").mem_bw_gbs


def test_unknown_device_lists_valid_ones():
    with pytest.raises(ValueError, match="rtx4090"):
        get_device("gtx480")


def test_device_rejects_inconsistent_power():
    with pytest.raises(ValueError, match="idle_w"):
        Device("x", "x", "edge", 1, 1, 1, 1, 1, idle_w=10, busy_w=5)


def test_measure_this_cpu_is_cached_and_used(tmp_path):
    m = measure_this_cpu(n=128, copy_mib=4, repeats=1)
    assert m["bf16_gflops"] > 0 and m["mem_bw_gbs"] > 0
    dev = get_device("this-cpu")
    assert dev.bf16_tflops == pytest.approx(m["bf16_gflops"] / 1e3)
    assert "measured" in dev.sources["mem_bw_gbs"]


def _work(flops, nbytes, passes=1, layers=0):
    return StageWork("s", (), flops, nbytes / passes, nbytes, passes, layers, 0, 0, 0)


def test_roofline_picks_the_binding_resource():
    dev = get_device("rtx4090")
    compute = roofline(_work(1e15, 1e6), dev)
    memory = roofline(_work(1e6, 1e11), dev)
    assert compute.seconds == pytest.approx(1e15 / (165.2e12 * dev.compute_eff))
    assert memory.seconds == pytest.approx(1e11 / (1008e9 * dev.memory_eff))
    assert compute.utilisation == memory.utilisation == 1.0


def test_overhead_lowers_utilisation_and_power():
    dev = get_device("orin-agx-32gb")
    roof = roofline(_work(1e6, 1e3, passes=4, layers=32), dev)
    assert roof.utilisation < 0.01
    assert stage_energy(dev, 1.0, roof.utilisation) < stage_energy(dev, 1.0, 1.0)


def test_batching_shares_weight_traffic():
    w = stage_works(get_preset("openvla-7b"))[2]  # decode: memory-bound
    dev = get_device("rtx4090")
    t1, t4 = roofline(w, dev).seconds, roofline(at_batch(w, 4), dev).seconds
    assert t4 < 1.2 * t1  # four requests cost barely more than one


def test_predict_json_fields(capsys):
    argv = ["predict", "--model", "openvla-7b", "--robot-device", "orin-agx-32gb", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in r["stages"]] == ["vision", "prefill", "decode"]
    assert r["latency_ms"] == pytest.approx(sum(s["latency_ms"] for s in r["stages"]))
    assert r["energy_j"] == pytest.approx(sum(s["energy_j"] for s in r["stages"]))
    assert r["energy_source"] == "modelled"
    # A 7B model is slower on a Jetson than on a 4090 (shared/REFERENCE.md peaks).
    assert main(["predict", "--model", "openvla-7b", "--robot-device", "rtx4090", "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert fast["latency_ms"] < r["latency_ms"] / 3


def test_predict_batch_and_list(capsys):
    argv = ["predict", "--model", "pi0", "--robot-device", "a100-80gb", "--batch", "4", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["actions"] == 4 * 50
    assert main(["predict", "--list-devices", "--json"]) == 0
    ids = {d["id"] for d in json.loads(capsys.readouterr().out)["devices"]}
    assert ids >= NEEDED


def test_predict_errors_are_one_line(capsys):
    assert main(["predict", "--model", "openvla-7b", "--robot-device", "nope"]) == 2
    assert "unknown device" in capsys.readouterr().err
    assert main(["predict", "--robot-device", "h100"]) == 2
