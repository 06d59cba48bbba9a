"""Server and admin commands (PING and ECHO: disque.commands.basic): TIME, AUTH, HELLO, INFO, CONFIG, CLIENT, COMMAND,
DEBUG, SHUTDOWN, MONITOR, SLOWLOG, LATENCY, CLUSTER, BGREWRITEAOF."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

from disque import __version__
from disque.commands import (
    TABLE,
    Caller,
    Command,
    command,
    int_arg,
    parse_int,
    timeout_arg,
)
from disque.commands.info import render_info
from disque.config import ConfigSetError, config_get, config_rewrite, config_set
from disque.protocol.errors import CommandError, err, syntax
from disque.protocol.reply import OK, Map, Status, bulk, encode, integer

if TYPE_CHECKING:
    from disque.server import Server

# ---------------------------------------------------------------------------- basics


@command("time", 1, "readonly fast")
def cmd_time(c: Caller, argv: list[bytes]) -> None:
    now = time.time_ns() // 1000
    c.out.append(encode([str(now // 1_000_000).encode(), str(now % 1_000_000).encode()]))


@command("auth", 2, "readonly loading fast", noauth=True)
def cmd_auth(c: Caller, argv: list[bytes]) -> None:
    password = c.server.cfg.requirepass
    if not password:
        raise err("Client sent AUTH, but no password is set")
    if len(argv[1]) <= 512 and argv[1] == password_bytes(password):
        c.authenticated = True
        c.out.append(OK)
    else:
        c.authenticated = False
        raise err("invalid password")


def password_bytes(password: str) -> bytes:
    """requirepass as the bytes a client sends: CONFIG SET keeps bytes that are not UTF-8 as
    surrogate escapes."""
    return password.encode("utf-8", "surrogateescape")


@command("hello", -1, "readonly fast", noauth=True)
def cmd_hello(c: Caller, argv: list[bytes]) -> None:
    """Plain HELLO is Disque's node list; HELLO <protover> ... is the Redis 6 handshake."""
    if len(argv) == 1:
        if not c.authenticated:
            c.out.append(b"-NOAUTH Authentication required.\r\n")
            return
        transport = c.transport
        tls = transport is not None and transport.get_extra_info("ssl_object") is not None
        c.out.append(encode(disque_hello(c.server, tls), c.proto))
        return
    try:
        protover = parse_int(argv[1])
    except ValueError:
        raise err("Protocol version is not an integer or out of range") from None
    i = 2
    auth: tuple[bytes, bytes] | None = None
    setname: bytes | None = None
    while i < len(argv):
        opt = argv[i].lower()
        if opt == b"auth" and i + 2 < len(argv):
            auth = (argv[i + 1], argv[i + 2])
            i += 3
        elif opt == b"setname" and i + 1 < len(argv):
            setname = argv[i + 1]
            i += 2
        else:
            raise err(f"Syntax error in HELLO option '{argv[i].decode(errors='replace')}'")
    if protover not in (2, 3):
        raise CommandError("NOPROTO", "unsupported protocol version")
    password = c.server.cfg.requirepass
    if auth is not None:
        user, pw = auth
        if not password and user == b"default":
            pass
        elif user != b"default" or pw != password_bytes(password):
            raise CommandError("WRONGPASS",
                               "invalid username-password pair or user is disabled.")
        c.authenticated = True
    if not c.authenticated:
        raise CommandError("NOAUTH", "HELLO must be called with the client already "
                           "authenticated, otherwise the HELLO <proto> AUTH <user> <pass> "
                           "option can be used to authenticate the client and select the "
                           "RESP protocol version at the same time")
    if setname is not None:
        check_client_name(setname)
        c.name = setname
    c.set_proto(protover)
    c.out.append(encode(Map({
        "server": "disque", "version": __version__, "proto": protover, "id": c.id,
        "mode": "standalone", "role": "master", "modules": [],
    }), c.proto))


