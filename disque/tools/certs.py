"""Throwaway certificates made with the `openssl` command line tool: a CA, and
certificates it signs for nodes (serverAuth and clientAuth: a node's certificate serves
both ends of a TLS bus link, `tls-cluster yes`) and for clients. For development clusters
(`make cluster TLS=1`) and the tests; production certificates come from your own PKI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class CertError(Exception):
    """openssl is missing or failed; the text says what it printed."""


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise CertError("the openssl command line tool is missing (Debian: apt install openssl)")
    done = subprocess.run([exe, *args], cwd=cwd, capture_output=True, timeout=60)
    if done.returncode != 0:
        raise CertError(f"openssl {args[0]} failed: {done.stderr.decode(errors='replace')}")


def make_key(where: Path, name: str, password: str = "") -> Path:
    """An EC P-256 private key `<name>.key` (encrypted with `password` if given)."""
    args = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", f"{name}.key"]
    if password:
        args += ["-aes-128-cbc", "-pass", f"pass:{password}"]
    _openssl(*args, cwd=where)
    return where / f"{name}.key"


def make_ca(where: Path, name: str = "ca", days: int = 30) -> tuple[Path, Path]:
    """A self-signed CA: (`<name>.crt`, `<name>.key`) in `where`."""
    where.mkdir(parents=True, exist_ok=True)
    key = make_key(where, name)
    _openssl("req", "-x509", "-new", "-key", key.name, "-out", f"{name}.crt",
             "-days", str(days), "-subj", f"/CN={name}", cwd=where)
    return where / f"{name}.crt", key


def make_cert(where: Path, name: str, ca: str, cn: str, *, node: bool = True,
              password: str = "", key: Path | None = None, days: int = 30,
              hosts: tuple[str, ...] = ("IP:127.0.0.1", "DNS:localhost")) -> tuple[Path, Path]:
    """A certificate `<name>.crt` signed by the CA `<ca>.crt` / `<ca>.key` in `where`, for
    a node (serverAuth and clientAuth, `hosts` as subjectAltName) or a client (clientAuth),
    with a new key (encrypted with `password` if given) or `key`: (crt, key)."""
    key = key or make_key(where, name, password)
    pass_args = ["-passin", f"pass:{password}"] if password else []
    _openssl("req", "-new", "-key", key.name, *pass_args, "-out", f"{name}.csr",
             "-subj", f"/CN={cn}", cwd=where)
    ext = where / f"{name}.ext"
    ext.write_text(f"subjectAltName={','.join(hosts)}\nextendedKeyUsage=serverAuth,clientAuth\n"
                   if node else "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", str(days), "-extfile",
             ext.name, cwd=where)
    (where / f"{name}.csr").unlink(missing_ok=True)
    ext.unlink(missing_ok=True)
    return where / f"{name}.crt", key
