"""The aiohttp application: routes, password, limits, and the listener's life.

Routes (docs/dashboard.md):
  GET  /                         the dashboard (static files shipped in disque/http/static)
  GET  /metrics                  Prometheus text format (disque.http.metrics)
  GET  /api/node                 this node: INFO sections, jobs by state, totals
  GET  /api/cluster              every known node, with its INFO summary (peers asked over RESP)
  GET  /api/queues               the busiest queues: QSTAT fields and counters
  GET  /api/queues/{name}        QSTAT, the head of the queue (QPEEK) and its jobs (JSCAN)
  GET  /api/jobs/{id}            SHOW
  POST /api/queues/{name}/pause  {"state": "in"|"out"|"all"|"none", "bcast": bool} -> PAUSE
  POST /api/jobs/{action}        {"ids": [...]}; action: ack fastack nack enqueue dequeue
                                 deljob -> ACKJOB FASTACK NACK ENQUEUE DEQUEUE DELJOB

With a password (http-password, else requirepass) every route needs HTTP basic auth (any
user name). POSTs must be `application/json`: a page of another origin cannot send that
without a CORS preflight, which this server never grants.

Limits, so that the HTTP port can never starve the RESP port of the same loop: request bodies
over MAX_BODY are refused (413); a connection that does not send a complete request header
within http-idle-timeout (from its connect, or from its previous reply) is closed; a body
must arrive within http-body-timeout (the JSON routes answer 400 and close the connection,
the others stop waiting for the rest then: aiohttp's lingering time); and past
MAX_CONNECTIONS new connections get a 503 and are closed at once. The two timeouts are read
when the HTTP side starts.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import socket
import time
from importlib import resources
from typing import TYPE_CHECKING, Any, cast

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler

from disque.http.metrics import CONTENT_TYPE, exposition
from disque.http.view import CommandFailed, NodeView, pairs
from disque.listen import bind_sockets

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from disque.tls import TlsAcceptor, TlsListener

log = structlog.get_logger("disque.http")

MAX_BODY = 64 * 1024  # the API's bodies are small JSON documents
MAX_CONNECTIONS = 256
PEER_TIMEOUT = 0.5  # seconds for a peer's INFO (the cluster page)
PEER_CACHE = 1.0  # seconds a peer's INFO is reused
MAX_QUEUES_LISTED = 500  # the busiest queues the dashboard's table gets
MAX_JOBS_LISTED = 200  # jobs of one queue the API lists (JSCAN, a bounded number of calls)

ACTIONS = {"ack": "ACKJOB", "fastack": "FASTACK", "nack": "NACK", "enqueue": "ENQUEUE",
           "dequeue": "DEQUEUE", "deljob": "DELJOB"}
PAUSE_STATES = ("none", "in", "out", "all")
STATIC_TYPES = {".html": "text/html", ".js": "application/javascript", ".css": "text/css",
                ".svg": "image/svg+xml"}
# No external resources at all: the dashboard works on a machine without internet.
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; frame-ancestors 'none'")

VIEW: web.AppKey[NodeView] = web.AppKey("view", NodeView)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda d: json.dumps(d, default=str))


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status=status)


class FirstRequest:
    """Closes a connection whose first request header is not complete within
    http-idle-timeout. Older aiohttp versions (3.9 does, which we accept) time out the wait
    for a header only after a reply (keep-alive), not from the connect: there, a client
    that connects and sends half a header would keep one of the MAX_CONNECTIONS slots for
    good. (Recent ones do both; the first of the two timers to fire closes it.)"""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop = loop
        self.timeout = timeout
        self.pending: dict[RequestHandler, asyncio.TimerHandle] = {}  # -> its deadline

    def watch(self, protocol: RequestHandler) -> None:
        self.pending[protocol] = self.loop.call_later(self.timeout, self._due, protocol)

    def started(self, protocol: RequestHandler) -> None:
        """A request header arrived on `protocol` (aiohttp's RequestHandler)."""
        handle = self.pending.pop(protocol, None)
        if handle is not None:
            handle.cancel()

    def _due(self, protocol: RequestHandler) -> None:
        if self.pending.pop(protocol, None) is not None:
            protocol.force_close()  # (a connection already gone: nothing to do)


FIRST_REQUEST: web.AppKey[FirstRequest] = web.AppKey("first_request", FirstRequest)


# ---------------------------------------------------------------------- middlewares
@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Password, then the handler; API errors answer JSON."""
    request.app[FIRST_REQUEST].started(request.protocol)
    view = request.app[VIEW]
    if view.http_password and not _authorized(request, view):
        return web.Response(status=401, text="401: password required\n",
                            headers={"WWW-Authenticate": 'Basic realm="disque"'})
    try:
        resp = await handler(request)
    except BodyTimeout:
        return await _answer_and_close(request, _error(400, "the body did not arrive in time"))
    except web.HTTPException as exc:
        if request.path.startswith("/api/"):
            return _error(exc.status, exc.reason)
        raise
    resp.headers.setdefault("Content-Security-Policy", CSP)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Cache-Control", "no-store")
    return resp


def _authorized(request: web.Request, view: NodeView) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or len(value) > 4096:
        return False
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8",
                                                                       "surrogateescape")
    except (binascii.Error, ValueError):
        return False
    _, sep, password = decoded.partition(":")
    return bool(sep) and view.password_matches(password)


class BodyTimeout(Exception):
    """A request body did not arrive within http-body-timeout."""


async def _answer_and_close(request: web.Request, resp: web.Response) -> web.Response:
    """Send `resp`, then close the connection at once: without this aiohttp would wait for
    the rest of a stalled body again (its lingering time) before closing."""
    await resp.prepare(request)
    await resp.write_eof()
    request.protocol.force_close()  # the transport flushes the reply, then closes
    return resp


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise _bad("the body must be application/json")
    try:
        async with asyncio.timeout(request.app[VIEW].body_timeout):
            raw = await request.read()
    except TimeoutError:
        raise BodyTimeout() from None
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"malformed JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    return body


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(reason=message)


# ---------------------------------------------------------------------- static and metrics
async def index(request: web.Request) -> web.Response:
    return _static_file("index.html")


async def static(request: web.Request) -> web.Response:
    return _static_file(request.match_info["name"])


def _static_file(name: str) -> web.Response:
    ext = name[name.rfind("."):] if "." in name else ""
    if "/" in name or name.startswith(".") or ext not in STATIC_TYPES:
        raise web.HTTPNotFound()
    ref = resources.files("disque.http").joinpath("static", name)
    if not ref.is_file():
        raise web.HTTPNotFound()
    return web.Response(body=ref.read_bytes(), content_type=STATIC_TYPES[ext],
                        charset="utf-8")


async def metrics(request: web.Request) -> web.Response:
    resp = web.Response(body=await exposition(request.app[VIEW]))
    resp.headers["Content-Type"] = CONTENT_TYPE
    return resp


# ---------------------------------------------------------------------- reads
async def api_node(request: web.Request) -> web.Response:
    view = request.app[VIEW]
    census = await view.census()
    table = await view.queue_table(0, census.active_by_queue)
    return _json({
        "myself": view.myself(), "info": view.info(), "jobs": census.by_state,
        "census_age": view.census_age(), "queues": table.count, "totals": table.totals,
        "time": time.time(),
    })


async def api_cluster(request: web.Request) -> web.Response:
    view = request.app[VIEW]
    nodes = view.cluster_nodes()
    infos = await request.app[PEERS].fetch_all(view)
    for n in nodes:
        n["info"] = infos.get(n["id"], {"error": "not asked"})
    return _json({"myself": view.myself()["id"], "nodes": nodes})


async def api_queues(request: web.Request) -> web.Response:
    view = request.app[VIEW]
    census = await view.census()
    table = await view.queue_table(MAX_QUEUES_LISTED, census.active_by_queue)
    return _json({"queues": table.queues, "count": table.count})


async def api_queue(request: web.Request) -> web.Response:
    view = request.app[VIEW]
    name = request.match_info["name"]
    limit = _int_param(request, "limit", 100, 1, MAX_JOBS_LISTED)
    try:
        stat = view.command("QSTAT", name)
        head = view.command("QPEEK", name, str(limit))
        jobs: list[dict[str, Any]] = []
        cursor = b"0"
        for _ in range(50):  # bounded: JSCAN examines at most 10 x COUNT jobs per call
            cursor, found = view.command("JSCAN", cursor, "QUEUE", name, "COUNT", "100",
                                         "REPLY", "ALL")
            jobs += [pairs(j) for j in found]
            if cursor == b"0" or len(jobs) >= limit:
                break
            await asyncio.sleep(0)  # RESP clients run between two JSCAN calls
    except CommandFailed as exc:
        raise _bad(str(exc)) from None
    if stat is None and not jobs:
        raise web.HTTPNotFound(reason=f"no queue {name!r} on this node")
    for j in jobs:
        j.pop("body", None)  # bodies may be large: the job page shows one
    return _json({
        "name": name,
        "stat": pairs(stat) if stat else None,
        "head": [j[1].decode() for j in head],  # [queue, id, body] entries: the IDs
        "jobs": jobs[:limit],
        "complete": cursor == b"0",
    })


async def api_job(request: web.Request) -> web.Response:
    view = request.app[VIEW]
    try:
        job = view.command("SHOW", request.match_info["id"])
    except CommandFailed as exc:
        raise _bad(str(exc)) from None
    if job is None:
        raise web.HTTPNotFound(reason="job not known on this node")
    return _json(pairs(job))


def _int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise _bad(f"{name} must be an integer") from None
    if not lo <= v <= hi:
        raise _bad(f"{name} must be between {lo} and {hi}")
    return v


# ---------------------------------------------------------------------- actions
async def api_pause(request: web.Request) -> web.Response:
    view = request.app[VIEW]
    body = await _json_body(request)
    state = body.get("state")
    if state not in PAUSE_STATES:
        raise _bad(f"state must be one of {', '.join(PAUSE_STATES)}")
    args = ["PAUSE", request.match_info["name"], state]
    if body.get("bcast"):
        args.append("BCAST")
    try:
        result = view.command(*args, addr=_peer(request))
    except CommandFailed as exc:
        raise _bad(str(exc)) from None
    return _json({"pause": result.decode() if isinstance(result, bytes) else result})


async def api_jobs_action(request: web.Request) -> web.Response:
    view = request.app[VIEW]
    command = ACTIONS.get(request.match_info["action"])
    if command is None:
        raise web.HTTPNotFound(reason=f"no action {request.match_info['action']!r}; "
                                      f"try one of {', '.join(ACTIONS)}")
    body = await _json_body(request)
    ids = body.get("ids")
    if (not isinstance(ids, list) or not ids or len(ids) > 1000
            or not all(isinstance(i, str) and i for i in ids)):
        raise _bad("ids must be a list of 1 to 1000 job IDs")
    try:
        count = view.command(command, *ids, addr=_peer(request))
    except CommandFailed as exc:
        raise _bad(str(exc)) from None
    return _json({"command": command, "count": count})


def _peer(request: web.Request) -> str:
    """The address MONITOR shows for an action: the HTTP client's."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return f"http:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "http"


# ---------------------------------------------------------------------- peers
class PeerInfo:
    """INFO of the other nodes for the cluster page, asked over their RESP port (their own
    INFO code), at most once per PEER_CACHE seconds however many dashboards poll."""

    def __init__(self) -> None:
        self.clients: dict[tuple[str, int], aioredis.Redis] = {}
        self.cache: dict[str, Any] = {}
        self.cached_at = 0.0
        self.pending: asyncio.Task[dict[str, Any]] | None = None

    async def fetch_all(self, view: NodeView) -> dict[str, Any]:
        if time.monotonic() - self.cached_at < PEER_CACHE:
            return self.cache
        if self.pending is None or self.pending.done():
            self.pending = asyncio.ensure_future(self._fetch_all(view))
        return await asyncio.shield(self.pending)

    async def _fetch_all(self, view: NodeView) -> dict[str, Any]:
        out: dict[str, Any] = {view.myself()["id"]: _summary(_flatten(view.info()))}
        peers = view.peer_addresses()
        results = await asyncio.gather(*(self._info(view, ip, port) for _, ip, port in peers))
        for (node_id, _, _), res in zip(peers, results, strict=True):
            out[node_id] = res
        self.cache, self.cached_at = out, time.monotonic()
        return out

    async def _info(self, view: NodeView, ip: str, port: int) -> dict[str, Any]:
        import redis.asyncio as aioredis
        key = (ip, port)
        client = self.clients.get(key)
        if client is None:
            client = self.clients[key] = aioredis.Redis(
                host=ip, port=port, password=view.resp_password or None,
                socket_timeout=PEER_TIMEOUT, socket_connect_timeout=PEER_TIMEOUT,
                single_connection_client=True)
        try:
            async with asyncio.timeout(PEER_TIMEOUT * 2):
                return _summary(await client.info())
        except Exception as exc:  # a peer down, slow or refusing: the page shows why
            return {"error": f"{type(exc).__name__}: {exc}"[:200]}

    async def close(self) -> None:
        for client in self.clients.values():
            try:
                await client.aclose()
            except Exception:
                pass
        self.clients.clear()


PEERS: web.AppKey[PeerInfo] = web.AppKey("peers", PeerInfo)


def _flatten(info: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {k: v for section in info.values() for k, v in section.items()}


SUMMARY_FIELDS = ("used_memory", "used_memory_human", "registered_jobs", "overflow_jobs",
                  "registered_queues",
                  "instantaneous_ops_per_sec", "connected_clients", "blocked_clients",
                  "uptime_in_seconds", "disque_py_version", "total_commands_processed")


def _summary(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info.get(k) for k in SUMMARY_FIELDS}


# ---------------------------------------------------------------------- the app
def make_app(view: NodeView, first_request: FirstRequest) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY)
    app[VIEW] = view
    app[FIRST_REQUEST] = first_request
    app[PEERS] = PeerInfo()
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/node", api_node)
    app.router.add_get("/api/cluster", api_cluster)
    app.router.add_get("/api/queues", api_queues)
    # job IDs hold '/' and '+', queue names anything: the last segment(s) are the name
    app.router.add_get("/api/queues/{name:.+}", api_queue)
    app.router.add_get("/api/jobs/{id:.+}", api_job)
    app.router.add_post("/api/queues/{name:.+}/pause", api_pause)
    app.router.add_post("/api/jobs/{action}", api_jobs_action)

    async def on_cleanup(app: web.Application) -> None:
        app[VIEW].close()
        await app[PEERS].close()

    app.on_cleanup.append(on_cleanup)
    return app


class _Busy(asyncio.Protocol):
    """Past MAX_CONNECTIONS: a 503 and the door, without parsing anything."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        transport = cast(asyncio.Transport, transport)
        transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                        b"Connection: close\r\n\r\n")
        transport.close()


class HttpSide:
    """The node's HTTP listener: started, moved or stopped as http-port says."""

    def __init__(self, view: NodeView, loop: asyncio.AbstractEventLoop,
                 tls: TlsListener | None = None) -> None:
        self.view = view
        self.loop = loop
        self.tls = tls  # tls-http: HTTPS, each connection with the TLS context current then
        self.acceptors: list[TlsAcceptor] = []
        # keepalive_timeout: the wait for the next header after a reply (FirstRequest
        # bounds the first one); lingering_time: the wait for a body no handler reads.
        self.first_request = FirstRequest(loop, view.idle_timeout)
        self.runner = web.AppRunner(make_app(view, self.first_request), handle_signals=False,
                                    access_log=None, keepalive_timeout=view.idle_timeout,
                                    lingering_time=view.body_timeout)
        self.servers: list[asyncio.AbstractServer] = []
        self.port = 0
        self.setup_done = False

    async def start(self, addrs: list[str], port: int, backlog: int) -> None:
        socks = bind_sockets(addrs, port, backlog)
        await self._serve(socks, port)

    def listen(self, addrs: list[str], port: int, backlog: int) -> None:
        """CONFIG SET http-port: stop the old listener, bind the new port now (raising
        OSError if it cannot), accept on it from the next loop iteration."""
        socks = bind_sockets(addrs, port, backlog) if port else []
        self.close_listeners()
        if socks:
            self.loop.create_task(self._serve(socks, port))

    async def _serve(self, socks: list[socket.socket], port: int) -> None:
        if not self.setup_done:
            self.setup_done = True
            await self.runner.setup()
        handler = self.runner.server
        assert handler is not None

        def factory() -> asyncio.Protocol:
            if len(handler.connections) >= MAX_CONNECTIONS:
                return _Busy()
            protocol = handler()
            self.first_request.watch(protocol)
            return protocol

        addrs = [s.getsockname()[0] for s in socks]
        if self.tls is not None:
            acceptor = self.tls.http_acceptor(factory)
            acceptor.serve(socks)
            self.acceptors.append(acceptor)
        else:
            for s in socks:
                self.servers.append(await self.loop.create_server(factory, sock=s))
        self.port = port
        log.info("http.listening", port=port, addrs=addrs, tls=self.tls is not None)

    def close_listeners(self) -> None:
        for srv in self.servers:
            srv.close()
        self.servers = []
        for acceptor in self.acceptors:
            acceptor.close()
        self.acceptors = []
        if self.port:
            log.info("http.stopped", port=self.port)
        self.port = 0

    async def close(self) -> None:
        self.close_listeners()
        if self.setup_done:
            await self.runner.cleanup()
