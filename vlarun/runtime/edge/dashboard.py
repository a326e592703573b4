"""`vlarun serve-edge --dashboard PORT`: the edge, live, in a browser and for Prometheus.

One small HTTP server (a thread beside the edge's own two) serves
  /              a static page (``static/dashboard.html``, its ``.js`` inlined; no build step,
                 no CDN, no charting library: the chart is a hand-drawn SVG) that
                 polls /api/state twice a second and draws it: robots connected, per-stage
                 queue depth and batch size, server latency against each request's deadline
                 over time, the segments and settings robots send, refusals and expiries, and
                 the edge's energy with its source;
  /api/state     that state as JSON;
  /metrics       the same as Prometheus text (``prometheus-client``);
  /healthz       "ok" (no data, no key: for load balancers).
Everything but /healthz needs the dashboard key: ``?key=`` on the page's address (the page
sends it on as a bearer token) or ``Authorization: Bearer KEY`` (Prometheus' ``authorization``
setting), compared in constant time. Without ``--dashboard-key-file`` a random key is made
and printed with the address at start, as Jupyter does.

The edge sees its own side only: what each robot sends (the segments of its plans, their
settings), how long the edge held each request against the deadline the robot gave it, and
what it refused. A robot's own latency and fallbacks are the robot's (``run-robot --log``).
Energy is modelled: measured compute time x the catalog busy power of the device the edge
is (``this-cpu``: no meter is read here).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlparse

import numpy as np

from vlarun.runtime.edge.server import robot_id
from vlarun.sched.catalog import get_device
from vlarun.sched.energy import stage_energy

WINDOW = 300  # replies the statistics cover (the chart shows them all)
# A request must arrive whole within this (a silent or trickling peer is cut off), and no
# more than MAX_CONNECTIONS are served at once (each holds a thread): half-open connections
# cannot pile up threads. The page and a Prometheus scrape need well under a second.
REQUEST_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64
ACTIVE_S = 2.0  # a robot that sent data this recently is "connected"
COUNTS = ("requests", "replies", "refused", "expired", "errors")


class Dashboard:
    """Serves ``server``'s live state on ``host:port`` (0: a free port; ``.url`` tells which)."""

    def __init__(
        self,
        server,
        host: str = "127.0.0.1",
        port: int = 0,
        key: str | None = None,
        device: str = "this-cpu",
        timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.server, self.key = server, key or secrets.token_urlsafe(16)
        self.device = get_device(device)
        self.started = time.monotonic()
        handler = type("Handler", (_Handler,), {"dashboard": self, "timeout": timeout_s})
        self.http = _BoundedHTTPServer((host, port), handler)
        self.http.slots = threading.BoundedSemaphore(max_connections)
        self.http.deadline_s = timeout_s
        self.http.daemon_threads = True
        self.port = self.http.server_address[1]
        self.url = f"http://{host}:{self.port}/?key={self.key}"
        self._thread: threading.Thread | None = None
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def start(self) -> Dashboard:
        self._thread = threading.Thread(
            target=self.http.serve_forever, name="edge-dashboard", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def authorised(self, header: str | None, query_key: str | None) -> bool:
        given = query_key or ""
        if header and header.startswith("Bearer "):
            given = header[len("Bearer ") :]
        return hmac.compare_digest(given.encode(), self.key.encode())

    # -- the state --------------------------------------------------------------------------------

    def state(self) -> dict:
        """Everything the page draws, from the edge's counters and its last replies."""
        srv, now = self.server, time.monotonic()
        recent = list(srv.recent)[-WINDOW:]
        health = srv.health()
        server_ms = np.array([r["server_s"] * 1e3 for r in recent])
        met = [r["server_s"] <= r["budget_s"] for r in recent]
        robots = {}
        for rid, seen in srv.core.seen().items():
            if now - seen < ACTIVE_S:
                robots[robot_id(rid)] = {
                    "last_seen_s": round(now - seen, 3),
                    "requests": 0,
                    "segments": {},
                    "settings": {},
                    "server_ms": [],
                }
        for r in recent:
            row = robots.get(r["robot"])
            if row is None:
                continue
            row["requests"] += 1
            row["segments"][r["stages"]] = row["segments"].get(r["stages"], 0) + 1
            row["settings"][r["setting"]] = row["settings"].get(r["setting"], 0) + 1
            row["server_ms"].append(r["server_s"] * 1e3)
        for row in robots.values():
            ms = row.pop("server_ms")
            row["p50_ms"] = float(np.median(ms)) if ms else None
        batches: dict[str, list[int]] = {}
        for r in recent:
            for stage, b in r["batch"].items():
                batches.setdefault(stage, []).append(b)
        compute_s = srv.stats.get("compute_s", 0.0)
        return {
            "model": health["model"],
            "family": health["family"],
            "secure": health["secure"],
            "uptime_s": round(health["uptime_s"], 1),
            "robots": robots,
            "queue": health["queue"],
            "batch_mean": {s: float(np.mean(b)) for s, b in batches.items()},
            "stage_ms": health["stage_ms"],
            "workers": health.get("workers", []),  # a scale-out front's workers
            "latency": {
                "t_s": [round(r["t"] - now, 3) for r in recent],
                "server_ms": server_ms.round(3).tolist(),
                "deadline_ms": [round(r["budget_s"] * 1e3, 3) for r in recent],
            },
            "p50_ms": float(np.percentile(server_ms, 50)) if len(recent) else None,
            "p99_ms": float(np.percentile(server_ms, 99)) if len(recent) else None,
            "deadline_met": sum(met) / len(met) if met else None,
            "counts": {
                k: health[k] for k in ("requests", "replies", "refused", "expired", "errors")
            },
            "events": [dict(e, t=round(e["t"] - now, 3)) for e in list(srv.events)[-20:]],
            "energy": {
                "joules": stage_energy(self.device, compute_s, 1.0),
                "compute_s": compute_s,
                "source": f"modelled: measured compute time x {self.device.id} busy power "
                f"({self.device.busy_w:g} W, catalog); no meter read",
            },
        }

    def metrics(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _Collector:
    """Prometheus metrics drawn from ``Dashboard.state`` at scrape time."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.dash.state()
        yield GaugeMetricFamily(
            "vlarun_edge_robots_connected",
            f"robots that sent data in the last {ACTIVE_S:g} s",
            value=len(st["robots"]),
        )
        yield _per_stage("vlarun_edge_queue_depth", "requests queued per stage", st["queue"])
        recent = f"mean batch per stage over the last {WINDOW} replies"
        yield _per_stage("vlarun_edge_batch_size_mean", recent, st["batch_mean"])
        lat = GaugeMetricFamily(
            "vlarun_edge_server_latency_seconds",
            f"edge time per request over the last {WINDOW} replies",
            labels=["quantile"],
        )
        for q, key in (("0.5", "p50_ms"), ("0.99", "p99_ms")):
            if st[key] is not None:
                lat.add_metric([q], st[key] / 1e3)
        yield lat
        if st["deadline_met"] is not None:
            yield GaugeMetricFamily(
                "vlarun_edge_deadline_met_ratio",
                "share of recent replies sent within their deadline",
                value=st["deadline_met"],
            )
        for name, value in st["counts"].items():
            yield CounterMetricFamily(f"vlarun_edge_{name}", f"{name} since start", value=value)
        energy = CounterMetricFamily(
            "vlarun_edge_energy_joules", "edge energy since start (modelled)", labels=["source"]
        )
        energy.add_metric(["modelled"], st["energy"]["joules"])
        yield energy


def _per_stage(name: str, text: str, values: dict):
    """One gauge with a sample per stage."""
    from prometheus_client.core import GaugeMetricFamily

    gauge = GaugeMetricFamily(name, text, labels=["stage"])
    for stage, value in values.items():
        gauge.add_metric([stage], value)
    return gauge


def page() -> bytes:
    """The page with its script inlined: one authenticated request serves it all."""
    static = resources.files("vlarun.runtime.edge").joinpath("static")
    html = static.joinpath("dashboard.html").read_text()
    script = static.joinpath("dashboard.js").read_text()
    return html.replace(
        '<script src="dashboard.js"></script>', f"<script>\n{script}</script>"
    ).encode()


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most ``slots`` at once (beyond: closed unanswered), each
    cut off ``deadline_s`` after it was accepted whatever it is doing (the handler's socket
    timeout alone lets a peer trickle a byte at a time for ever)."""

    slots: threading.BoundedSemaphore
    deadline_s: float

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        timer = threading.Timer(self.deadline_s, _cut, (request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self.slots.release()

    def handle_error(self, request, client_address) -> None:  # a cut peer is not news
        pass


def _cut(sock) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    dashboard: Dashboard  # set on the subclass made per dashboard

    def log_message(self, *args) -> None:  # quiet: the edge prints its own lines
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        url = urlparse(self.path)
        if url.path == "/healthz":
            return self._send(200, b"ok", "text/plain")
        auth = self.headers.get_all("Authorization") or []
        if len(auth) > 1:  # which one would count? refuse, do not guess
            return self._send(400, b"more than one Authorization header", "text/plain")
        key = parse_qs(url.query).get("key", [None])[0]
        if not self.dashboard.authorised(auth[0] if auth else None, key):
            return self._send(401, b"dashboard key missing or wrong", "text/plain")
        if url.path == "/":
            return self._send(200, page(), "text/html; charset=utf-8")
        if url.path == "/api/state":
            return self._send(200, json.dumps(self.dashboard.state()).encode(), "application/json")
        if url.path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            return self._send(200, self.dashboard.metrics(), CONTENT_TYPE_LATEST)
        return self._send(404, b"not found", "text/plain")

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)
