"""openpi's WebSocket protocol served by vlarun, driven by the real ``openpi-client`` package
(installed without its numpy<2 pin by the Makefile): metadata first, one reply per request,
actions through ``ActionChunkBroker``, the API key checked before the upgrade, errors as a text
frame then close 1011, ``/healthz``, and a Meta-World episode solved through it."""

import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

openpi_client = pytest.importorskip("openpi_client")
pytest.importorskip("websockets")

from openpi_client.action_chunk_broker import ActionChunkBroker  # noqa: E402
from openpi_client.websocket_client_policy import WebsocketClientPolicy  # noqa: E402

from vlarun.policy import Policy  # noqa: E402
from vlarun.runtime import openpi  # noqa: E402

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server():
    policy = Policy.load("tiny-ar")
    srv = openpi.OpenpiPolicyServer(
        policy,
        openpi.get_layout("metaworld"),
        port=0,
        api_key=KEY,
        limits=openpi.ServeLimits(max_frame=1 << 20),
    )
    stop = srv.start_in_thread(30)
    yield srv
    stop()


def test_msgpack_numpy_round_trip_and_refusals():
    obs = {
        "image": np.arange(12, dtype=np.uint8).reshape(2, 2, 3),
        "x": np.float32(2.5),
        "prompt": "open the drawer",
    }
    back = openpi.unpackb(openpi.packb(obs))
    assert np.array_equal(back["image"], obs["image"]) and back["x"] == np.float32(2.5)
    # openpi's own packer produces frames our decoder reads, and vice versa.
    from openpi_client import msgpack_numpy

    theirs = openpi.unpackb(msgpack_numpy.packb(obs))
    assert np.array_equal(theirs["image"], obs["image"])
    assert np.array_equal(msgpack_numpy.unpackb(openpi.packb(obs))["image"], obs["image"])
    import msgpack

    lying = msgpack.packb(
        {b"__ndarray__": True, b"data": b"\0" * 10, b"dtype": "<f4", b"shape": [1000, 1000]},
        use_bin_type=True,
    )
    with pytest.raises(ValueError, match="does not match its 10 bytes"):
        openpi.unpackb(lying)
    objects = msgpack.packb(
        {b"__ndarray__": True, b"data": b"", b"dtype": "|O", b"shape": [0]}, use_bin_type=True
    )
    with pytest.raises(ValueError, match="refused"):
        openpi.unpackb(objects)


def test_health_and_the_api_key_is_checked_before_the_upgrade(server):
    url = f"http://127.0.0.1:{server.port}/healthz"
    assert urllib.request.urlopen(url, timeout=5).read() == b"OK\n"
    from websockets.exceptions import InvalidStatus

    for bad in (None, "wrong-key"):
        with pytest.raises(InvalidStatus) as err:
            WebsocketClientPolicy("127.0.0.1", server.port, api_key=bad)
        assert err.value.response.status_code == 401


