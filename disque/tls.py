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
from collections.abc import Callable, Coroutine
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


def _context(cfg: Config, protocol: int) -> ssl.SSLContext:
    """A context of either side with what both share: the TLS versions, the node's
    certificate and key, the CA certificates (if any) and the TLS 1.2 ciphers."""
    if not cfg.tls_cert_file or not cfg.tls_key_file:
        raise TlsConfigError("tls-port needs tls-cert-file and tls-key-file")
    ctx = ssl.SSLContext(protocol)
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
    if cfg.tls_ciphers:
        try:
            ctx.set_ciphers(cfg.tls_ciphers)
        except ssl.SSLError:
            raise TlsConfigError(f"no cipher can be selected from tls-ciphers "
                                 f"'{cfg.tls_ciphers}'") from None
    return ctx


def server_context(cfg: Config) -> ssl.SSLContext:
    """A server context from the `tls-*` directives; TlsConfigError says what is wrong."""
    ctx = _context(cfg, ssl.PROTOCOL_TLS_SERVER)
    if cfg.tls_auth_clients != "no":
        if not (cfg.tls_ca_cert_file or cfg.tls_ca_cert_dir):
            raise TlsConfigError(f"tls-auth-clients {cfg.tls_auth_clients} needs "
                                 "tls-ca-cert-file or tls-ca-cert-dir to verify clients with")
        ctx.verify_mode = (ssl.CERT_REQUIRED if cfg.tls_auth_clients == "yes"
                           else ssl.CERT_OPTIONAL)
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


def bus_contexts(cfg: Config) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """`tls-cluster yes`: the contexts of the bus's two sides, both with the node's
    certificate and both requiring the peer's, signed by the CA (mutual TLS whatever
    tls-auth-clients says). Peers are checked by their certificate's chain, not by name:
    nodes are addressed by IP, and any certificate the CA signed is a node."""
    if not (cfg.tls_ca_cert_file or cfg.tls_ca_cert_dir):
        raise TlsConfigError("tls-cluster needs tls-ca-cert-file or tls-ca-cert-dir to verify "
                             "the other nodes with")
    accept = server_context(cfg)
    accept.verify_mode = ssl.CERT_REQUIRED
    dial = _context(cfg, ssl.PROTOCOL_TLS_CLIENT)
    dial.check_hostname = False
    dial.verify_mode = ssl.CERT_REQUIRED
    return accept, dial


class TlsAcceptor:
    """Listening sockets whose connections are wrapped in TLS, each with the context
    `context()` returns when it is accepted (loop.connect_accepted_socket); `factory`
    makes the protocol of a connection whose handshake succeeded. Failed handshakes are
    counted and logged (`event`) at most once a second."""

    def __init__(self, loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.Protocol],
                 context: Callable[[], ssl.SSLContext], timeout_s: Callable[[], float],
                 event: str) -> None:
        self.loop = loop
        self.factory = factory
        self.context = context
        self.timeout_s = timeout_s
        self.event = event
        self.sockets: list[socket.socket] = []  # the listening sockets
        self.tasks: set[asyncio.Task[None]] = set()  # accept loops, handshakes under way
        self.handshakes = 0  # handshakes done
        self.failures = 0  # handshakes that failed or timed out
        self.unlogged = 0  # failures since the last log line
        self.logged_at = 0.0

    async def start(self, binds: list[str], port: int, backlog: int) -> None:
        self.serve(bind_sockets(binds, port, backlog))

    def serve(self, socks: list[socket.socket]) -> None:
        """Accept on these listening sockets (closed by `close`)."""
        for sock in socks:
            self.sockets.append(sock)
            self._spawn(self.accept_loop(sock))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()

    async def accept_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, peer = await self.loop.sock_accept(sock)
            except OSError as exc:  # EMFILE and the like: the listener stays
                log.warning("tls.accept_failed", error=str(exc))
                await asyncio.sleep(0.1)
                continue
            self._spawn(self.upgrade(conn, peer))

    async def upgrade(self, conn: socket.socket, peer: Any) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn, ssl=self.context(),
                                                    ssl_handshake_timeout=self.timeout_s())
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
            log.warning(self.event, addr=_addr(peer), error=str(exc) or type(exc).__name__,
                        failures=self.unlogged)
            self.logged_at = now
            self.unlogged = 0


