"""Edge workers as Ray actors: each an ``EdgeServer`` in relayed mode (its only peer is the
scale-out front, ``runtime/scaleout/front.py``), placed one per ``edge`` resource, restarted by Ray
when it dies. Ray carries only each incarnation's endpoint and public key; the payloads go over
ZeroMQ (the front's module docstring says why). Ray is imported only when workers start
(``pip install vlarun[scale]``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass

import zmq

from vlarun.runtime.edge.server import ServerConfig
from vlarun.runtime.scaleout import proctree
from vlarun.runtime.scaleout.proctree import is_loopback
from vlarun.runtime.scaleout.reaper import Reaper
from vlarun.runtime.transport import DEFAULT_MAX_MESSAGE_BYTES, KeyPair, Security

EDGE_RESOURCE = "edge"  # the Ray custom resource one worker takes (one per GPU or machine)


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker serves and how: the policy (shipped name, directory or preset),
    compute dtype and device, torch threads, and its edge server's batching settings and
    bounds (the front's: a frame the front accepted is accepted by the worker too)."""

    policy: str = "tiny-ar"
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = 1
    max_batch: int = 8
    batch_window_s: float = 0.002
    max_streams: int = 64
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # per frame: at least the front's
    max_queued: int = 256


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
        from vlarun.runtime.edge.server import EdgeServer

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
            address,
            spec.max_batch,
            spec.batch_window_s,
            max_streams=spec.max_streams,
            max_message_bytes=spec.max_message_bytes,
            max_queued=spec.max_queued,
            relayed=True,
        )
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


@contextlib.contextmanager
def _loopback_node(ray):
    """A local cluster started inside this block has 127.0.0.1 as its node address, and
    Ray's core services (GCS, raylet, object manager, core workers, agents, the autoscaler's
    metrics) then listen on loopback only. Ray on Linux turns a 127.0.0.1 node address into
    the machine's outward address unless clusters are "disabled" (as on macOS and Windows,
    where Ray keeps a local cluster on loopback); that switch has no other effect (Ray 2.60:
    it is read in ``get_node_ip_address`` only). Its processes inherit the environment
    variable; this process's copy is restored after the start."""
    from ray._private import ray_constants

    name, value = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"
    before_env, before_const = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name], ray_constants.ENABLE_RAY_CLUSTER = value, False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before_env