def disque_hello(server: Server, tls: bool = False) -> list[Any]:
    """`:1`, my node ID, then [id, ip, port, priority] per known node (port and priority
    as bulk strings). `tls`: asked on a TLS connection, the nodes that announce a TLS
    client port are listed with it (a client that discovers the cluster over TLS keeps
    TLS for the other nodes); the others with their port."""
    node = server.node
    entries = [[n.id, n.ip, str(n.tls_port if tls and n.tls_port else n.port).encode(),
                str(n.priority).encode()]
               for n in node.hello_nodes()]
    return [1, node.myself, *entries]


# ---------------------------------------------------------------------------- INFO
@command("info", -1, "readonly loading")
def cmd_info(c: Caller, argv: list[bytes]) -> None:
    if len(argv) > 2:
        raise syntax()
    section = argv[1].decode(errors="replace").lower() if len(argv) == 2 else None
    c.out.append(bulk(render_info(c.server, section)))


# ---------------------------------------------------------------------------- CONFIG
@command("config", -2, "readonly admin")
def cmd_config(c: Caller, argv: list[bytes]) -> None:
    sub = argv[1].lower()
    n = len(argv)
    cfg = c.server.cfg
    typed = argv[1].decode(errors="replace")
    try:
        if sub == b"get":
            if n != 3:
                raise err(f"Wrong number of arguments for CONFIG {typed}")
            flat: list[Any] = []
            for name, value in config_get(cfg, argv[2].decode(errors="replace")):
                flat += [name.encode(), value.encode("utf-8", "surrogateescape")]
            c.out.append(encode(flat, c.proto))
        elif sub == b"set":
            if n < 4 or n % 2:
                raise err(f"Wrong number of arguments for CONFIG {typed}")
            pairs = [(argv[i].decode(errors="replace"),
                      argv[i + 1].decode(errors="surrogateescape")) for i in range(2, n, 2)]
            config_set(cfg, *pairs[0], *pairs[1:])
            c.out.append(OK)
        elif sub == b"resetstat":
            if n != 2:
                raise err(f"Wrong number of arguments for CONFIG {typed}")
            c.server.reset_stats()
            c.out.append(OK)
        elif sub == b"rewrite":
            if n != 2:
                raise err(f"Wrong number of arguments for CONFIG {typed}")
            config_rewrite(cfg)
            c.out.append(OK)
        else:
            raise err("CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")
    except ConfigSetError as exc:
        prefix, _, message = str(exc).partition(" ")
        raise CommandError(prefix, message) from None


# ---------------------------------------------------------------------------- CLIENT
def printable(value: bytes) -> bool:
    """Only `!`..`~`: CLIENT LIST lines are split by spaces, so a value must not hold one."""
    return all(33 <= ch <= 126 for ch in value)


def check_client_name(name: bytes) -> None:
    if not printable(name):
        raise err("Client names cannot contain spaces, newlines or special characters.")


def client_info(c: Caller, now: float) -> str:
    """One CLIENT LIST line. `qbuf`: bytes received and not run yet; `qbuf-free`: what the
    connection may still buffer before client-query-buffer-limit closes it; `obl`: bytes
    waiting in the transport; `oll`: reply chunks not yet handed to it; `omem`: both, in
    bytes."""
    flags = "P" if c.closing else ("O" if c.monitor else ("b" if c.waiter else "N"))
    sock = c.transport.get_extra_info("socket") if c.transport else None
    fd = sock.fileno() if sock is not None else -1
    qbuf = c.query_buffer()
    obl, oll, omem = c.output_buffer()
    return (f"id={c.id} addr={c.addr} fd={fd} name={c.name.decode(errors='replace')} "
            f"age={int(now - c.ctime)} idle={int(now - c.last_interaction)} flags={flags} "
            f"qbuf={qbuf} qbuf-free={max(c.query_limit() - qbuf, 0)} obl={obl} "
            f"oll={oll} omem={omem} "
            f"events=r cmd={c.last_cmd.name if c.last_cmd else 'NULL'} "
            f"lib-name={c.lib_name.decode(errors='replace')} "
            f"lib-ver={c.lib_ver.decode(errors='replace')}")


