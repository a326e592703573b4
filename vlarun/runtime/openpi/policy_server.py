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
    void and complex dtypes are refused (openpi's decoder refuses them too); the prompt's
    byte length is checked while parsing, before it is built or tokenized;
  * memory is bounded per connection and in total, and every request has a server-side time
    budget (``ServeLimits``): beyond a limit the client hears "busy" at once (a text frame,
    then close 1013); a client that leaves has its queued request dropped at once;
  * inference runs off the event loop, so a slow request never stalls the handshakes, health
    checks and frame parsing of other clients (openpi issue #717): each request goes into the
    per-stage queues of an in-process edge server (``EdgeServer.submit``), the same queues,
    batching and worker robots' requests use, so requests of several clients that arrive
    together run as one batch per stage (same instruction length; ``max_batch`` at most).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlarun.runtime.edge.refusal_log import RefusalLog
from vlarun.runtime.openpi.memory import Trimmer
from vlarun.runtime.openpi.observation import (
    MAX_FRAME,
    ObservationLayout,
    expected_inputs,
    packb,
    unpackb,
)


def _peer(connection) -> str:
    """host:port of a WebSocket connection's peer, for the refusal log."""
    addr = getattr(connection, "remote_address", None)
    return f"{addr[0]}:{addr[1]}" if addr else "?"


# -- the server ---------------------------------------------------------------------------------


READ_CHUNK = 256 * 1024  # asyncio reads a socket this much at a time (selector transport)


@dataclass(frozen=True)
class ServeLimits:
    """What one openpi client may make the policy server hold, and all of them together.

    Memory per connection is bounded by construction: the handler serves one request at a
    time (openpi's protocol is strictly request then reply), the WebSocket layer holds at most
    one more complete frame and stops reading the socket until that one is taken
    (``max_queue=0``), so a connection holds at most ``per_connection_bytes``. Frames being
    decoded, queued or run count against ``max_inflight_bytes`` in all; a frame beyond it, a
    connection beyond ``max_connections`` and a request predicted to miss ``budget_s`` are
    answered "busy" at once (a text frame, then close 1013), never after a wait."""

    max_frame: int = MAX_FRAME
    # An instruction is a sentence; 4 KiB is pages of it. Checked before tokenizing.
    max_prompt_bytes: int = 4096
    max_connections: int = 32
    # Connections one API key may hold at once (None: an equal share of max_connections among
    # the server's keys, all of them with one key): one client's key cannot hold every slot.
    max_connections_per_key: int | None = None
    max_inflight_bytes: int = 256 * 2**20
    # Server-side time budget of a request (queueing + model): openpi requests carry no
    # deadline, so the server gives each one; beyond it the client hears "busy".
    budget_s: float = 10.0
    handshake_timeout_s: float = 5.0  # TCP open to WebSocket upgraded (slow or silent peers)
    # No complete request frame for this long (idle, or a frame trickling in) closes the
    # connection, so silent peers cannot hold connection slots for ever.
    idle_timeout_s: float = 120.0
    # A connection that has sent no request yet holds a slot for nothing: the first frame must
    # come sooner (40 idle authenticated connections held 30 of 30 slots for 120 s).
    first_frame_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_frame < 1024:
            raise ValueError(f"max_frame must be >= 1024 bytes, got {self.max_frame}")
        if self.max_inflight_bytes < self.max_frame:
            raise ValueError("max_inflight_bytes must be >= max_frame (one request must fit)")
        if self.max_prompt_bytes < 1 or self.max_connections < 1:
            raise ValueError("max_prompt_bytes and max_connections must be >= 1")
        if self.max_connections_per_key is not None and self.max_connections_per_key < 1:
            raise ValueError("max_connections_per_key must be >= 1")
        if (
            min(
                self.budget_s,
                self.handshake_timeout_s,
                self.idle_timeout_s,
                self.first_frame_timeout_s,
            )
            <= 0
        ):
            raise ValueError("budget_s and the timeouts must be > 0")

    @property
    def per_connection_bytes(self) -> int:
        """The most request bytes one connection makes the server hold: the frame being
        served and its decoded copy (msgpack copies each array's bytes once), one complete
        frame waiting, and one socket read of the next."""
        return 3 * self.max_frame + READ_CHUNK


class Busy(Exception):
    """The server cannot take this request now (connections, bytes in flight, time budget):
    answered at once with close code 1013 (try again later)."""


def server_metadata(policy, layout: ObservationLayout) -> dict:
    """The first frame each client receives unless the server is given its own: what is
    served, and the inputs it expects (``expected_inputs``)."""
    cfg = policy.model.cfg
    return {
        "server": "vlarun",
        "policy": cfg.name,
        "family": cfg.family,
        "action_horizon": cfg.horizon,
        "action_dim": policy.action_size,
        "image_keys": list(layout.image_keys),
        "state_key": layout.state_key,
        "prompt_key": layout.prompt_key,
        **expected_inputs(policy, layout),
    }


class OpenpiPolicyServer:
    """Serves ``policy`` (a vlarun Policy) over openpi's protocol; see the module docstring.

    ``api_key`` None accepts any client (say so loudly where it is started); ``metadata`` is
    the first frame each client receives; ``limits`` bounds what clients can make it hold."""

    def __init__(
        self,
        policy,
        layout: ObservationLayout,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_key: str | tuple[str, ...] | None = None,
        limits: ServeLimits | None = None,
        metadata: dict | None = None,
        max_batch: int = 8,
        batch_window_s: float = 0.002,
    ) -> None:
        from vlarun.runtime.edge.server import EdgeServer, ServerConfig
        from vlarun.runtime.transport import Security

        self.policy, self.layout = policy, layout
        self.host, self.port = host, port
        keys = (api_key,) if isinstance(api_key, str) else api_key
        self._expected = None if keys is None else [f"Api-Key {k}".encode() for k in keys]
        self.limits = limits or ServeLimits()
        share = self.limits.max_connections // len(keys) if keys else 0
        self.per_key = self.limits.max_connections_per_key or max(share, 1)
        self.by_key: dict[int, int] = {}  # key index -> open connections authenticated by it
        self.metadata = metadata if metadata is not None else server_metadata(policy, layout)
        # The model runs on the edge's worker thread; requests wait for it on the event loop.
        cfg_edge = ServerConfig(
            f"inproc://vlarun-openpi-{id(self)}", max_batch, batch_window_s, admission=False
        )
        self.edge = EdgeServer(policy, Security(insecure=True), cfg_edge)  # no network socket
        self.edge.warmup()
        # Decoding and tokenizing run here, off the event loop; two threads, because that work
        # mostly holds the interpreter lock (more threads would only queue on it).
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="vlarun-decode")
        self.requests = 0
        self.server_ms: list[float] = []  # per request: server time minus model time
        self.refusals = {"busy": 0, "error": 0, "idle": 0, "gone": 0}
        self.connections = 0  # open WebSocket connections (handlers running)
        self.inflight_bytes = 0  # request frames being decoded, queued or run
        self._clients = itertools.count()
        self._server = None
        self.refusal_log = RefusalLog()
        self.trimmer = Trimmer()  # gives a burst's freed request memory back to the OS
        self._trim_later: asyncio.TimerHandle | None = None  # a trim put off (``Trimmer.wait_s``)

    # handshake: health, then authentication and the connection cap, before any WebSocket
    def _process_request(self, connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self._expected is not None:
            sent = request.headers.get_all("Authorization")
            if len(sent) > 1:  # which one would count? refuse, do not guess
                return connection.respond(
                    http.HTTPStatus.BAD_REQUEST, "more than one Authorization header\n"
                )
            given = sent[0].encode() if sent else b""
            # every key compared, in constant time each: which one matched takes no less time
            matched = [i for i, k in enumerate(self._expected) if hmac.compare_digest(given, k)]
            if not matched:
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, "bad or missing API key\n")
            key = matched[0]
            if self.by_key.get(key, 0) >= self.per_key:
                self.refusals["busy"] += 1
                self.refusal_log.refused("busy", _peer(connection), "the per-key connection limit")
                return connection.respond(
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    f"busy: this API key holds {self.per_key} connections, its share "
                    "(--max-connections-per-key)\n",
                )
            connection.vlarun_key = key
        if self.connections >= self.limits.max_connections:
            self.refusals["busy"] += 1
            self.refusal_log.refused("busy", _peer(connection), "the connection limit")
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"busy: {self.connections} connections, the limit (--max-connections)\n",
            )
        return None

    def _prepare(self, frame: bytes) -> dict:
        """Decode one request and make the model's inputs (a worker thread: CPU work)."""
        obs = unpackb(frame, self.limits.max_prompt_bytes)
        images, state, prompt = self.layout.inputs(
            obs, self.policy.model.cfg.num_images, self.limits.max_prompt_bytes
        )
        packet, _ = self.policy.inputs(images, prompt, state)
        return packet.tensors

    async def _infer(self, ws, frame: bytes, client: bytes) -> tuple[dict, float] | None:
        """One request: decode off the loop, queue it on the edge with the server's time
        budget, wait for it or for the client to go (then its work is dropped at once).
        None: the client has gone. The model time is the compute of the stage batches it ran
        in (each batch's whole time: it waited for all of it)."""
        from vlarun.runtime.edge.server import Refused

        loop = asyncio.get_running_loop()
        size = len(frame)
        if self.inflight_bytes + size > self.limits.max_inflight_bytes:
            raise Busy(
                f"{self.inflight_bytes} request bytes in flight, the limit is "
                f"{self.limits.max_inflight_bytes} (--max-inflight-mb)"
            )
        self.inflight_bytes += size
        try:
            tensors = await loop.run_in_executor(self._pool, self._prepare, frame)
            result: asyncio.Future = loop.create_future()

            def done(out, err, timings) -> None:  # on the edge's worker thread
                loop.call_soon_threadsafe(_settle, result, (out, err, timings))

            budget = self.limits.budget_s
            try:
                job = self.edge.submit(tensors, ("actions",), budget, client, done, admit=True)
            except Refused as e:
                raise Busy(f"{e} (--budget-s {budget:g})") from None
            del tensors
            closed = asyncio.ensure_future(ws.wait_closed())
            try:
                # A stage already running cannot be stopped: a little past the budget, then
                # the request is given up whatever the worker does.
                await asyncio.wait(
                    {result, closed}, timeout=budget + 1.0, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                closed.cancel()
            if not result.done():
                self.edge.cancel(job)
                if ws.close_code is not None:
                    return None
                raise Busy(f"not served within the time budget of {budget:g} s (--budget-s)")
            out, err, timings = result.result()
        finally:
            self.inflight_bytes -= size
        if err is not None:
            if "deadline passed" in err:
                raise Busy(f"not served within the time budget of {budget:g} s (--budget-s)")
            raise RuntimeError(err)
        model_ms = 1e3 * sum(t.compute_s for t in timings)
        actions = self.policy.unnormalize(out["actions"][0])
        return {"actions": np.asarray(actions, dtype=np.float32)}, model_ms

    async def _handle(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        # One "robot" per connection (batching, dashboard); a counter, as ids can be reused.
        client = f"openpi-{next(self._clients)}".encode()
        self.connections += 1
        key = getattr(ws, "vlarun_key", None)
        if key is not None:
            self.by_key[key] = self.by_key.get(key, 0) + 1
        try:
            if self.connections > self.limits.max_connections:  # handshakes that raced
                raise Busy(f"{self.connections - 1} connections, the limit (--max-connections)")
            await ws.send(packb(self.metadata))
            await self._serve(ws, client)
        except Busy as e:
            self.refusals["busy"] += 1
            self.refusal_log.refused("busy", client.decode(), str(e))
            await _refuse(ws, f"vlarun: busy: {e}", 1013, "busy")
        except ConnectionClosed:  # the client left mid-reply: nothing to answer, nothing to log
            self.refusals["gone"] += 1
        finally:
            self.connections -= 1
            if key is not None:
                self.by_key[key] -= 1
            self._trim_when_due(self.connections == 0)

    def _trim_when_due(self, idle: bool) -> None:
        """Trim after a burst (``memory.Trimmer``), off the loop (a trim of a large heap takes
        a while); when the last trim was too recent, once it is not."""
        wait = self.trimmer.wait_s(idle)
        if wait is None or self._trim_later is not None:
            return
        loop = asyncio.get_running_loop()
        if wait > 0:  # asked again then, with the connections open then
            self._trim_later = loop.call_later(wait, self._trim_again)
        else:
            loop.run_in_executor(None, self.trimmer.maybe_trim, idle)

    def _trim_again(self) -> None:
        self._trim_later = None
        self._trim_when_due(self.connections == 0)

    async def _serve(self, ws, client: bytes) -> None:
        """Request after request on one connection until the client leaves or errs."""
        from websockets.exceptions import ConnectionClosed

        prev_total_ms = None
        first = True
        while True:
            lim = self.limits
            wait = lim.first_frame_timeout_s if first else lim.idle_timeout_s
            try:
                frame = await asyncio.wait_for(ws.recv(), wait)
            except TimeoutError:
                self.refusals["idle"] += 1
                await _refuse(ws, None, 1001, "idle timeout")
                return
            except ConnectionClosed:
                return
            first = False
            t0 = time.perf_counter()
            # Every frame read is memory to give back once it is freed, served or refused.
            self.trimmer.handled(len(frame))
            try:
                if not isinstance(frame, bytes):
                    raise ValueError("requests must be binary msgpack frames")
                served = await self._infer(ws, frame, client)
            except (Busy, ConnectionClosed):
                raise
            except Exception as e:  # noqa: BLE001 - every failure becomes openpi's error reply
                self.refusals["error"] += 1
                self.refusal_log.refused("error", client.decode(), f"{type(e).__name__}: {e}")
                await _refuse(ws, f"vlarun: {type(e).__name__}: {e}"[:400], 1011, "inference error")
                return
            if served is None:  # the client went while its request waited: already dropped
                self.refusals["gone"] += 1
                return
            reply, model_ms = served
            total_ms = (time.perf_counter() - t0) * 1e3
            reply["policy_timing"] = {"infer_ms": model_ms}
            reply["server_timing"] = {"infer_ms": total_ms}
            if prev_total_ms is not None:
                reply["server_timing"]["prev_total_ms"] = prev_total_ms
            await ws.send(packb(reply))
            prev_total_ms = (time.perf_counter() - t0) * 1e3
            self.requests += 1
            self.server_ms.append(prev_total_ms - model_ms)
            del self.server_ms[:-4096]  # a bounded window, not the whole history

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

        lim = self.limits
        # max_queue=0: once one complete frame waits unread, the socket is not read further
        # (TCP pushes back on the client), so a pipelining client holds one frame, not 16.
        options = dict(
            compression=None,
            max_size=lim.max_frame,
            max_queue=0,
            open_timeout=lim.handshake_timeout_s,
            process_request=self._process_request,
        )
        self.edge.start()
        try:  # a port that cannot be bound must not leave the edge's threads running
            async with serve(self._handle, self.host, self.port, **options) as srv:
                self._server = srv
                self.port = srv.sockets[0].getsockname()[1]  # the real one when port 0 was asked
                if ready is not None:
                    ready.set()
                await (stop.wait() if stop is not None else asyncio.Future())
        finally:
            self._pool.shutdown(wait=False)
            self.edge.stop()


def _settle(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():  # the waiter may have given up (client gone, budget spent)
        fut.set_result(value)


async def _refuse(ws, text: str | None, code: int, reason: str) -> None:
    """openpi's error reply: one text line (when there is one), then close with ``code``;
    a client that has already gone is not an error."""
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        if text is not None:
            await ws.send(text)
        await ws.close(code, reason)