class RayWorkers:
    """Start (or join) a Ray cluster and its edge workers: ``count`` workers on a local cluster
    made here, or one per ``edge`` resource of the cluster at ``address``.

    A local cluster listens on loopback only (``host`` 127.0.0.1, the default): its workers
    are on this machine, so nothing of Ray needs to be reachable from elsewhere; ``check``
    then verifies it after the workers start. Another ``host`` is the node address other
    machines would join at (Ray then listens on every interface, token-authenticated). Ray's
    dashboard is off and usage statistics are not sent (unless RAY_USAGE_STATS_ENABLED says
    otherwise). A reaper process (runtime/scaleout/reaper.py) stops this cluster's processes and
    removes the front's folder however this process ends."""

    def __init__(
        self,
        spec: WorkerSpec,
        count: int = 0,
        address: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
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
        self.owned = not ray.is_initialized()
        self.local = self.owned and address is None
        self.loopback = self.local and is_loopback(host)
        self.ray_mark = os.path.dirname(ray.__file__)  # in the command line of Ray's processes
        self.reaper: Reaper | None = None
        try:
            self.reaper = Reaper(self.ipc_dir, self.ray_mark)
            self._start(count, address, host)
        except BaseException:  # a signal's SystemExit or KeyboardInterrupt included
            self.shutdown()
            raise

    def _start(self, count: int, address: str | None, host: str) -> None:
        # ray.init replaces this process's SIGTERM handler (Python's, and a C++ one that dumps
        # a stack and aborts): the caller's is put back, so its orderly stop still runs.
        main = threading.current_thread() is threading.main_thread()
        before = signal.getsignal(signal.SIGTERM) if main else None
        try:
            self._init(count, address, host)
        finally:
            if before is not None:
                signal.signal(signal.SIGTERM, before)
        self._workers(count)

    def _init(self, count: int, address: str | None, host: str) -> None:
        ray = self.ray
        quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
        if self.local:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            # Ray starts its workers at nice 15 (``worker_niceness``): an edge worker is the
            # edge's inference, and at nice 15 any other process on the machine starves it (two
            # busy loops beside the tests: tiny-ar requests past a 5 s budget). A cluster
            # started elsewhere needs ``RAY_worker_niceness=0`` in its environment (docs).
            local = {
                "num_cpus": os.cpu_count(),
                "resources": {EDGE_RESOURCE: count},
                "object_store_memory": 100 << 20,
                "_system_config": {"worker_niceness": 0},
                **quiet,
            }
            if self.loopback:
                with _loopback_node(ray):
                    ray.init(_node_ip_address="127.0.0.1", **local)
            elif host in ("0.0.0.0", "::", ""):
                ray.init(**local)
            else:
                ray.init(_node_ip_address=host, **local)
        elif self.owned:
            ray.init(address=address, **quiet)

    def _workers(self, count: int) -> None:
        ray = self.ray
        # Token authentication inside the cluster: Ray's default for local clusters since 2.59
        # (it generates the token and sets RAY_AUTH_MODE itself; setting it first breaks a local
        # start). Reported in health, so a cluster running open is visible.
        self.auth_mode = os.environ.get("RAY_AUTH_MODE", "disabled")
        have = int(ray.cluster_resources().get(EDGE_RESOURCE, 0))
        count = count or have
        if have < count or count < 1:
            raise RuntimeError(
                f"the Ray cluster offers {have} '{EDGE_RESOURCE}' resources, {count} wanted: "
                f"start each edge machine with ray start --address ADDR --resources "
                f"'{{\"{EDGE_RESOURCE}\": 1}}'"
            )
        actor = ray.remote(WorkerActor).options(
            resources={EDGE_RESOURCE: 1},
            num_cpus=0,
            max_restarts=-1,
            max_task_retries=0,
            max_concurrency=4,
        )
        node = ray.util.get_node_ip_address()
        self.actors = [
            actor.remote(self.spec, self.front.public, node, self.ipc_dir) for _ in range(count)
        ]

    def hello(self, index: int, timeout_s: float) -> dict:
        return self.ray.get(self.actors[index].hello.remote(), timeout=timeout_s)

    def lifetime(self, index: int):
        return self.actors[index].lifetime.remote()

    def processes(self) -> dict[int, int]:
        """This machine's processes of the local cluster started here: Ray's children of this
        process and everything below them (pid -> start time); none for a joined cluster."""
        if not self.local:
            return {}
        tree = proctree.children()
        ours = {p: s for p, s in tree.get(os.getpid(), []) if self.ray_mark in proctree.cmdline(p)}
        if self.reaper is not None:  # its command line names Ray's folder too
            ours.pop(self.reaper.proc.pid, None)
        return ours | proctree.descendants(*ours, tree=tree)

    def exposed(self, own_ports: tuple[int, ...] = ()) -> list[proctree.Listener]:
        """The cluster's TCP listeners on other than loopback (this process's own count too:
        the driver serves Ray's core worker protocol), ``own_ports`` (the front's robot-facing
        socket) aside."""
        mine = [x for x in proctree.listeners([os.getpid()]) if x.port not in own_ports]
        theirs = proctree.listeners(self.processes())
        return [x for x in mine + theirs if not x.loopback]

    def check(self, own_ports: tuple[int, ...] = ()) -> None:
        """Refuse to run a loopback cluster that listens elsewhere (a Ray that binds its
        services differently): raise, naming the sockets."""
        if not self.loopback:
            return
        bad = self.exposed(own_ports)
        if bad:
            raise RuntimeError(
                "the local Ray cluster listens on other than loopback ("
                + "; ".join(map(str, bad[:4]))
                + "): refusing to serve; pass --ray-host ADDRESS to accept that"
            )

    def shutdown(self) -> None:
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):
                self.ray.kill(a, no_restart=True)
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        shutil.rmtree(getattr(self, "ipc_dir", ""), ignore_errors=True)
        if self.reaper is not None:
            self.reaper.close()  # it stops whatever Ray left and exits