CLIENT_SYNTAX = ("Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | "
                 "SETNAME connection-name)")


@command("client", -2, "readonly admin")
def cmd_client(c: Caller, argv: list[bytes]) -> None:
    sub = argv[1].lower()
    n = len(argv)
    server = c.server
    if sub == b"list" and n == 2:
        now = time.monotonic()
        text = "".join(client_info(x, now) + "\n" for x in list(server.clients.values()))
        c.out.append(bulk(text.encode()))
    elif sub == b"getname" and n == 2:
        c.out.append(bulk(c.name) if c.name else c.null_bulk)
    elif sub == b"setname" and n == 3:
        check_client_name(argv[2])
        c.name = argv[2]
        c.out.append(OK)
    elif sub == b"info" and n == 2:
        c.out.append(bulk((client_info(c, time.monotonic()) + "\n").encode()))
    elif sub == b"id" and n == 2:
        c.out.append(integer(c.id))
    elif sub == b"setinfo" and n == 4:
        client_setinfo(c, argv[2], argv[3])
        c.out.append(OK)
    elif sub == b"kill" and n == 3:
        target = argv[2].decode(errors="replace")
        for x in list(server.clients.values()):
            if x.addr == target:
                c.out.append(OK)
                if x is c:
                    c.close_after_reply()
                else:
                    x.close()
                return
        raise err("No such client")
    elif sub == b"kill" and n > 3 and n % 2 == 0:
        client_kill_filters(c, argv)
    elif sub == b"pause" and n == 3:
        server.pause_clients(timeout_arg(argv[2]))
        c.out.append(OK)
    elif sub == b"reply" and n == 3:
        mode = argv[2].lower()
        if mode == b"on":
            c.reply_mode = 0
            c.out.append(OK)
        elif mode == b"off":
            c.reply_mode = 1
        elif mode == b"skip":
            if c.reply_mode != 1:  # SKIP means nothing while replies are OFF (Redis)
                c.reply_mode = 2
        else:
            raise syntax()
    else:
        raise err(CLIENT_SYNTAX)


def client_setinfo(c: Caller, attr: bytes, value: bytes) -> None:
    """CLIENT SETINFO LIB-NAME|LIB-VER value, with Redis 7.2's replies (the attribute as
    typed); the values show in CLIENT LIST / CLIENT INFO."""
    typed = attr.decode(errors="replace")
    low = attr.lower()
    if low not in (b"lib-name", b"lib-ver"):
        raise err(f"Unrecognized option '{typed}'")
    if not printable(value):
        raise err(f"{typed} cannot contain spaces, newlines or special characters.")
    if low == b"lib-name":
        c.lib_name = value
    else:
        c.lib_ver = value


def client_kill_filters(c: Caller, argv: list[bytes]) -> None:
    cid = addr = None
    skipme = True
    for i in range(2, len(argv), 2):
        key, value = argv[i].lower(), argv[i + 1]
        if key == b"id":
            cid = int_arg(value)
        elif key == b"addr":
            addr = value.decode(errors="replace")
        elif key == b"type":
            if value.lower() != b"normal":
                raise err(f"Unknown client type '{value.decode(errors='replace')}'")
        elif key == b"skipme":
            if value.lower() not in (b"yes", b"no"):
                raise syntax()
            skipme = value.lower() == b"yes"
        else:
            raise syntax()
    killed = 0
    for x in list(c.server.clients.values()):
        if (cid is not None and x.id != cid) or (addr is not None and x.addr != addr):
            continue
        if x is c and skipme:
            continue
        killed += 1
        if x is c:
            c.close_after_reply()
        else:
            x.close()
    c.out.append(integer(killed))


