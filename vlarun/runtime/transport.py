"""ZeroMQ sockets with CurveZMQ: keys, the edge's ROUTER and a robot's DEALER.

Secure by default: the edge's socket is a Curve server (every byte encrypted, and a client
must know the edge's public key to complete the handshake); with an authorized-keys folder,
only robots whose public keys are in it may connect (ZAP, answered off the edge's Python
threads by runtime/edge/zap.py's authorizer process).
``--insecure`` turns Curve off for local tests and says so loudly on stderr.

Key files use the ZPL certificate layout ZeroMQ's own tools read (``NAME.key`` public,
``NAME.key_secret`` public + secret), are written with mode 0600, and a secret file readable
by group or others is refused, as ssh refuses such a private key.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

INSECURE_WARNING = (
    "WARNING: --insecure: ZeroMQ traffic is NEITHER AUTHENTICATED NOR ENCRYPTED; anyone who "
    "can reach this port can send tensors and read actions. Use it only for local tests."
)
# A message larger than this is dropped by ZeroMQ before Python sees it (the peer is
# disconnected); smaller malformed messages are answered with an error.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20


def default_key_dir() -> Path:
    return Path(os.environ.get("VLARUN_KEY_DIR", Path.home() / ".config" / "vlarun" / "keys"))


@dataclass(frozen=True)
class KeyPair:
    public: bytes
    secret: bytes | None = None


def generate_keys(directory: str | Path, name: str, overwrite: bool = False) -> dict:
    """Write a new Curve key pair as ``directory/name.key`` and ``name.key_secret`` (0600)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    public, secret = zmq.curve_keypair()
    paths = {"public": directory / f"{name}.key", "secret": directory / f"{name}.key_secret"}
    if not overwrite and any(p.exists() for p in paths.values()):
        raise ValueError(f"keys {name!r} already exist in {directory} (pass --overwrite)")
    _write_cert(paths["public"], public, None)
    _write_cert(paths["secret"], public, secret)
    return {"name": name, "public_key": public.decode(), **{k: str(p) for k, p in paths.items()}}


def _write_cert(path: Path, public: bytes, secret: bytes | None) -> None:
    lines = ["#   ZeroMQ CURVE certificate written by `vlarun keys`", "metadata", "curve"]
    lines.append(f'    public-key = "{public.decode()}"')
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    # Create with 0600 directly: a chmod after writing would leave a window where it is readable.
    if path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def load_keys(path: str | Path) -> KeyPair:
    """A key file: a public certificate, or a secret one (not readable by group or others).
    A bare name (``edge.key``) that is not a file here is looked up where `vlarun keys`
    writes by default (``default_key_dir()``)."""
    path = Path(path)
    if not path.is_file() and path.parent == Path(".") and (default_key_dir() / path).is_file():
        path = default_key_dir() / path
    if not path.is_file():
        raise FileNotFoundError(
            f"key file {path} does not exist, here or in {default_key_dir()}"
            " (make one with `vlarun keys`)"
        )
    public, secret = zmq.auth.load_certificate(path)
    if secret is not None and stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise ValueError(f"secret key {path} is readable by others; chmod 600 {path}")
    return KeyPair(public, secret)