class TlsListener:
    """The node's TLS: the contexts built from the tls-* directives (rebuilt by CONFIG SET),
    the client port's acceptor, with `tls-cluster yes` the bus's contexts, and with
    `tls-http yes` the HTTP side's acceptors (the client port's context)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.context: ssl.SSLContext | None = None  # the client port's (and tls-http's)
        self.bus_accept: ssl.SSLContext | None = None  # tls-cluster: inbound bus links
        self.bus_dial: ssl.SSLContext | None = None  # tls-cluster: outbound bus links
        self.clients: TlsAcceptor | None = None
        self.bus: TlsAcceptor | None = None

    def load(self, cfg: Config) -> None:
        """Build the contexts from cfg (raises TlsConfigError, the current ones kept)."""
        context = server_context(cfg) if cfg.tls_port or cfg.tls_http else None
        bus = bus_contexts(cfg) if cfg.tls_cluster else None
        self.context = context
        if bus is not None:
            self.bus_accept, self.bus_dial = bus

    def reload(self, cfg: Config, name: str) -> None:
        """CONFIG SET of a tls-* directive: new connections use the new contexts."""
        if not (cfg.tls_port or cfg.tls_cluster or cfg.tls_http):
            return  # checked (and used) when TLS is on at start
        try:
            self.load(cfg)
        except (TlsConfigError, ssl.SSLError, OSError) as exc:
            raise ConfigSetError(f"ERR Invalid TLS configuration: {exc}") from None
        log.info("tls.reloaded", directive=name)

    def timeout_s(self) -> float:
        return self.server.cfg.tls_handshake_timeout / 1000

    async def start(self, binds: list[str], port: int, backlog: int) -> None:
        """Listen on tls-port."""
        from disque.connection import Client

        server = self.server
        assert server.loop is not None and self.context is not None
        self.clients = TlsAcceptor(server.loop, lambda: Client(server), self.client_context,
                                   self.timeout_s, "tls.handshake_failed")
        await self.clients.start(binds, port, backlog)

    def http_acceptor(self, factory: Callable[[], asyncio.Protocol]) -> TlsAcceptor:
        """tls-http: an acceptor for the HTTP side, with the client port's context."""
        assert self.server.loop is not None
        return TlsAcceptor(self.server.loop, factory, self.client_context, self.timeout_s,
                           "http.tls_handshake_failed")

    def client_context(self) -> ssl.SSLContext:
        assert self.context is not None
        return self.context

    def bus_accept_context(self) -> ssl.SSLContext:
        assert self.bus_accept is not None
        return self.bus_accept

    def bus_dial_context(self) -> ssl.SSLContext:
        assert self.bus_dial is not None
        return self.bus_dial

    async def start_bus(self, factory: Callable[[], asyncio.Protocol], binds: list[str],
                        port: int, backlog: int) -> None:
        """tls-cluster: the bus port's acceptor (a node without a certificate from the CA
        is refused: bus.tls_refused)."""
        assert self.server.loop is not None
        self.bus = TlsAcceptor(self.server.loop, factory, self.bus_accept_context,
                               self.timeout_s, "bus.tls_refused")
        await self.bus.start(binds, port, backlog)

    def close(self) -> None:
        for acceptor in (self.clients, self.bus):
            if acceptor is not None:
                acceptor.close()

    def info_fields(self) -> list[tuple[str, int]]:
        clients = self.clients
        return [("tls_handshakes", clients.handshakes if clients else 0),
                ("tls_handshake_failures", clients.failures if clients else 0)]


def _addr(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
