"""openpi's WebSocket policy protocol, served by vlarun, so an unmodified ``openpi-client``
(``WebsocketClientPolicy``, ``ActionChunkBroker``) drives a vlarun policy.

The protocol, as openpi's ``WebsocketPolicyServer`` speaks it (shared/ECOSYSTEM.md): the server
sends one binary msgpack frame of metadata first; then each binary request frame (a msgpack
observation dict, arrays in msgpack-numpy form) gets exactly one binary reply frame
``{"actions": (H, D), "policy_timing": {...}, "server_timing": {...}}``; an error is a *text*
frame followed by close code 1011; ``GET /healthz`` answers ``OK``.

Where vlarun differs, on purpose:
  * the API key the client sends (``Authorization: Api-Key KEY``) is checked, in constant time,
    before the WebSocket upgrade (401 otherwise); openpi's server ignores it;
  * frames are limited (``max_frame`` bytes, 16 MiB by default) and every array's declared
    dtype and shape are checked against its byte length before anything is built; object,
    void and complex dtypes are refused (openpi's decoder refuses them too);
  * inference runs off the event loop, so a slow request never stalls the handshakes, health
    checks and frame parsing of other clients (openpi issue #717): each request goes into the
    per-stage queues of an in-process edge server (``EdgeServer.submit``), the same queues,
    batching and worker robots' requests use, so requests of several clients that arrive
    together run as one batch per stage (same instruction length; ``max_batch`` at most).
"""

from __future__ import annotations

import asyncio
import hmac
import http
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

MAX_FRAME = 16 * 2**20  # a 224 px two-camera observation is ~0.3 MB; 16 MiB leaves room
MAX_ARRAY_DIMS = 8
REFUSED_KINDS = "VOc"  # void (structured), object (pickle), complex: as openpi's own decoder

# -- msgpack-numpy: openpi's array encoding -----------------------------------------------------


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in REFUSED_KINDS:
            raise ValueError(f"cannot send arrays of dtype {obj.dtype}")
        arr = np.ascontiguousarray(obj)
        return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str,
                b"shape": list(arr.shape)}  # fmt: skip
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape = obj.get(b"shape")
        if not isinstance(shape, list | tuple) or len(shape) > MAX_ARRAY_DIMS:
            raise ValueError(f"array shape must be a list of at most {MAX_ARRAY_DIMS} sizes")
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"array shape {shape} must hold non-negative integers")
        data = obj.get(b"data")
        if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
            got = len(data) if isinstance(data, bytes) else type(data).__name__
            raise ValueError(f"array of {dtype} {tuple(shape)} does not match its {got} bytes")
        return np.frombuffer(data, dtype=dtype).reshape(shape)  # read-only view, no copy
    if b"__npgeneric__" in obj:
        return _dtype(obj.get(b"dtype")).type(obj.get(b"data"))
    return obj


def _dtype(spec: Any) -> np.dtype:
    if not isinstance(spec, str):
        raise ValueError(f"array dtype must be a string, got {type(spec).__name__}")
    try:
        dtype = np.dtype(spec)
    except TypeError:
        raise ValueError(f"unknown array dtype {spec!r}") from None
    if dtype.kind in REFUSED_KINDS:
        raise ValueError(f"array dtype {spec!r} is refused (object, void or complex)")
    return dtype


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)


