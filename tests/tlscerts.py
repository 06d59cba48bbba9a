"""Throwaway certificates for the TLS tests, made with the `openssl` command line tool
(`make system-deps` installs it): a CA, server certificates for 127.0.0.1, client
certificates, and a second CA whose certificates the first does not trust."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key(cwd: Path, name: str, password: str = "") -> Path:
    args = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", f"{name}.key"]
    if password:
        args += ["-aes-128-cbc", "-pass", f"pass:{password}"]
    _openssl(*args, cwd=cwd)
    return cwd / f"{name}.key"


def _ca(cwd: Path, name: str) -> tuple[Path, Path]:
    key = _key(cwd, name)
    _openssl("req", "-x509", "-new", "-key", key.name, "-out", f"{name}.crt", "-days", "3",
             "-subj", f"/CN={name}", cwd=cwd)
    return cwd / f"{name}.crt", key


def _signed(cwd: Path, name: str, ca: str, cn: str, server: bool, password: str = "",
            key: Path | None = None) -> tuple[Path, Path]:
    key = key or _key(cwd, name, password)
    pass_args = ["-passin", f"pass:{password}"] if password else []
    _openssl("req", "-new", "-key", key.name, *pass_args, "-out", f"{name}.csr",
             "-subj", f"/CN={cn}", cwd=cwd)
    ext = cwd / f"{name}.ext"
    # a node's certificate serves both sides of a bus link (tls-cluster)
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n"
                   if server else "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "3", "-extfile", ext.name,
             cwd=cwd)
    return cwd / f"{name}.crt", key


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


KEY_PASSWORD = "s3cret"


def make_pki(where: Path) -> Pki:
    where.mkdir(parents=True, exist_ok=True)
    ca, _ = _ca(where, "ca")
    server_crt, server_key = _signed(where, "server", "ca", "127.0.0.1", True)
    renewed_crt, _ = _signed(where, "renewed", "ca", "renewed", True, key=server_key)
    other_crt, other_key = _signed(where, "other", "ca", "other", True)
    locked_crt, locked_key = _signed(where, "locked", "ca", "locked", True,
                                     password=KEY_PASSWORD)
    client_crt, client_key = _signed(where, "client", "ca", "client", False)
    rogue_ca, _ = _ca(where, "rogue-ca")
    rogue_crt, rogue_key = _signed(where, "rogue", "rogue-ca", "rogue", True)
    return Pki(where, ca, server_crt, server_key, renewed_crt, other_crt, other_key,
               locked_key, locked_crt, client_crt, client_key, rogue_ca, rogue_crt, rogue_key)