def test_an_unmodified_openpi_client_solves_a_metaworld_episode(server):
    pytest.importorskip("metaworld")
    from vlarun.sim.env import MetaWorldEnv
    from vlarun.sim.tasks import EVAL_SEED_OFFSET

    client = WebsocketClientPolicy("127.0.0.1", server.port, api_key=KEY)
    meta = client.get_server_metadata()
    assert meta["server"] == "vlarun" and meta["action_horizon"] == 4
    broker = ActionChunkBroker(client, action_horizon=meta["action_horizon"])
    env = MetaWorldEnv("drawer-open-v3")
    obs, _ = env.reset(seed=EVAL_SEED_OFFSET)
    before = server.requests
    success = False
    for _ in range(env.max_steps):
        out = broker.infer(
            {"image": obs["image"], "state": obs["state"], "prompt": env.instruction}
        )
        assert out["actions"].shape == (4,)
        obs, _, terminated, truncated, info = env.step(out["actions"])
        if terminated or truncated:
            success = bool(info["success"])
            break
    env.close()
    assert success
    steps = env.steps
    assert server.requests - before == -(-steps // 4)  # one request per 4-action chunk


def test_errors_are_a_text_frame_then_close_1011(server):
    client = WebsocketClientPolicy("127.0.0.1", server.port, api_key=KEY)
    with pytest.raises(RuntimeError, match="observation lacks \\['image'\\]"):
        client.infer({"prompt": "open the drawer"})
    from websockets.exceptions import ConnectionClosed

    with pytest.raises(ConnectionClosed) as err:
        client.infer({"prompt": "x"})
    assert err.value.rcvd is not None and err.value.rcvd.code == 1011


def test_oversized_frames_are_refused(server):
    client = WebsocketClientPolicy("127.0.0.1", server.port, api_key=KEY)
    from websockets.exceptions import ConnectionClosed

    with pytest.raises(ConnectionClosed):
        client.infer({"image": np.zeros((1024, 1024, 3), np.uint8), "prompt": "x"})  # 3 MiB


def test_clients_are_served_concurrently(server):
    """Four clients at once: each gets its replies; the slowest is not 4x one alone by more
    than queueing on the one model thread explains (no client blocks the event loop)."""
    frame = {"image": np.zeros((128, 128, 3), np.uint8), "prompt": "open the drawer"}
    errors: list[BaseException] = []

    def one() -> None:
        try:
            c = WebsocketClientPolicy("127.0.0.1", server.port, api_key=KEY)
            for _ in range(3):
                assert c.infer(frame)["actions"].shape == (4, 4)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert time.perf_counter() - t0 < 120


def test_clients_requests_are_batched_through_the_edge_queues():
    """Three real clients sending at once, a generous batch window: their requests run as one
    batch per stage in the in-process edge's queues, and each still gets the actions its own
    observation gives alone (batched fp32 matmuls may differ in the last bits)."""
    policy = Policy.load("tiny-oft")
    srv = openpi.OpenpiPolicyServer(
        policy, openpi.get_layout("metaworld"), port=0, max_batch=4, batch_window_s=0.3
    )
    stop = srv.start_in_thread(30)
    rng = np.random.default_rng(0)
    frames = [
        {"image": rng.integers(0, 255, (128, 128, 3), dtype=np.uint8), "prompt": "open the drawer"}
        for _ in range(3)
    ]
    alone = [policy.predict(f["image"], f["prompt"]) for f in frames]
    got: dict[int, np.ndarray] = {}
    clients = [WebsocketClientPolicy("127.0.0.1", srv.port) for _ in frames]
    go = threading.Barrier(3)

    def one(k: int) -> None:
        go.wait()
        got[k] = clients[k].infer(frames[k])["actions"]

    try:
        threads = [threading.Thread(target=one, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        batches = [b for r in srv.edge.recent for b in r["batch"].values()]
    finally:
        stop()
    assert sorted(got) == [0, 1, 2]
    for k in range(3):
        np.testing.assert_allclose(got[k], alone[k], atol=1e-4)
    assert max(batches) >= 2, batches  # they shared stage batches
    assert srv.edge.stats["replies"] >= 3 and srv.edge.stats["errors"] == 0


def test_serve_policy_command_end_to_end(tmp_path):
    """`vlarun serve-policy` as its own process: endpoint line, an authenticated client's
    request, a clean exit on SIGTERM with its statistics; no key file and no --insecure is
    refused in one line."""
    import json
    import os
    import signal
    import subprocess
    import sys

    key = tmp_path / "policy.key"
    key.write_text("file-key\n")
    key.chmod(0o600)
    cmd = [
        sys.executable,
        "-m",
        "vlarun.cli",
        "serve-policy",
        "--policy",
        "tiny-ar",
        "--port",
        "0",
        "--api-key-file",
        str(key),
        "--threads",
        "1",
        "--json",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        start = json.loads(proc.stdout.readline())
        assert start["authenticated"] and start["protocol"] == "openpi"
        port = int(start["endpoint"].rsplit(":", 1)[1])
        client = WebsocketClientPolicy("127.0.0.1", port, api_key="file-key")
        reply = client.infer(
            {"image": np.zeros((128, 128, 3), np.uint8), "prompt": "open the drawer"}
        )
        assert reply["actions"].shape == (4, 4)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and json.loads(out.strip().splitlines()[-1])["requests"] == 1
    refused = subprocess.run(
        [sys.executable, "-m", "vlarun.cli", "serve-policy"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--api-key-file" in refused.stderr


def test_an_openpi_client_drives_a_lerobot_smolvla_directory(tmp_path):
    """A LeRobot SmolVLA directory served as it is; the client's LIBERO-style observation has
    cameras of two sizes and a raw state; the reply is the same chunk, in robot units, as the
    policy gives in process (and LeRobot's own code gives: tests/models/test_lerobot_reference)."""
    from vlarun import parity

    parity.make_lerobot_dir(tmp_path, "smolvla")
    policy = Policy.load(tmp_path)
    srv = openpi.OpenpiPolicyServer(
        policy,
        openpi.get_layout("libero"),
        port=0,
        api_key=KEY,
        limits=openpi.ServeLimits(max_frame=1 << 20),
    )
    stop = srv.start_in_thread(30)
    try:
        inputs = parity.lerobot_reference_inputs()
        client = WebsocketClientPolicy("127.0.0.1", srv.port, api_key=KEY)
        obs = {
            "observation/image": inputs["frames"][0],
            "observation/wrist_image": inputs["frames"][1],
            "observation/state": inputs["state"],
            "prompt": inputs["task"],
        }
        actions = client.infer(obs)["actions"]
    finally:
        stop()
    local = policy.predict(inputs["frames"], inputs["task"], state=inputs["state"])
    assert actions.shape == (4, 7) and np.allclose(actions, local, atol=1e-5)


def _serve_policy(*args: str):
    """`vlarun serve-policy ARGS --insecure --port 0 --json` as its own process: (process,
    its endpoint line)."""
    import json
    import os
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "vlarun.cli",
        "serve-policy",
        *args,
        "--insecure",
        "--port",
        "0",
        "--threads",
        "1",
        "--json",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        pytest.fail(f"serve-policy exited {proc.returncode}: {proc.stderr.read()}")
    return proc, json.loads(line)


def _stop(proc) -> None:
    import signal

    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 0


@pytest.mark.parametrize("kind", ["smolvla", "pi0", "pi05"])
def test_serve_policy_command_serves_a_lerobot_directory(tmp_path, kind):
    """The README's command on a LeRobot directory: the warm-up feeds a state of the robot's
    width (not the model's padded one; pi05 writes it into its prompt); the client sends the
    keys the checkpoint declares (its input_features), is told the robot's sizes (7 actions,
    not the padded 32), and an unmodified openpi client gets the same chunk, in robot units,
    as the policy gives in process."""
    from vlarun import parity

    parity.make_lerobot_dir(tmp_path, kind)
    proc, start = _serve_policy("--protocol", "openpi", "--policy", str(tmp_path))
    try:
        port = int(start["endpoint"].rsplit(":", 1)[1])
        client = WebsocketClientPolicy("127.0.0.1", port)
        meta = client.get_server_metadata()
        inputs = parity.lerobot_reference_inputs()
        obs = dict(zip(parity.LEROBOT_CAMERAS, inputs["frames"], strict=True))
        obs |= {"observation.state": inputs["state"], "prompt": inputs["task"]}
        actions = client.infer(obs)["actions"]
    finally:
        _stop(proc)
    sizes = (parity.LEROBOT_CHUNK, parity.LEROBOT_ACTION_DIM)
    assert start["layout"] == "checkpoint" and start["image_keys"] == list(parity.LEROBOT_CAMERAS)
    assert (start["action_horizon"], start["action_dim"]) == sizes
    assert (meta["action_horizon"], meta["action_dim"]) == sizes
    assert meta["image_keys"] == list(parity.LEROBOT_CAMERAS)
    local = Policy.load(tmp_path).predict(inputs["frames"], inputs["task"], state=inputs["state"])
    assert actions.shape == sizes
    np.testing.assert_allclose(actions, local, atol=1e-4)


def _three_camera_pi0(directory):
    """A LeRobot pi0 directory whose config declares a third camera (the tower is shared, so
    the weights are the same)."""
    import json

    from vlarun import parity

    parity.make_lerobot_dir(directory, "pi0")
    config = json.loads((directory / "config.json").read_text())
    feats = config["input_features"]
    feats["observation.images.right_wrist_0_rgb"] = dict(feats[parity.LEROBOT_CAMERAS[0]])
    (directory / "config.json").write_text(json.dumps(config))


def test_serve_policy_takes_three_cameras_under_the_robot_s_own_key_names(tmp_path):
    """An SO-100-style client names its cameras and state its own way: --image-keys (in the
    policy's camera order) and --state-key map them; the third camera is used."""
    _three_camera_pi0(tmp_path)
    keys = ["observation.images.top", "observation.images.wrist", "observation.images.side"]
    proc, start = _serve_policy(
        "--policy", str(tmp_path), "--image-keys", *keys, "--state-key", "observation.joints"
    )
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for _ in keys]
    state = rng.normal(0, 1, 8).astype(np.float32)
    try:
        client = WebsocketClientPolicy("127.0.0.1", int(start["endpoint"].rsplit(":", 1)[1]))
        obs = dict(zip(keys, frames, strict=True))
        obs |= {"observation.joints": state, "prompt": "pick up the red block"}
        actions = client.infer(obs)["actions"]
    finally:
        _stop(proc)
    assert start["image_keys"] == keys and start["state_key"] == "observation.joints"
    policy = Policy.load(tmp_path)
    assert policy.model.cfg.num_images == 3
    np.testing.assert_allclose(
        actions, policy.predict(frames, "pick up the red block", state=state), atol=1e-4
    )
    two = policy.predict(frames[:2] + frames[:1], "pick up the red block", state=state)
    assert not np.allclose(actions, two, atol=1e-4)  # the third view counts


def test_a_layout_with_too_few_cameras_is_refused_in_one_line(tmp_path, capsys):
    from vlarun.cli import main

    _three_camera_pi0(tmp_path)
    argv = ["serve-policy", "--policy", str(tmp_path), "--layout", "libero", "--insecure"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "takes 3 cameras" in err and "--image-keys" in err


@pytest.mark.parametrize("layout", ["smolvla", "libero"])
def test_the_readme_client_snippet_runs_against_every_layout(tmp_path, monkeypatch, layout):
    """README's openpi client, as printed (its key read from policy.key, newline and all),
    against a LeRobot SmolVLA directory (the checkpoint's own camera keys and state) and a
    shipped policy under the libero layout: it builds its observation from the metadata."""
    import json
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from vlarun import parity

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    snippet = next(
        b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "get_server_metadata" in b
    )
    (tmp_path / "policy.key").write_text("0123456789abcdef0123456789abcdef\n")  # echo's newline
    os.chmod(tmp_path / "policy.key", 0o600)
    if layout == "smolvla":
        parity.make_lerobot_dir(tmp_path / "ckpt", "smolvla")
        args = ["--policy", str(tmp_path / "ckpt")]
    else:
        args = ["--policy", "tiny-ar", "--layout", "libero"]
    cmd = [
        sys.executable,
        "-m",
        "vlarun.cli",
        "serve-policy",
        "--protocol",
        "openpi",
        *args,
        "--api-key-file",
        str(tmp_path / "policy.key"),
        "--port",
        "0",
        "--threads",
        "1",
        "--json",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.poll() is not None else "no start line"
        port = json.loads(line)["endpoint"].rsplit(":", 1)[1]
        monkeypatch.chdir(tmp_path)
        scope: dict = {}
        exec(snippet.replace("8000", port), scope)  # noqa: S102 - the README's own text
    finally:
        _stop(proc)
    assert np.asarray(scope["action"]).ndim == 1 and np.isfinite(scope["action"]).all()