# ---------------------------------------------------------------------------- COMMAND
def command_entry(cmd: Command) -> list[Any]:
    return [cmd.name.encode(), cmd.arity, [Status(f) for f in cmd.flags], 0, 0, 0]


@command("command", 0, "readonly loading")
def cmd_command(c: Caller, argv: list[bytes]) -> None:
    if len(argv) == 1:
        c.out.append(encode([command_entry(x) for x in TABLE.values()], c.proto))
        return
    sub = argv[1].lower()
    if sub == b"count" and len(argv) == 2:
        c.out.append(integer(len(TABLE)))
    elif sub == b"info":
        entries = [command_entry(TABLE[a.lower()]) if a.lower() in TABLE else None
                   for a in argv[2:]]
        c.out.append(encode(entries, c.proto))
    else:
        raise err("Unknown subcommand or wrong number of arguments.")


# ---------------------------------------------------------------------------- DEBUG
MAX_DEBUG_SLEEP = 1e9  # seconds (~31 years); time.sleep overflows a few times above this

@command("debug", -2, "admin")
def cmd_debug(c: Caller, argv: list[bytes]) -> None:
    sub = argv[1].lower()
    n = len(argv)
    if sub == b"sleep" and n == 3:
        try:
            seconds = float(argv[2])
        except ValueError:
            seconds = 0.0  # strtod: not a number sleeps 0
        if not abs(seconds) < MAX_DEBUG_SLEEP:  # inf, nan, or beyond what time.sleep takes
            raise err("value is out of range")
        time.sleep(max(0.0, seconds))  # blocks the whole server, as the original does
        c.out.append(OK)
    elif sub == b"flushall" and n == 2:
        c.node.flushall()
        c.out.append(OK)
    elif sub == b"error" and n == 3:
        text = argv[2].decode(errors="replace").replace("\r", " ").replace("\n", " ")
        c.out.append(b"-" + text.encode() + b"\r\n")
    elif sub == b"structsize" and n == 2:
        from disque.jobs.job import Job
        from disque.queues.queue import Queue
        job = Job(b"D-00000000-" + b"A" * 24 + b"-0001", b"q", b"", 1, 0, 0, 0, 1, ())
        text = (f"bits:{64 if sys.maxsize > 2**32 else 32} job:{sys.getsizeof(job)} "
                f"queue:{sys.getsizeof(Queue(b'q', 0))}\r\n")
        c.out.append(bulk(text.encode()))
    elif sub == b"loadaof" and n == 2:
        if not c.server.aofm.debug_loadaof():
            raise CommandError("ERR")
        c.out.append(OK)
    elif sub == b"raise" and n == 2:
        # A handler failing unexpectedly, on purpose: the dispatcher must answer the
        # internal-error reply, log the traceback and keep serving (tests, monitoring).
        raise RuntimeError("DEBUG RAISE: a deliberate failure")
    elif sub == b"jmap" and n == 2:  # counts per state, handy for tests
        counts = [0, 0, 0, 0]
        for job in c.node.jobs.values():
            counts[job.state] += 1
        c.out.append(encode([b"wait-repl", counts[0], b"active", counts[1],
                             b"queued", counts[2], b"acked", counts[3]], c.proto))
    else:
        raise err(f"Unknown DEBUG subcommand or wrong number of arguments for "
                  f"'{argv[1].decode(errors='replace')}'")


# ---------------------------------------------------------------------------- lifecycle
@command("shutdown", -1, "readonly admin loading")
def cmd_shutdown(c: Caller, argv: list[bytes]) -> None:
    if len(argv) > 2:
        raise syntax()
    mode = argv[1].lower() if len(argv) == 2 else b""
    if mode not in (b"", b"nosave", b"save", b"rewrite-aof"):
        raise syntax()
    server = c.server
    if not server.prepare_shutdown(mode):
        raise err("Errors trying to SHUTDOWN. Check logs.")
    server.shutdown(exit_prepared=True)


