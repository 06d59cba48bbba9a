"""CONFIG SET reaching the subsystems: the hooks the server registers on the Config.

Most directives are read where they are used, at the time they are used. The others live in
a subsystem's own state (the node's memory limits, the membership's timeouts, the readers'
limits of every connected client, the log set-up, the HTTP listener, the working
directory): for each of them a hook, run by `config_set` after the value is checked, moves
the new value there. A hook that cannot apply the value raises ConfigSetError: CONFIG SET
answers that error and the old value stays.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from disque.cluster.nodes import NodesConfError, parse_nodes_conf
from disque.config import Config, ConfigSetError, Hook, on_set
from disque.process import (
    ClusterConfigError,
    adjust_open_files_limit,
    configure_logging,
    lock_cluster_config,
    replace_config_lock,
)
from disque.tls import CONTEXT_DIRECTIVES

if TYPE_CHECKING:
    from disque.server import Server

log = structlog.get_logger("disque")


def install(server: Server) -> None:
    """Register the hooks of every directive CONFIG SET changes in a subsystem."""
    cfg = server.cfg
    node = server.node

    def set_node(attr: str, cfg_attr: str) -> Hook:
        return lambda c, name: setattr(node, attr, getattr(c, cfg_attr))

    on_set(cfg, "maxmemory", set_node("maxmemory", "maxmemory"))
    on_set(cfg, "maxmemory-policy", set_node("maxmemory_policy", "maxmemory_policy"))
    on_set(cfg, "queue-idle-timeout", set_node("queue_idle_timeout", "queue_idle_timeout"))
    on_set(cfg, "rereplicate-rate",
           lambda c, name: setattr(node.rereplication, "rate", c.rereplicate_rate))
    on_set(cfg, "repair-rate", lambda c, name: setattr(node.repair, "rate", c.repair_rate))
    on_set(cfg, "repair-grace",
           lambda c, name: setattr(node.repair, "grace", c.repair_grace))
    for name in ("default-max-deliveries", "default-max-nacks", "deadletter-queue",
                 "redrive-rate"):
        on_set(cfg, name, server.apply_deadletter_defaults)
    on_set(cfg, "client-output-buffer-limit", lambda c, name: server.apply_limits())
    for name in CONTEXT_DIRECTIVES:  # the next TLS connection uses the new context
        on_set(cfg, name, server.tls.reload)
    def set_latency_threshold(c: Config, name: str) -> None:
        server.latency.set_threshold(c.latency_monitor_threshold)
        server.dispatch.thresholds_changed()

    on_set(cfg, "latency-monitor-threshold", set_latency_threshold)
    on_set(cfg, "slowlog-log-slower-than", lambda c, name: server.dispatch.thresholds_changed())

    def set_reader_limits(c: Config, name: str) -> None:
        for client in server.clients.values():
            client.reader.max_bulk = c.proto_max_bulk_len
            client.reader.max_query = c.client_query_buffer_limit

    on_set(cfg, "proto-max-bulk-len", set_reader_limits)
    on_set(cfg, "client-query-buffer-limit", set_reader_limits)
    def relog(c: Config, name: str) -> None:
        try:
            configure_logging(c)
        except OSError as exc:
            raise ConfigSetError(f"ERR Can't reopen the log file: {exc.strerror}") from None

    on_set(cfg, "loglevel", relog)
    on_set(cfg, "log-format", relog)
    on_set(cfg, "cluster-node-timeout",
           lambda c, name: setattr(server.membership, "node_timeout", c.cluster_node_timeout))
    on_set(cfg, "cluster-forget-ttl", lambda c, name: setattr(
        server.membership, "blacklist_ttl", c.cluster_forget_ttl * 1000))

    def set_announce(c: Config, name: str) -> None:
        server.membership.set_announce(c.cluster_announce_ip.encode(), c.cluster_announce_port)
        server.bus.apply()

    on_set(cfg, "cluster-announce-ip", set_announce)
    on_set(cfg, "cluster-announce-port", set_announce)

    def check_maxclients(c: Config, name: str) -> None:
        fits, _, _ = adjust_open_files_limit(c.maxclients)
        if fits < c.maxclients:
            raise ConfigSetError("ERR The operating system is not able to handle the "
                                 f"specified number of clients, try with {fits}")

    on_set(cfg, "maxclients", check_maxclients)
    on_set(cfg, "http-port", lambda c, name: set_http_port(server, c))
    on_set(cfg, "dir", lambda c, name: change_dir(server, c))
    for name in ("overflow", "overflow-dir", "overflow-threshold", "overflow-max-size",
                 "maxmemory"):
        on_set(cfg, name, lambda c, name: apply_overflow(server, c))


def overflow_path(cfg: Config) -> str:
    """The overflow store's file: `jobs-<port>.db` in overflow-dir (default: `overflow`
    under dir)."""
    folder = cfg.overflow_dir or os.path.join(cfg.dir, "overflow")
    return os.path.join(folder, f"jobs-{cfg.port}.db")


def apply_overflow(server: Server, cfg: Config) -> None:
    """Open, re-set or close the overflow store as the directives say (at start, and on
    CONFIG SET of any of them or of maxmemory)."""
    overflow = server.node.overflow
    if not cfg.overflow:
        overflow.disable()
        return
    path = overflow_path(cfg)
    try:
        overflow.enable(path, cfg.overflow_threshold, cfg.overflow_max_size)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigSetError(f"ERR Can't open the overflow file {path}: {exc}") from None


def set_http_port(server: Server, cfg: Config) -> None:
    """CONFIG SET http-port: the HTTP listener moves to the new port at once (0 stops
    it); a port that cannot be bound is refused and the old listener stays."""
    if server.loop is None or (server.http is None and not cfg.http_port):
        return
    from disque.server import new_http_side  # (the server imports this module)

    try:
        if server.http is None:
            server.http = new_http_side(server)
        server.http.listen(cfg.bind, cfg.http_port, cfg.tcp_backlog)
    except OSError as exc:
        raise ConfigSetError(f"ERR Could not listen on http-port {cfg.http_port}: "
                             f"{exc.strerror or exc}") from None


def change_dir(server: Server, cfg: Config) -> None:
    """CONFIG SET dir: move the node's files, as the `dir` directive places them.

    The original only chdir'ed: its open AOF kept growing in the old directory until a
    rewrite, so a restart from the rewritten config could come up without the jobs. Here
    nodes.conf is locked and saved in the new directory at once, a relative logfile is
    reopened there and the AOF is rewritten there (the live file moves when the rewrite
    completes). A directory holding another node's files is refused, and any failure
    leaves the node where it was."""
    old = os.getcwd()
    try:
        os.chdir(cfg.dir)
    except OSError as exc:
        raise ConfigSetError(f"ERR Changing directory: {exc.strerror}") from None
    except ValueError:  # a NUL in the path
        raise ConfigSetError("ERR Changing directory: Invalid argument") from None
    new = cfg.dir = os.getcwd()
    if os.path.samefile(new, old):
        return
    undo: list[Callable[[], object]] = [lambda: os.chdir(old)]
    try:
        lock_fd = lock_cluster_config(cfg)
        undo.append(lambda: os.close(lock_fd))
        nodes_conf = os.path.abspath(cfg.cluster_config_file)
        foreign = foreign_files(server, nodes_conf)
        if foreign:
            raise ClusterConfigError(foreign)
        if not os.path.exists(nodes_conf):
            undo.append(lambda: os.unlink(nodes_conf))
        server.save_nodes_conf(server.membership.nodes_conf())
        if cfg.logfile and not os.path.isabs(cfg.logfile):
            configure_logging(cfg)

            def log_back_there() -> None:
                os.chdir(old)
                configure_logging(cfg)

            undo.append(log_back_there)
        aofm = server.aofm
        if aofm.aof is not None and aofm.rewrite is not None:
            # it finishes where it started (its paths are absolute); then one more here
            aofm.rewrite_scheduled = True
        elif aofm.aof is not None and not aofm.start_rewrite():
            raise ClusterConfigError("can't write the AOF there, check the server log")
    except (OSError, ClusterConfigError) as exc:
        for step in reversed(undo):
            step()
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ConfigSetError(f"ERR Changing directory: {why}") from None
    replace_config_lock(lock_fd)
    log.info("server.dir_changed", old=old, dir=new, aof=server.aofm.aof is not None)


def foreign_files(server: Server, nodes_conf: str) -> str:
    """Why the working directory holds another node's files ('' if it does not)."""
    try:
        with open(nodes_conf) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    if text.strip():
        try:
            owner, _ = parse_nodes_conf(text)
        except NodesConfError:
            return f"{server.cfg.cluster_config_file} there is not readable"
        if owner != server.node_id:
            return (f"{server.cfg.cluster_config_file} there belongs to node "
                    f"{owner.decode()}")
    elif os.path.exists(server.cfg.appendfilename):
        return f"{server.cfg.appendfilename} there belongs to another node"
    return ""
