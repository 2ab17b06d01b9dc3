"""ZeroMQ CURVE for the sockets between nodes: the cluster's key pair, and who may connect.

Why: a joined node's engines and the scheduler speak over plain TCP (control messages and
KV bytes). Off loopback anyone who can reach a port could send a forged message or read KV;
CURVE (CurveZMQ: Curve25519 key exchange, every frame encrypted and authenticated)
closes that. Every mailbox (PULL) is a CURVE server with the cluster's secret key; every
sender (PUSH) a CURVE client holding the cluster's key pair, and a ZAP handler in each
process admits only clients whose public key is the cluster's. A peer without the keys
fails the handshake (a wrong server key) or is refused by ZAP (a key of its own): no
message of it is delivered.

One key pair per cluster: the scheduler keeps it under its state directory (mode 0600,
``curve-PORT.key``) so a restarted scheduler keeps it, and hands it to a joining node in
the answer to its join request, which needs the cluster's token. Engines get it in their
:class:`~dualpath_cli.runtime.context.EngineSpec` (the spawn pipe), never in a command line
or the environment.

Modes (config ``cluster.curve``, ``launch --curve``): ``auto`` (default: on when the fabric
binds a non-loopback address, off on loopback), ``on``, ``off``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from dualpath_cli.atomicio import atomic_write_text
from dualpath_cli.errors import ConfigError

__all__ = ["CURVE_MODES", "CurveKeys", "curve_wanted", "secure_client", "secure_server"]

#: Values of ``cluster.curve`` / ``launch --curve``.
CURVE_MODES = ("auto", "on", "off")
_Z85_LEN = 40  # a Curve25519 key in Z85 text


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair in Z85 text (picklable, JSON-able)."""

    public: str
    secret: str

    def __post_init__(self) -> None:
        for name in ("public", "secret"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) != _Z85_LEN:
                raise ConfigError(f"CURVE {name} key: expected {_Z85_LEN} Z85 characters")

    def __repr__(self) -> str:  # never print the secret (logs, tracebacks)
        return f"CurveKeys(public={self.public!r}, secret=<hidden>)"

    @classmethod
    def generate(cls) -> CurveKeys:
        """A fresh key pair."""
        public, secret = zmq.curve_keypair()
        return cls(public.decode("ascii"), secret.decode("ascii"))

    @classmethod
    def load(cls, path: Path) -> CurveKeys:
        """Read a key file; it must be ours and readable by us alone.

        Raises:
            ConfigError: unreadable, group/other-readable, another user's, or malformed.
        """
        try:
            st = path.stat()
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"CURVE key file {path}: cannot read it ({err})") from None
        if st.st_mode & 0o077:
            raise ConfigError(f"CURVE key file {path}: mode {st.st_mode & 0o777:o} lets "
                              "others read it; chmod 600 it")
        if st.st_uid != os.geteuid():
            raise ConfigError(f"CURVE key file {path}: owned by uid {st.st_uid}, not us")
        try:
            data = json.loads(text)
            return cls(str(data["public"]), str(data["secret"]))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"CURVE key file {path}: not a key file (expected JSON with "
                              "public and secret)") from None

    def save(self, path: Path) -> None:
        """Write the key file atomically, mode 0600."""
        atomic_write_text(path, json.dumps({"public": self.public, "secret": self.secret})
                          + "\n", mode=0o600)

    @classmethod
    def ensure(cls, path: Path) -> CurveKeys:
        """The key pair in ``path``, created (0600) if there is none."""
        if path.exists():
            return cls.load(path)
        keys = cls.generate()
        keys.save(path)
        return keys


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reached from other machines


def curve_wanted(mode: str, host: str) -> bool:
    """Whether CURVE is on for ``mode`` when the fabric binds ``host``.

    Raises:
        ConfigError: an unknown mode.
    """
    if mode not in CURVE_MODES:
        raise ConfigError(f"cluster.curve {mode!r}: expected one of {', '.join(CURVE_MODES)}")
    return mode == "on" or (mode == "auto" and not _loopback(host))


class _Allowed:
    """The ZAP credentials provider of one context: client public keys it admits."""

    def __init__(self) -> None:
        self.keys: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        del domain
        return key in self.keys


_auth_lock = threading.Lock()
_auth: dict[int, tuple[Any, _Allowed]] = {}  # id(context) -> (authenticator, its keys)


def _admit(ctx: zmq.Context[Any], public: str) -> None:
    """Start this context's ZAP handler (once) and admit clients holding ``public``."""
    from zmq.auth.thread import ThreadAuthenticator

    with _auth_lock:
        entry = _auth.get(id(ctx))
        if entry is None:
            allowed = _Allowed()
            auth = ThreadAuthenticator(ctx)
            auth.start()
            auth.configure_curve_callback(domain="*", credentials_provider=allowed)
            entry = _auth[id(ctx)] = (auth, allowed)
        entry[1].keys.add(public.encode("ascii"))


def secure_server(ctx: zmq.Context[Any], sock: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make ``sock`` (before it binds) a CURVE server admitting the cluster's key only."""
    _admit(ctx, keys.public)
    sock.curve_secretkey = keys.secret.encode("ascii")
    sock.curve_publickey = keys.public.encode("ascii")
    sock.curve_server = True


def secure_client(sock: zmq.Socket[Any], keys: CurveKeys,
                  server_public: str | None = None) -> None:
    """Make ``sock`` (before it connects) a CURVE client of a server holding
    ``server_public`` (default: the cluster's own public key)."""
    sock.curve_secretkey = keys.secret.encode("ascii")
    sock.curve_publickey = keys.public.encode("ascii")
    sock.curve_serverkey = (server_public or keys.public).encode("ascii")