@command("monitor", 1, "readonly admin")
def cmd_monitor(c: Caller, argv: list[bytes]) -> None:
    c.monitor = True
    c.server.dispatch.monitors.add(c)
    c.out.append(OK)


@command("slowlog", -2, "readonly")
def cmd_slowlog(c: Caller, argv: list[bytes]) -> None:
    sub = argv[1].lower()
    server = c.server
    if sub == b"get" and len(argv) in (2, 3):
        count = int_arg(argv[2]) if len(argv) == 3 else 10
        slowlog = server.dispatch.slowlog
        entries = list(slowlog)[: max(count, 0)] if count >= 0 else list(slowlog)
        c.out.append(encode(entries, c.proto))
    elif sub == b"len" and len(argv) == 2:
        c.out.append(integer(len(server.dispatch.slowlog)))
    elif sub == b"reset" and len(argv) == 2:
        server.dispatch.slowlog.clear()
        c.out.append(OK)
    else:
        raise err("Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.")


LATENCY_HELP = (
    "LATENCY <subcommand> [<arg> ...]. Subcommands are:",
    "LATEST",
    "    The latest sample of every event: [event, unix time, latency ms, all-time max ms].",
    "HISTORY <event>",
    "    The samples kept for <event> (at most 160, one per second): [unix time, ms].",
    "RESET [<event> ...]",
    "    Forget the samples of the named events (default: all); the number forgotten.",
    "GRAPH <event>",
    "    An ASCII graph of the samples kept for <event>.",
    "DOCTOR",
    "    A human readable report of the events recorded, with advice.",
    "HELP",
    "    This help.",
)


@command("latency", -2, "readonly admin loading")
def cmd_latency(c: Caller, argv: list[bytes]) -> None:
    """The latency monitor (disque.latency); events are named in ASCII, and an event given
    as an argument is looked up exactly (RESET ignores case), as Redis does."""
    sub = argv[1].lower()
    n = len(argv)
    monitor = c.server.latency
    if sub == b"latest" and n == 2:
        c.out.append(encode(monitor.latest(), c.proto))
    elif sub == b"history" and n == 3:
        c.out.append(encode(monitor.history(event_name(argv[2])), c.proto))
    elif sub == b"reset":
        names = None if n == 2 else [event_name(a) for a in argv[2:]]
        c.out.append(integer(monitor.reset(names)))
    elif sub == b"doctor" and n == 2:
        cfg = c.server.cfg
        report = monitor.doctor(cfg.slowlog_log_slower_than, cfg.appendfsync)
        c.out.append(bulk(report.encode()))
    elif sub == b"graph" and n == 3:
        graph = monitor.graph(event_name(argv[2]))
        if graph is None:
            raise err(f"No samples available for event '{argv[2].decode(errors='replace')}'")
        c.out.append(bulk(graph.encode()))
    elif sub == b"help" and n == 2:
        c.out.append(encode([Status(line) for line in LATENCY_HELP], c.proto))
    else:
        raise syntax()


def event_name(arg: bytes) -> str:
    return arg.decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------------------- CLUSTER
CLUSTER_USAGE = "Wrong CLUSTER subcommand or number of arguments"


