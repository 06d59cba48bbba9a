"""Throwaway certificates for the TLS tests (disque.tools.certs, with the `openssl` command
line tool, which `make system-deps` installs): a CA, node certificates for 127.0.0.1,
client certificates, and a second CA whose certificates the first does not trust."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from disque.tools.certs import make_ca, make_cert


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    server_crt: Path
    server_key: Path
    renewed_crt: Path  # another certificate for server_key (a renewal), CN "renewed"
    other_crt: Path  # a server certificate with its own key, CN "other"
    other_key: Path
    locked_key: Path  # server_key's twin protected by KEY_PASSWORD, with locked_crt
    locked_crt: Path
    client_crt: Path
    client_key: Path
    rogue_ca: Path  # a CA the server does not trust
    rogue_crt: Path  # a certificate signed by it (for a client, or a node)
    rogue_key: Path
    expired_crt: Path  # a client certificate from the CA, expired yesterday
    expired_key: Path


KEY_PASSWORD = "s3cret"


def make_pki(where: Path) -> Pki:
    where.mkdir(parents=True, exist_ok=True)
    ca, _ = make_ca(where, "ca")
    server_crt, server_key = make_cert(where, "server", "ca", "127.0.0.1")
    renewed_crt, _ = make_cert(where, "renewed", "ca", "renewed", key=server_key)
    other_crt, other_key = make_cert(where, "other", "ca", "other")
    locked_crt, locked_key = make_cert(where, "locked", "ca", "locked", password=KEY_PASSWORD)
    client_crt, client_key = make_cert(where, "client", "ca", "client", node=False)
    rogue_ca, _ = make_ca(where, "rogue-ca")
    rogue_crt, rogue_key = make_cert(where, "rogue", "rogue-ca", "rogue")
    expired_crt, expired_key = make_cert(where, "expired", "ca", "expired", node=False, days=-1)
    return Pki(where, ca, server_crt, server_key, renewed_crt, other_crt, other_key,
               locked_key, locked_crt, client_crt, client_key, rogue_ca, rogue_crt, rogue_key,
               expired_crt, expired_key)


def closed_by_peer(s: socket.socket, timeout: float = 10.0) -> bool:
    """Read until the node closes the connection (a TLS alert may come first): True if it
    did within `timeout`, and nothing but an alert was sent."""
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return not got or got[:1] == b"\x15"  # (nothing, or a TLS alert record)


def tls_only_args(pki: Pki, tls_port: int, *extra: str) -> list[str]:
    """A node serving TLS only (port 0) with the PKI's node certificate and CA."""
    return ["--port", "0", "--tls-port", str(tls_port), "--tls-cert-file", str(pki.server_crt),
            "--tls-key-file", str(pki.server_key), "--tls-ca-cert-file", str(pki.ca), *extra]
