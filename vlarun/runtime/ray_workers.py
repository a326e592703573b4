"""Edge workers as Ray actors: each an ``EdgeServer`` in relayed mode (its only peer is the
scale-out front, ``runtime/scaleout.py``), placed one per ``edge`` resource, restarted by Ray
when it dies. Ray carries only each incarnation's endpoint and public key; the payloads go over
ZeroMQ (the front's module docstring says why). Ray is imported only when workers start
(``pip install vlarun[scale]``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass

import zmq

from vlarun.runtime.server import ServerConfig
from vlarun.runtime.transport import KeyPair, Security

EDGE_RESOURCE = "edge"  # the Ray custom resource one worker takes (one per GPU or machine)


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker serves and how: the policy (shipped name, directory or preset),
    compute dtype and device, torch threads, and its edge server's batching settings."""

    policy: str = "tiny-ar"
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = 1
    max_batch: int = 8
    batch_window_s: float = 0.002
    max_streams: int = 64


class WorkerActor:
    """One edge worker: an ``EdgeServer`` in relayed mode inside a Ray actor, bound to this
    node's address with a key pair of its own, admitting only the front's key (or, on the
    front's own machine, to a Unix socket in the front's private folder)."""

    def __init__(
        self, spec: WorkerSpec, front_public: bytes, front_node: str, ipc_dir: str
    ) -> None:
        import ray
        import torch

        from vlarun.policy.base import Policy
        from vlarun.runtime.server import EdgeServer

        if spec.threads > 0:
            torch.set_num_threads(spec.threads)
        policy = Policy.load(spec.policy, spec.dtype, spec.device)
        host = ray.util.get_node_ip_address()
        if host == front_node and os.path.isdir(ipc_dir):
            # Beside the front: a Unix socket in the front's private (0700) folder, which only
            # this user can open; no TCP stack and no encryption on the payload's way.
            address, public = f"ipc://{ipc_dir}/worker-{os.getpid()}", None
            sec = Security(insecure=True)
        else:
            public, secret = zmq.curve_keypair()
            sec = Security(own=KeyPair(public, secret), authorized_keys=(front_public,))
            address = f"tcp://{host}:0"
        cfg = ServerConfig(
            address, spec.max_batch, spec.batch_window_s, max_streams=spec.max_streams,
            relayed=True,
        )  # fmt: skip
        self.server = EdgeServer(policy, sec, cfg)
        self.server.warmup()  # one-time costs (allocation, first kernels) ...
        self.server.queues.est_s.clear()
        self.server.warmup()  # ... are not what the front should dispatch by
        self.server.start()
        self.public = public
        self.stopped = threading.Event()

    def hello(self) -> dict:
        """Where and how to reach this incarnation, and what it serves."""
        srv = self.server
        return {
            "endpoint": srv.address,
            "public": self.public,
            "pid": os.getpid(),
            "cfg": srv.policy.model.cfg,
            "dtype": srv.dtype,
            "stage_ms": {k: v * 1e3 for k, v in srv.queues.est_s.items()},
        }

    def health(self) -> dict:
        return self.server.health()

    def lifetime(self) -> bool:
        """Returns when the worker stops; fails when it dies (how the front hears of it)."""
        self.stopped.wait()
        return True

    def stop(self) -> None:
        self.server.stop()
        self.stopped.set()


class RayWorkers:
    """Start (or join) a Ray cluster and its edge workers: ``count`` workers on a local cluster
    made here, or one per ``edge`` resource of the cluster at ``address``."""

    def __init__(self, spec: WorkerSpec, count: int = 0, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError(
                "edge workers need Ray: pip install 'vlarun[scale]' (or pip install ray)"
            ) from None
        if address is None and count < 1:
            raise ValueError("--workers must be >= 1 (or give --ray-address)")
        self.ray, self.spec = ray, spec
        self.front = KeyPair(*zmq.curve_keypair())
        self.ipc_dir = tempfile.mkdtemp(prefix="vlarun-front-")  # 0700: this user's alone
        quiet = {"include_dashboard": False, "log_to_driver": False,
                 "logging_level": logging.ERROR}  # fmt: skip
        self.owned = not ray.is_initialized()
        if self.owned and address is None:
            ray.init(num_cpus=os.cpu_count(), resources={EDGE_RESOURCE: count},
                     object_store_memory=100 << 20, **quiet)  # fmt: skip
        elif self.owned:
            ray.init(address=address, **quiet)
        # Token authentication inside the cluster: Ray's default for local clusters since 2.59
        # (it generates the token and sets RAY_AUTH_MODE itself; setting it first breaks a local
        # start). Reported in health, so a cluster running open is visible.
        self.auth_mode = os.environ.get("RAY_AUTH_MODE", "disabled")
        have = int(ray.cluster_resources().get(EDGE_RESOURCE, 0))
        count = count or have
        if have < count or count < 1:
            self.shutdown()
            raise RuntimeError(
                f"the Ray cluster offers {have} '{EDGE_RESOURCE}' resources, {count} wanted: "
                f"start each edge machine with ray start --address ADDR --resources "
                f"'{{\"{EDGE_RESOURCE}\": 1}}'"
            )
        actor = ray.remote(WorkerActor).options(
            resources={EDGE_RESOURCE: 1}, num_cpus=0, max_restarts=-1, max_task_retries=0,
            max_concurrency=4,
        )  # fmt: skip
        node = ray.util.get_node_ip_address()
        self.actors = [
            actor.remote(spec, self.front.public, node, self.ipc_dir) for _ in range(count)
        ]

    def hello(self, index: int, timeout_s: float) -> dict:
        return self.ray.get(self.actors[index].hello.remote(), timeout=timeout_s)

    def lifetime(self, index: int):
        return self.actors[index].lifetime.remote()

    def shutdown(self) -> None:
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):
                self.ray.kill(a, no_restart=True)
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        shutil.rmtree(getattr(self, "ipc_dir", ""), ignore_errors=True)
