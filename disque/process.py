"""Process concerns: the command line, logging, daemonizing, limits, the nodes.conf lock.

`main()` is `disque-server`: it reads the configuration (file, then command-line
directives), changes to `dir`, sets up logging (structlog to stdout or `logfile`, also to
syslog with `syslog-enabled`), detaches with `daemonize yes` (the starting process waits
until the node serves, and exits 1 with the reason if it never does), makes room for
`maxclients` in RLIMIT_NOFILE, and runs the server on a uvloop loop until SHUTDOWN or a
signal.

nodes.conf holds the node's identity: it is locked (a side `.lock` file, flock) for the life
of the process, so that two servers never run as the same node.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
import logging.handlers
import os
import random
import resource
import signal
import sys
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

from disque import __version__, compiled
from disque.aof.loader import AofLoadError
from disque.cluster.membership import new_node_id
from disque.cluster.nodes import ClusterNode, NodesConfError, parse_nodes_conf
from disque.commands import load_all
from disque.config import Config, ConfigError, load_config
from disque.connection import debug_events
from disque.logs import configure_structlog, renderer_for
from disque.tls import TlsConfigError, bus_contexts, server_context

log = structlog.get_logger("disque")

Renderer = Callable[[Any, str, MutableMapping[str, Any]], Any]


class ClusterConfigError(Exception):
    """nodes.conf cannot be used: locked by another node, or unreadable."""


# The lock on nodes.conf of the working directory, held for the life of the process (moved
# by CONFIG SET dir: see replace_config_lock).
_config_lock_fd: int | None = None


def lock_cluster_config(cfg: Config) -> int:
    """Lock nodes.conf of the working directory (a side file: nodes.conf itself is replaced
    by rename on every save); the lock's fd. OSError if the lock file cannot be created."""
    lock_fd = os.open(os.path.abspath(cfg.cluster_config_file) + ".lock",
                      os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        raise ClusterConfigError(
            f"Sorry, the cluster configuration file {cfg.cluster_config_file} is already "
            f"used by a different Disque node.") from None
    return lock_fd


def load_cluster_config(cfg: Config,
                        rng: random.Random) -> tuple[bytes, list[ClusterNode], bool]:
    """Read nodes.conf (creating the identity on first start) and lock it for the life of
    the process, so two servers never share one identity. Returns (my id, other entries,
    whether the file is new)."""
    global _config_lock_fd
    path = os.path.abspath(cfg.cluster_config_file)
    _config_lock_fd = lock_cluster_config(cfg)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    if not text.strip():
        return new_node_id(rng), [], True
    try:
        myself, entries = parse_nodes_conf(text)
    except NodesConfError as exc:
        raise ClusterConfigError(f"Unrecoverable error: {exc} ({path})") from None
    return myself, entries, False


def replace_config_lock(lock_fd: int) -> None:
    """The node's files moved (CONFIG SET dir): hold the lock of the new directory's
    nodes.conf, release the old one."""
    global _config_lock_fd
    if _config_lock_fd is not None:
        os.close(_config_lock_fd)
    _config_lock_fd = lock_fd


_LEVELS = {"debug": logging.DEBUG, "verbose": logging.DEBUG, "notice": logging.INFO,
           "warning": logging.WARNING}



class _SyslogSender(logging.handlers.SysLogHandler):
    """The standard library's syslog client on the configured socket (syslog-socket), in
    glibc's shape: `<PRI>ident[pid]: line`. Like openlog/syslog, a daemon that is not there
    (yet) costs nothing: the socket is retried on the next line and the line dropped."""

    append_nul = False

    def __init__(self, ident: str, facility: str, path: str) -> None:
        super().__init__(address=path, facility=facility)
        self.base_ident = ident

    def send_line(self, level: str, line: str) -> None:
        self.ident = f"{self.base_ident}[{os.getpid()}]: "  # the pid after daemonize()
        record = logging.LogRecord("disque", logging.INFO, "", 0, line, None, None)
        record.levelname = level.upper()
        self.emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - stdlib's name
        """No syslog daemon listening: drop the line, as syslog(3) does."""


def _also_to_syslog(render: Renderer, sender: _SyslogSender) -> Renderer:
    """Wrap the final renderer: every rendered line also goes to syslog (syslog-enabled)."""
    def processor(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
        line = render(logger, method, event_dict)
        sender.send_line(event_dict.get("level", "info"),
                         line if isinstance(line, str) else str(line))
        return line
    return processor


def configure_logging(cfg: Config) -> None:
    """structlog with key-value events: console by default, JSON with log-format json; also to
    syslog with syslog-enabled yes (syslog-ident, syslog-facility)."""
    level = _LEVELS.get(cfg.loglevel, logging.INFO)
    debug_events[0] = level <= logging.DEBUG
    stream: TextIO = sys.stdout
    if cfg.logfile:
        stream = open(cfg.logfile, "a", buffering=1)  # noqa: SIM115 - lives with the process
    renderer = renderer_for(cfg.log_format)
    if cfg.syslog_enabled:
        sender = _SyslogSender(cfg.syslog_ident, cfg.syslog_facility, cfg.syslog_socket)
        renderer = _also_to_syslog(renderer, sender)
    configure_structlog(level, renderer, stream)


_READY = b"\0disque-server-ready\n"


def daemonize() -> None:
    """Detach as a classic daemon: fork, new session, fork again, stdio to /dev/null.

    Until daemon_ready(), the daemon's stderr is a pipe to the starting process, which waits
    and exits 0 once the node serves, or prints what went wrong and exits 1 (a port in use,
    a bad AOF...): tooling that starts daemonized nodes sees a failed start."""
    r, w = os.pipe()
    if os.fork():
        os.close(w)
        os._exit(_await_daemon(r))
    os.close(r)
    os.setsid()
    if os.fork():
        os._exit(0)
    fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(fd, 0)
    os.dup2(fd, 1)
    os.dup2(w, 2)
    for extra in {fd, w} - {0, 1, 2}:
        os.close(extra)


def _await_daemon(r: int) -> int:
    data = bytearray()
    while chunk := os.read(r, 65536):
        data += chunk
    ready = data.endswith(_READY)
    if ready:
        del data[-len(_READY):]
    elif not data:
        data += b"disque-server: the daemon exited during start-up (see its log)\n"
    if data:
        os.write(2, bytes(data))
    return 0 if ready else 1


def daemon_ready() -> None:
    """The daemonized node serves: release the starting process, stderr to /dev/null."""
    sys.stderr.flush()
    os.write(2, _READY)
    fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(fd, 2)
    os.close(fd)


USAGE = """Usage: disque-server [/path/to/disque.conf] [options]
       disque-server - (read config from stdin)
       disque-server --version
       disque-server --help

Any directive of the config file can be given as an option, overriding the file:
       disque-server conf/disque.conf --port 7712 --dir /tmp/n2 --loglevel verbose
"""


RESERVED_FDS = 32  # listeners, bus links, the AOF, logs: descriptors that are not clients


def adjust_open_files_limit(maxclients: int) -> tuple[int, int, str]:
    """Make room for `maxclients` clients in RLIMIT_NOFILE, as Redis does at startup.

    Raises the soft limit (and the hard one when allowed) to maxclients + RESERVED_FDS if it
    is lower. Returns (how many clients fit now, the limit in force, why a raise failed or
    ""). Without this a default `ulimit -n` of 1024 made the 1000th connection fail at
    accept() with a reset instead of the max-clients error.
    """
    need = maxclients + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return maxclients, soft, ""
    if hard == resource.RLIM_INFINITY or hard >= need:
        attempts = [(need, hard)]
    else:  # raising the hard limit needs privileges; else settle for the hard limit
        attempts = [(need, need), (hard, hard)]
    why = ""
    for limits in attempts:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            break
        except (ValueError, OverflowError, OSError) as exc:
            why = str(exc)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= need:
        return maxclients, soft, ""
    return max(0, soft - RESERVED_FDS), soft, why or "limit reached"


def main(argv: list[str] | None = None) -> int:
    """Console entry point: `disque-server [CONFIG_FILE] [--directive value ...]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-v", "--version"):
        yes, n = compiled.summary()
        print(f"disque-py server v={__version__} python={sys.version.split()[0]} "
              f"compiled={yes} ({n}/{len(compiled.HOT_MODULES)} hot modules)")
        return 0
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        cfg = load_config(argv, commands=[n.decode() for n in load_all()])
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if cfg.tls_port or cfg.tls_cluster or cfg.tls_http:
        try:  # the files are read now: a bad one stops the start
            server_context(cfg)
            if cfg.tls_cluster:
                bus_contexts(cfg)
        except TlsConfigError as exc:
            print(f"*** FATAL CONFIG ERROR *** Failed to configure TLS: {exc}", file=sys.stderr)
            return 1
    if not cfg.port and not cfg.tls_port and not cfg.unixsocket:
        # as redis-server: a node nobody can reach would run until killed
        print("Configured to not listen anywhere, exiting.", file=sys.stderr)
        return 1
    try:
        os.makedirs(cfg.dir, exist_ok=True)
        os.chdir(cfg.dir)
    except OSError as exc:
        print(f"Can't chdir to '{cfg.dir}': {exc.strerror}", file=sys.stderr)
        return 1
    try:
        # before daemonize(): once detached, stderr is /dev/null and the exit status is lost
        configure_logging(cfg)
    except OSError as exc:
        print(str(ConfigError(cfg.config_file or "command line",
                              f"Can't open the log file '{cfg.logfile}': {exc.strerror}")),
              file=sys.stderr)
        return 1
    if cfg.daemonize:
        daemonize()
    fits, limit, why = adjust_open_files_limit(cfg.maxclients)
    if fits < cfg.maxclients:
        if fits < 1:
            log.error("server.ulimit_too_low", open_files=limit,
                      hint="increase 'ulimit -n' to start the server")
            print(f"Your current 'ulimit -n' of {limit} is not enough for the server to start.",
                  file=sys.stderr)
            return 1
        log.warning("server.maxclients_reduced", requested=cfg.maxclients, maxclients=fits,
                    open_files=limit, error=why,
                    hint="increase 'ulimit -n' if you need more clients")
        cfg.maxclients = fits
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop
        uvloop.install() if sys.version_info < (3, 12) else None
        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a hard dependency
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from disque.server import Server  # (the server imports this module)

    try:
        server = Server(cfg)
    except ClusterConfigError as exc:
        print(str(exc), file=sys.stderr)
        log.error("cluster.config_error", error=str(exc))
        return 1
    gc.disable()  # see Cron.gc_tick
    gc.freeze()
    # Before start(): the listener answers (even -LOADING) while the AOF loads, so a client
    # or a test harness may already send SIGTERM.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.shutdown)
    # Over a file-size limit (RLIMIT_FSIZE) an AOF write must fail with EFBIG, which the AOF
    # handles as a full disk, not kill the process (CPython ignores it too; say it here).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def write_pidfile() -> None:
        """Before the listener opens (in the running loop, which hears a SIGTERM sent
        meanwhile): a client it answers, even -LOADING while the AOF loads, finds the file,
        as with redis-server, whose event loop serves nobody before it writes it (written
        once started, a CI run's test saw PING answered and no pidfile yet). Removed again
        if the start fails."""
        if cfg.pidfile:
            try:
                with open(cfg.pidfile, "w") as f:
                    f.write(f"{os.getpid()}\n")
                server.own_files.append(os.path.abspath(cfg.pidfile))
            except OSError as exc:
                log.warning("server.pidfile_failed", path=cfg.pidfile, error=str(exc))

    def started() -> None:
        log.info("server.start", version=__version__, compiled=compiled.summary()[0],
                 port=cfg.port, tls_port=cfg.tls_port, bind=" ".join(cfg.bind),
                 pid=os.getpid(), config_file=cfg.config_file or "",
                 node_id=server.node_id.decode(), dir=os.getcwd())
        if cfg.daemonize:
            daemon_ready()

    try:
        served = loop.run_until_complete(server.serve(started, write_pidfile))
    except OSError as exc:
        log.error("server.listen_failed", port=cfg.port, error=str(exc))
        print(f"Could not listen: {exc}", file=sys.stderr)
        server.remove_own_files()
        return 1
    except AofLoadError as exc:
        log.error("aof.load_failed", error=str(exc))
        print(str(exc), file=sys.stderr)
        server.remove_own_files()
        return 1
    finally:
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
    if not served:
        log.info("server.exit", code=server.exit_code, during="startup")
        return server.exit_code
    log.info("server.exit", code=server.exit_code)
    return server.exit_code