@command("cluster", -2, "readonly admin")
def cmd_cluster(c: Caller, argv: list[bytes]) -> None:
    sub = argv[1].lower()
    n = len(argv)
    node = c.node
    server = c.server
    if sub == b"myid" and n == 2:
        c.out.append(bulk(node.myself))
    elif sub == b"leaving" and n == 2:
        c.out.append(b"+yes\r\n" if node.leaving else b"+no\r\n")
    elif sub == b"leaving" and n == 3:
        value = argv[2].lower()
        if value not in (b"yes", b"no"):
            raise err("Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")
        node.set_leaving(value == b"yes")
        server.bus.apply()
        c.out.append(OK)
    elif sub == b"nodes" and n == 2:
        c.out.append(bulk(server.membership.cluster_nodes().encode()))
    elif sub == b"meet" and n == 4:
        cluster_meet(c, argv[2], argv[3])
    elif sub == b"forget" and n == 3:
        server.membership.forget(argv[2])
        server.bus.apply()
        c.out.append(OK)
    elif sub == b"saveconfig" and n == 2:
        try:
            server.save_nodes_conf(server.membership.nodes_conf())
        except OSError as exc:
            raise err(f"error saving the cluster node config: {exc.strerror}") from None
        c.out.append(OK)
    elif sub == b"info" and n == 2:
        info = node.cluster_info()
        text = "".join(f"{k}:{v}\r\n" for k, v in info)
        c.out.append(bulk(text.encode()))
    elif sub == b"reset" and n in (2, 3):
        hard = False
        if n == 3:
            mode = argv[2].lower()
            if mode not in (b"soft", b"hard"):
                raise syntax()
            hard = mode == b"hard"
        server.cluster_reset(hard)
        c.out.append(OK)
    else:
        raise err(CLUSTER_USAGE)


_NUMERIC_HOST = re.compile(r"[0-9.]+|.*:.*")


def cluster_meet(c: Caller, host: bytes, port_arg: bytes) -> None:
    """CLUSTER MEET host port. An IP address is met at once; a host name is resolved (IPv4
    first) off the event loop while the client waits: a slow DNS server must not stall the
    node's heartbeats and every other client."""
    try:
        port = parse_int(port_arg)
    except ValueError:
        raise err(f"Invalid TCP port specified: {port_arg.decode(errors='replace')}") from None
    address = host.decode(errors="replace")
    if port <= 0 or port + c.server.membership.bus_port_offset > 65535:
        raise err(f"Invalid node address specified: {address}:{port}")
    if _NUMERIC_HOST.fullmatch(address):  # an address, never the inet_aton forms: 1.2.3
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise err(f"Invalid node address specified: {address}:{port}") from None
        meet(c.server, address, port)
        c.out.append(OK)
        return
    waiter = MeetWaiter(c, address, port)
    c.block(waiter)
    loop = c.server.loop
    assert loop is not None
    task = loop.create_task(loop.getaddrinfo(address, None, type=socket.SOCK_STREAM))
    task.add_done_callback(waiter.resolved)


def meet(server: Server, ip: str, port: int) -> None:
    server.membership.meet(ip.encode(), port)
    server.bus.apply()


class MeetWaiter:
    """A CLUSTER MEET client waiting for its host name to resolve. The MEET happens even if
    the client leaves meanwhile, as it would had the name resolved at once."""

    __slots__ = ("client", "server", "address", "port")

    def __init__(self, client: Caller, address: str, port: int) -> None:
        self.client: Caller | None = client
        self.server = client.server
        self.address = address
        self.port = port

    def cancel(self) -> None:  # the client went away: nobody to answer
        self.client = None

    def resolved(self, task: asyncio.Future[list[tuple[Any, ...]]]) -> None:
        reply = OK
        try:
            infos = sorted(task.result(), key=lambda i: i[0] != socket.AF_INET)
            meet(self.server, infos[0][4][0], self.port)
        except asyncio.CancelledError:  # the server is shutting down
            return
        except (OSError, ValueError, IndexError):  # ValueError: NUL, bad IDNA
            reply = err(f"Invalid node address specified: {self.address}:{self.port}").resp()
        except CommandError as exc:
            reply = exc.resp()
        if self.client is not None:
            self.client.unblocked(reply)


@command("bgrewriteaof", 1, "readonly admin")
def cmd_bgrewriteaof(c: Caller, argv: list[bytes]) -> None:
    aofm = c.server.aofm
    if aofm.rewrite is not None:
        raise err("Background append only file rewriting already in progress")
    if not aofm.start_rewrite():
        raise CommandError("ERR")
    c.out.append(b"+Background append only file rewriting started\r\n")