def read_secret(path: str | Path) -> str:
    """A one-line secret (an API or dashboard key) from a file only its owner can read: a
    file readable by group or others is refused, as ssh refuses such a private key."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"key file {path} does not exist")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise ValueError(f"key file {path} is readable by others; chmod 600 {path}")
    key = path.read_text().strip()
    if not key:
        raise ValueError(f"{path} is empty")
    return key


def read_keys(path: str | Path) -> tuple[str, ...]:
    """One API key per line (blank lines and ``#`` comments skipped) from a file only its
    owner can read (``read_secret``'s checks): one key per client, so a per-key share of the
    connections stops one client's key from holding every slot."""
    text = read_secret(path)
    keys = tuple(k for k in (ln.strip() for ln in text.splitlines()) if k and not k.startswith("#"))
    if not keys:
        raise ValueError(f"{path} holds no key (only comments)")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{path} lists a key twice")
    return keys


@dataclass(frozen=True)
class Security:
    """How a socket authenticates. ``insecure`` = plain TCP; otherwise ``own`` is this side's
    key pair, ``server_public`` the edge's public key (robots), ``authorized_dir`` a folder
    of robot public keys the edge accepts (None: any robot that knows the edge's key);
    ``authorized_keys``: public keys accepted besides (a scale-out worker admits only its
    front's, handed over in memory)."""

    insecure: bool = False
    own: KeyPair | None = None
    server_public: bytes | None = None
    authorized_dir: str | None = None
    authorized_keys: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if not self.insecure and self.own is None:
            raise ValueError("a secure socket needs its own key pair (or insecure=True)")


def warn_insecure() -> None:
    print(INSECURE_WARNING, file=sys.stderr, flush=True)


def peer_key(frame: zmq.Frame) -> bytes | None:
    """The authenticated key of the peer that sent ``frame`` (a frame of a message received
    with ``copy=False``): the edge's authorizer (``runtime.zap``) answers a CURVE handshake it
    admits with the client's public key in Z85 as the ZAP User-Id (as pyzmq's
    ``Authenticator.curve_user_id`` does), and ZeroMQ attaches it to every message of that
    connection. None where no ZAP handler checked a key: ``--insecure``, or a Curve edge
    without authorized keys (any client may make up keys there, so its connection is all
    there is to count)."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:  # EINVAL: the connection has no such property
        return None
    return user.encode() if user else None


# Complete messages ZeroMQ holds per robot before it stops reading that robot's connection
# (TCP then pushes back on the sender). The default, 1000, let 16 pipelining robots make an edge
# hold 2.4 GB before ``--max-queued-per-robot`` saw a single request; a robot has a request,
# a health probe and a booking in flight at most.
ROUTER_RCVHWM = 16


def router_socket(ctx: zmq.Context, address: str, sec: Security, max_bytes: int) -> zmq.Socket:
    """The edge's socket: many robots, replies routed by the robot's identity frame. What it
    buffers is bounded per robot: ``ROUTER_RCVHWM`` messages of frames up to ``max_bytes``."""
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    s.setsockopt(zmq.RCVHWM, ROUTER_RCVHWM)
    s.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a reply to a robot that left is dropped, not raised
    s.setsockopt(zmq.SNDHWM, 1000)
    if not sec.insecure:
        s.curve_server = True
        s.curve_publickey = sec.own.public
        s.curve_secretkey = sec.own.secret
    try:
        s.bind(address)
    except zmq.ZMQError as e:
        s.close()
        raise ValueError(
            f"cannot listen on {address}: {e.strerror} (another server on that "
            "port? pick another --port)"
        ) from None
    return s


# A heartbeat's answer waits behind every byte the link is still carrying (a PING sent after a
# 2 MB request on a 15 Mbit/s link is answered > 1 s later): the timeout must outlast the
# longest transfer, or a slow link drops the connection mid-request and loses the reply.
# A dead link is noticed sooner by the agent's own per-request timeout and the link
# monitor's health probes (runtime.monitor), not by this.
HEARTBEAT_TIMEOUT_MS = 30_000


def dealer_socket(
    ctx: zmq.Context, address: str, sec: Security, max_bytes: int | None = None
) -> zmq.Socket:
    """A robot's socket. IMMEDIATE: a send with no live connection fails at once instead of
    queueing, which is how the agent notices a dropped link; heartbeats make a silent dead
    peer (cable pulled, no TCP reset) drop the connection in the end (HEARTBEAT_TIMEOUT_MS).
    ``max_bytes``: ZeroMQ drops a peer that sends a larger message part (MAXMSGSIZE) before
    buffering it, so a lying edge cannot push hundreds of MB into the robot."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if max_bytes is not None:
        s.setsockopt(zmq.MAXMSGSIZE, int(max_bytes))
    s.setsockopt(zmq.IMMEDIATE, 1)
    s.setsockopt(zmq.HEARTBEAT_IVL, 200)
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    s.setsockopt(zmq.RECONNECT_IVL, 100)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, 250)  # an edge that returns is found quickly
    if not sec.insecure:
        if sec.server_public is None:
            raise ValueError("a secure robot needs the edge's public key (--server-key)")
        s.curve_serverkey = sec.server_public
        s.curve_publickey = sec.own.public
        s.curve_secretkey = sec.own.secret
    s.connect(address)
    return s


# What a robot hears when the edge turns its handshake down: ZeroMQ's monitor events (the
# CURVE handshake failing on the edge's authorization, or for want of detail / protocol).
REFUSED = {
    getattr(zmq, "EVENT_HANDSHAKE_FAILED_AUTH", 0): "it refused this robot's key",
    getattr(zmq, "EVENT_HANDSHAKE_FAILED_NO_DETAIL", 0): "the handshake failed",
    getattr(zmq, "EVENT_HANDSHAKE_FAILED_PROTOCOL", 0): "the handshake broke its protocol",
}
REFUSED.pop(0, None)


class RefusalWatch:
    """Says once, in one line on stderr, that an edge turned this socket's handshake down,
    and why (issue 66: a robot whose key was not authorized ran every request locally and
    neither side said so). ``refused``: the first reason, or None."""

    def __init__(self, sock: zmq.Socket, address: str, sec: Security, quiet: bool = False) -> None:
        self.refused: str | None = None
        self._address, self._sec, self._quiet = address, sec, quiet
        if sec.insecure or not REFUSED:
            self._mon = None
            return
        # MONITOR_STOPPED too: it is what ends the thread when the socket is reset (without it
        # in the mask, every ``stop`` waited out its 1 s join, and the link monitor's reset
        # after each failed probe held the return to a restored edge ~2 s).
        events = zmq.EVENT_MONITOR_STOPPED
        for e in REFUSED:
            events |= e
        self._mon = sock.get_monitor_socket(events)
        self._thread = threading.Thread(target=self._run, daemon=True, name="refusal-watch")
        self._thread.start()

    def _run(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(self._mon)
            except zmq.ZMQError:  # the context went away
                return
            if event.get("event") == zmq.EVENT_MONITOR_STOPPED:
                self._mon.close(0)  # closed here, by the thread that reads it
                return
            why = REFUSED.get(event.get("event"))
            if why is not None and self.refused is None:
                self.refused = why
                if self._quiet:
                    continue
                key = z85_public(self._sec)
                print(
                    f"vlarun: the edge at {self._address} turned this robot down ({why}): "
                    f"every request runs here until it accepts the robot's public key {key}; "
                    "give the robot an authorized key pair (keys=ROBOT.key_secret / --keys) "
                    "or copy ROBOT.key into the edge's --authorized-keys folder",
                    file=sys.stderr,
                    flush=True,
                )

    def stop(self, sock: zmq.Socket) -> None:
        """Before ``sock`` closes: its monitor stops, and the watching thread closes it."""
        if self._mon is not None:
            sock.disable_monitor()
            self._thread.join(timeout=1.0)


def z85_public(sec: Security) -> str:
    """The socket's own public key as the .key files write it (Z85)."""
    key = sec.own.public if sec.own is not None else b""
    return key.decode() if isinstance(key, bytes) else str(key)


def robot_security(insecure: bool, server_key: str | None, keys: str | None) -> Security:
    """Security of a robot from CLI-style options; an ephemeral key pair when none is given
    (fine unless the edge restricts robots to authorized keys)."""
    if insecure:
        warn_insecure()
        return Security(insecure=True)
    if server_key is None:
        path = default_key_dir() / "edge.key"
        if not path.exists():
            raise ValueError(
                "give --server-key EDGE.key (the edge's public key, made by `vlarun keys`) "
                "or --insecure for a local test"
            )
        server_key = str(path)
    own = load_keys(keys) if keys else KeyPair(*zmq.curve_keypair())
    if own.secret is None:
        raise ValueError(f"{keys} holds no secret key; pass the .key_secret file")
    return Security(own=own, server_public=load_keys(server_key).public)


def edge_security(insecure: bool, keys: str | None, authorized: str | None) -> Security:
    """Security of the edge from CLI-style options (default key: ~/.config/vlarun/keys/edge)."""
    if insecure:
        warn_insecure()
        return Security(insecure=True)
    path = Path(keys) if keys else default_key_dir() / "edge.key_secret"
    if not path.exists():
        raise ValueError(
            f"no edge key at {path}: run `vlarun keys --name edge` first "
            "(or pass --insecure for a local test)"
        )
    own = load_keys(path)
    if own.secret is None:
        raise ValueError(f"{path} holds no secret key; pass the .key_secret file")
    if authorized is not None and not Path(authorized).is_dir():
        folder = str(authorized).rstrip("/") or "/"
        raise ValueError(
            f"authorized-keys folder {authorized} does not exist: make it and copy each "
            f"robot's public key into it (`vlarun keys --name robot1 --out keys/` writes "
            f"keys/robot1.key; `mkdir -p {folder} && cp keys/robot1.key {folder}/`; the robot "
            "then runs with keys/robot1.key_secret)"
        )
    return Security(own=own, authorized_dir=authorized)
