"""`--device`: every command that runs a model takes it; asking for CUDA where there is none
fails with one line naming what is missing, before anything loads or runs."""

from __future__ import annotations

import pytest
import torch

from vlarun.cli import main
from vlarun.models.device import resolve_device, settle
from vlarun.policy.base import Policy

NO_CUDA = not torch.cuda.is_available()

# Each command that runs a model, with the least else it needs to start.
COMMANDS = [
    ["act", "--image", "x.png", "--instruction", "go"],
    ["eval", "--episodes", "1"],
    ["fidelity"],
    ["serve-edge", "--insecure", "--port", "0"],
    ["run-robot"],
    ["serve-policy", "--insecure", "--port", "0"],
    ["bench", "engine", "--quick"],
    ["bench", "accel", "--quick"],
    ["bench", "decode", "--quick"],
    ["profile"],
    ["train"],
    ["distill"],
]


def test_cpu_and_bad_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "cuda:-1", "tpu:0"):
        with pytest.raises(ValueError, match="--device must be cpu, cuda or cuda:N"):
            resolve_device(bad)


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_where_there_is_none_names_what_is_missing(name):
    with pytest.raises(ValueError, match=r"CPU-only build|no CUDA device is visible"):
        resolve_device(name)


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_model_command_refuses_cuda_in_one_line(argv, capsys):
    assert main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0], err
    assert "CPU-only build" in err[0] or "no CUDA device" in err[0]


def test_policy_on_its_device_and_host_timing():
    policy = Policy.load("tiny-ar", device="cpu")
    assert policy.model.device == torch.device("cpu") and policy.to("cpu") is policy
    settle({"x": torch.zeros(2)})  # a CPU tensor: nothing to wait for
    with pytest.raises(ValueError, match="--device must be"):
        Policy.load("tiny-ar", device="gpu")
