"""TLS on the client port (issue 23, first part): `tls-port` and the Redis 6+ `tls-*`
directives that apply to it.

The TLS listener accepts TCP connections itself and wraps each one in TLS with the
context current at that moment (`loop.connect_accepted_socket`), so CONFIG SET of a
certificate, key, CA or protocol setting applies to the next connection without a
restart; connections already open keep the context they were made with. A context is built, and its files read, when the
directive is set (`server_context`): a missing or unreadable file, a key that does not
match its certificate or a wrong key password is refused with the reason, and the context
in use stays.

Bad peers cost only their own connection: a plaintext client on the TLS port, garbage, a
truncated handshake, a certificate from another CA (with `tls-auth-clients yes` or
`optional`), or a handshake that does not finish within `tls-handshake-timeout` ms
(slowloris, default 10 s) is closed and counted, and logged at most once a second with the count of those not logged
(`tls.handshake_failed`). The handshake itself runs in OpenSSL in small steps as bytes
arrive; it never blocks the event loop. A connection counts against `maxclients` once its
handshake is done.

Not offered: `tls-ciphersuites` (Python's ssl module cannot set the TLS 1.3 suites; TLS
1.3 uses OpenSSL's default suites), `tls-dh-params-file` (OpenSSL 3 chooses its groups).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any

import structlog

from disque.config import Config, ConfigSetError
from disque.listen import bind_sockets

if TYPE_CHECKING:
    from disque.server import Server

log = structlog.get_logger("disque")

PROTOCOLS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}
# the directives a context is built from (CONFIG SET of any of them builds a new one)
CONTEXT_DIRECTIVES = ("tls-cert-file", "tls-key-file", "tls-key-file-pass", "tls-ca-cert-file",
                      "tls-ca-cert-dir", "tls-auth-clients", "tls-protocols", "tls-ciphers",
                      "tls-prefer-server-ciphers", "tls-session-caching")


class TlsConfigError(ValueError):
    """The TLS directives do not make a usable context; the text says why."""


def parse_protocols(value: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """`tls-protocols "TLSv1.2 TLSv1.3"`: the lowest and highest version named (all of
    TLSv1.2 and TLSv1.3 when empty). Older versions are not offered."""
    names = value.lower().split()
    if not names:
        return ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3
    versions = []
    for name in names:
        if name not in PROTOCOLS:
            raise TlsConfigError(f"unsupported TLS protocol '{name}' (TLSv1.2 and TLSv1.3 are)")
        versions.append(PROTOCOLS[name])
    return min(versions), max(versions)


def server_context(cfg: Config) -> ssl.SSLContext:
    """A server context from the `tls-*` directives; TlsConfigError says what is wrong."""
    if not cfg.tls_cert_file or not cfg.tls_key_file:
        raise TlsConfigError("tls-port needs tls-cert-file and tls-key-file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = parse_protocols(cfg.tls_protocols)
    for name, path in (("tls-cert-file", cfg.tls_cert_file), ("tls-key-file", cfg.tls_key_file),
                       ("tls-ca-cert-file", cfg.tls_ca_cert_file)):
        if path:
            _readable(name, path)
    secret = cfg.tls_key_file_pass.encode("utf-8", "surrogateescape")
    try:
        # (a callable, even for no password: with None, OpenSSL would prompt on a terminal)
        ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file, password=lambda: secret)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(
            f"cannot load tls-cert-file {cfg.tls_cert_file} with tls-key-file "
            f"{cfg.tls_key_file} ({getattr(exc, 'reason', None) or exc}: a file that is not "
            f"PEM, a key that does not match the certificate, or a wrong tls-key-file-pass)"
        ) from None
    if cfg.tls_ca_cert_file or cfg.tls_ca_cert_dir:
        if cfg.tls_ca_cert_dir and not os.path.isdir(cfg.tls_ca_cert_dir):
            raise TlsConfigError(f"tls-ca-cert-dir {cfg.tls_ca_cert_dir} is not a directory")
        try:
            ctx.load_verify_locations(cafile=cfg.tls_ca_cert_file or None,
                                      capath=cfg.tls_ca_cert_dir or None)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load the CA certificates of tls-ca-cert-file "
                                 f"{cfg.tls_ca_cert_file or '-'} ({exc})") from None
    if cfg.tls_auth_clients != "no":
        if not (cfg.tls_ca_cert_file or cfg.tls_ca_cert_dir):
            raise TlsConfigError(f"tls-auth-clients {cfg.tls_auth_clients} needs "
                                 "tls-ca-cert-file or tls-ca-cert-dir to verify clients with")
        ctx.verify_mode = (ssl.CERT_REQUIRED if cfg.tls_auth_clients == "yes"
                           else ssl.CERT_OPTIONAL)
    if cfg.tls_ciphers:
        try:
            ctx.set_ciphers(cfg.tls_ciphers)
        except ssl.SSLError:
            raise TlsConfigError(f"no cipher can be selected from tls-ciphers "
                                 f"'{cfg.tls_ciphers}'") from None
    if cfg.tls_prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if not cfg.tls_session_caching:
        ctx.options |= ssl.OP_NO_TICKET
        ctx.num_tickets = 0
    return ctx


def _readable(name: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TlsConfigError(f"cannot read {name} {path}: {exc.strerror or exc}") from None


class TlsListener:
    """The TLS side of the client port: the current context, the listeners, the handshake
    failures (counted for INFO, logged at most once a second)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.context: ssl.SSLContext | None = None
        self.sockets: list[socket.socket] = []  # the listening sockets
        self.tasks: set[asyncio.Task[None]] = set()  # accept loops, handshakes under way
        self.handshakes = 0  # handshakes done (INFO stats: tls_handshakes)
        self.failures = 0  # handshakes that failed or timed out (tls_handshake_failures)
        self.unlogged = 0  # failures since the last log line
        self.logged_at = 0.0

    def load(self, cfg: Config) -> None:
        """Build the context from cfg (raises TlsConfigError, the current one kept)."""
        self.context = server_context(cfg)

    def reload(self, cfg: Config, name: str) -> None:
        """CONFIG SET of a tls-* directive: new connections use the new context."""
        if not cfg.tls_port:
            return  # checked (and used) when a TLS listener starts
        try:
            self.load(cfg)
        except TlsConfigError as exc:
            raise ConfigSetError(f"ERR Invalid TLS configuration: {exc}") from None
        log.info("tls.reloaded", directive=name)

    async def start(self, binds: list[str], port: int, backlog: int) -> None:
        """Listen on tls-port; each accepted socket is wrapped in TLS with the context
        current at that moment (loop.connect_accepted_socket)."""
        loop = self.server.loop
        assert loop is not None
        for sock in bind_sockets(binds, port, backlog):
            self.sockets.append(sock)
            task = loop.create_task(self.accept_loop(sock))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()

    async def accept_loop(self, sock: socket.socket) -> None:
        loop = self.server.loop
        assert loop is not None
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError as exc:  # EMFILE and the like: the listener stays
                log.warning("tls.accept_failed", error=str(exc))
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self.upgrade(conn, peer))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def upgrade(self, conn: socket.socket, peer: Any) -> None:
        from disque.connection import Client

        server = self.server
        loop = server.loop
        ctx = self.context
        assert loop is not None and ctx is not None
        handshake_s = server.cfg.tls_handshake_timeout / 1000
        try:
            await loop.connect_accepted_socket(lambda: Client(server), conn, ssl=ctx,
                                               ssl_handshake_timeout=handshake_s)
        except OSError as exc:  # (SSLError, TimeoutError, ConnectionError too)
            conn.close()
            self.failed(peer, exc)
            return
        self.handshakes += 1

    def failed(self, peer: Any, exc: BaseException) -> None:
        self.failures += 1
        self.unlogged += 1
        now = time.monotonic()
        if now - self.logged_at >= 1.0:
            log.warning("tls.handshake_failed", addr=_addr(peer),
                        error=str(exc) or type(exc).__name__, failures=self.unlogged)
            self.logged_at = now
            self.unlogged = 0

    def info_fields(self) -> list[tuple[str, int]]:
        return [("tls_handshakes", self.handshakes),
                ("tls_handshake_failures", self.failures)]


def _addr(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