# -- observation layouts ------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservationLayout:
    """Where a robot client puts the cameras, the state and the instruction in its dict.

    image_keys: the views in the policy's order (the first is required, the rest are used when
    present and the policy takes that many); state_key: the proprio vector; prompt_key: text."""

    name: str
    image_keys: tuple[str, ...]
    state_key: str
    prompt_key: str = "prompt"

    def inputs(self, obs: Any, num_images: int) -> tuple[np.ndarray, np.ndarray | None, str]:
        """(images (V, H, W, 3) uint8 or a list of V frames of different sizes, state or
        None, instruction) from one request."""
        if not isinstance(obs, dict):
            raise ValueError(f"an observation must be a dict, got {type(obs).__name__}")
        missing = [k for k in (self.image_keys[0], self.prompt_key) if k not in obs]
        if missing:
            raise ValueError(f"observation lacks {missing} (layout {self.name!r}: keys "
                             f"{[*self.image_keys, self.state_key, self.prompt_key]})")  # fmt: skip
        views = [np.asarray(obs[k]) for k in self.image_keys if k in obs][:num_images]
        for key, v in zip(self.image_keys, views, strict=False):
            if v.ndim != 3 or v.shape[-1] != 3 or v.dtype != np.uint8:
                raise ValueError(f"{key!r} must be (H, W, 3) uint8, got {v.dtype}{v.shape}")
        if len(views) == 1:
            images = views[0]
        elif len({v.shape for v in views}) == 1:
            images = np.stack(views)
        else:  # cameras of different sizes: the policy resizes each, or says it cannot
            images = views
        prompt = obs[self.prompt_key]
        if isinstance(prompt, bytes):
            prompt = prompt.decode()
        if not isinstance(prompt, str):
            raise ValueError(f"{self.prompt_key!r} must be text, got {type(prompt).__name__}")
        state = obs.get(self.state_key)
        return images, None if state is None else np.asarray(state, dtype=np.float32), prompt


LAYOUTS: dict[str, ObservationLayout] = {
    # vlarun's Meta-World observation names: the workspace camera, the second view, the state.
    "metaworld": ObservationLayout("metaworld", ("image", "second_image"), "state"),
    # openpi's LIBERO example client.
    "libero": ObservationLayout(
        "libero", ("observation/image", "observation/wrist_image"), "observation/state"
    ),
}


def get_layout(name: str) -> ObservationLayout:
    if name not in LAYOUTS:
        raise ValueError(f"unknown observation layout {name!r}; valid: {', '.join(LAYOUTS)}")
    return LAYOUTS[name]


# -- the server ---------------------------------------------------------------------------------


class OpenpiPolicyServer:
    """Serves ``policy`` (a vlarun Policy) over openpi's protocol; see the module docstring.

    ``api_key`` None accepts any client (say so loudly where it is started); ``metadata`` is
    the first frame each client receives."""

    def __init__(
        self,
        policy,
        layout: ObservationLayout,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | None = None,
        max_frame: int = MAX_FRAME,
        metadata: dict | None = None,
        max_batch: int = 8,
        batch_window_s: float = 0.002,
    ) -> None:
        if max_frame < 1024:
            raise ValueError(f"max_frame must be >= 1024 bytes, got {max_frame}")
        from vlarun.runtime.server import EdgeServer, ServerConfig
        from vlarun.runtime.transport import Security

        self.policy, self.layout = policy, layout
        self.host, self.port = host, port
        self._expected = None if api_key is None else f"Api-Key {api_key}".encode()
        self.max_frame = max_frame
        cfg = policy.model.cfg
        self.metadata = metadata if metadata is not None else {
            "server": "vlarun", "policy": cfg.name, "family": cfg.family,
            "action_horizon": cfg.horizon, "action_dim": policy.action_size,
            "image_keys": list(layout.image_keys), "state_key": layout.state_key,
            "prompt_key": layout.prompt_key,
        }  # fmt: skip
        # The model runs on the edge's worker thread; these threads only prepare a request and
        # wait for it, so several clients' requests can be queued (and batched) at once.
        cfg_edge = ServerConfig(f"inproc://vlarun-openpi-{id(self)}", max_batch, batch_window_s,
                                admission=False)  # fmt: skip
        self.edge = EdgeServer(policy, Security(insecure=True), cfg_edge)  # no network socket
        self.edge.warmup()
        self._pool = ThreadPoolExecutor(2 * max_batch, thread_name_prefix="vlarun-infer")
        self.requests = 0
        self.server_ms: list[float] = []  # per request: server time minus model time
        self._server = None

    # handshake: health, then authentication, before any WebSocket exists
    def _process_request(self, connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self._expected is not None:
            sent = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(sent, self._expected):
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "bad or missing API key\n")
        return None

    def _infer(self, frame: bytes, client: bytes) -> tuple[dict, float]:
        """One request: decode, map the layout, queue it on the edge, wait. The model time
        is the compute of the stage batches it ran in (each batch's whole time: it waited
        for all of it)."""
        obs = unpackb(frame)
        images, state, prompt = self.layout.inputs(obs, self.policy.model.cfg.num_images)
        packet, _ = self.policy.inputs(images, prompt, state)
        box: Future = Future()
        self.edge.submit(packet.tensors, ("actions",), 3600.0, client,
                         lambda out, err, timings: box.set_result((out, err, timings)))  # fmt: skip
        out, err, timings = box.result()
        if err is not None:
            raise RuntimeError(err)
        model_ms = 1e3 * sum(t["compute_s"] for t in timings)
        actions = self.policy.unnormalize(out["actions"][0])
        return {"actions": np.asarray(actions, dtype=np.float32)}, model_ms

    async def _handle(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        loop = asyncio.get_running_loop()
        client = f"openpi-{id(ws)}".encode()  # one "robot" per connection (batching, dashboard)
        await ws.send(packb(self.metadata))
        prev_total_ms = None
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed:
                return
            t0 = time.perf_counter()
            try:
                if not isinstance(frame, bytes):
                    raise ValueError("requests must be binary msgpack frames")
                reply, model_ms = await loop.run_in_executor(self._pool, self._infer, frame, client)
            except Exception as e:  # noqa: BLE001 - every failure becomes openpi's error reply
                await ws.send(f"vlarun: {type(e).__name__}: {e}")
                await ws.close(1011, "inference error")
                return
            total_ms = (time.perf_counter() - t0) * 1e3
            reply["policy_timing"] = {"infer_ms": model_ms}
            reply["server_timing"] = {"infer_ms": total_ms}
            if prev_total_ms is not None:
                reply["server_timing"]["prev_total_ms"] = prev_total_ms
            await ws.send(packb(reply))
            prev_total_ms = (time.perf_counter() - t0) * 1e3
            self.requests += 1
            self.server_ms.append(prev_total_ms - model_ms)

    def start_in_thread(self, timeout_s: float = 60.0) -> Callable[[], None]:
        """Serve on an event loop of its own in a daemon thread (benchmarks, tests, an
        embedding program); returns once the port is open, with a function that stops it."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict = {}

        def run() -> None:
            asyncio.set_event_loop(loop)
            box["stop"] = asyncio.Event()
            started = asyncio.Event()

            async def main() -> None:
                task = asyncio.ensure_future(self.serve(started, box["stop"]))
                await started.wait()
                ready.set()
                await task

            loop.run_until_complete(main())

        thread = threading.Thread(target=run, daemon=True, name="vlarun-openpi")
        thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"the policy server did not start within {timeout_s:.0f} s")

        def stop() -> None:
            loop.call_soon_threadsafe(box["stop"].set)
            thread.join(10)

        return stop

    async def serve(self, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None):
        """Serve until ``stop`` is set (forever without one)."""
        from websockets.asyncio.server import serve

        options = dict(compression=None, max_size=self.max_frame,
                       process_request=self._process_request)  # fmt: skip
        self.edge.start()
        async with serve(self._handle, self.host, self.port, **options) as srv:
            self._server = srv
            self.port = srv.sockets[0].getsockname()[1]  # the real one when port 0 was asked
            if ready is not None:
                ready.set()
            await (stop.wait() if stop is not None else asyncio.Future())
        self._pool.shutdown(wait=False)
        self.edge.stop()
