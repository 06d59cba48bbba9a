"""INFO: the sections and fields the INFO command renders (also read by the HTTP side's
/metrics and JSON API, so both give the same numbers).

Field names and order follow the original's INFO, plus disque-py's own (Jobs, Queues,
Cluster, Persistence), so that clients and tools reading the original's INFO keep working.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import TYPE_CHECKING, Any

from disque import __version__
from disque.commands import TABLE
from disque.compiled import HOT_MODULES
from disque.compiled import summary as compiled_summary

if TYPE_CHECKING:
    from disque.server import Server


def _human(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{n}B" if unit == "B" else f"{n:.2f}{unit}"
        n /= 1024
    return f"{n:.2f}P"


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


DISQUE_COMPAT_VERSION = "1.0-rc1"  # the original release whose replies this server gives

# Resolved once, when the commands are loaded: that is before the server changes to its
# `dir`, after which a relative argv[0] (`.venv/bin/disque-server`) would resolve wrongly.
EXECUTABLE = os.path.abspath(sys.argv[0])


def info_sections(server: Server) -> dict[str, list[tuple[str, Any]]]:
    cfg = server.cfg
    node = server.node
    now = time.time()
    uptime = int(now - server.start_time)
    uname = platform.uname()
    used = node.used_memory()
    rss = _rss()
    server.peak_memory = max(server.peak_memory, used)
    ops, ikbps, okbps = server.cron.instantaneous()
    self_usage, child_usage = server.rusage()
    clients = list(server.clients.values())
    compiled_yes, compiled_n = compiled_summary()
    sections: dict[str, list[tuple[str, Any]]] = {
        "Server": [
            # the original's release, for clients and tools that check it; ours follows
            ("disque_version", DISQUE_COMPAT_VERSION), ("disque_py_version", __version__),
            ("disque_git_sha1", "00000000"),
            ("disque_git_dirty", 0), ("disque_build_id", "0"),
            ("os", f"{uname.system} {uname.release} {uname.machine}"),
            ("arch_bits", 64 if sys.maxsize > 2**32 else 32),
            ("multiplexing_api", "uvloop"),
            ("gcc_version", "0.0.0"),
            ("process_id", os.getpid()), ("run_id", server.run_id),
            ("tcp_port", cfg.port), ("uptime_in_seconds", uptime),
            ("uptime_in_days", uptime // 86400), ("hz", cfg.hz),
            ("executable", EXECUTABLE),
            ("config_file", cfg.config_file or ""),
            # the per-job hot path compiled with mypyc (disque/compiled.py), and how much of it
            ("compiled", compiled_yes), ("compiled_modules", f"{compiled_n}/{len(HOT_MODULES)}"),
        ],
        "Clients": [
            ("connected_clients", len(clients)),
            ("client_longest_output_list", max(
                (len(c.out) for c in clients), default=0)),
            ("client_biggest_input_buf", max(
                (c.query_buffer() for c in clients), default=0)),
            # clients, not jobs: one ADDJOBS (or pipelined ADDJOBs) waits for many jobs
            ("blocked_clients", sum(1 for c in clients if c.waiter is not None)),
        ],
        "Memory": [
            ("used_memory", used), ("used_memory_human", _human(used)),
            ("used_memory_rss", rss), ("used_memory_peak", server.peak_memory),
            ("used_memory_peak_human", _human(server.peak_memory)),
            ("mem_fragmentation_ratio", f"{rss / used:.2f}" if used else "0.00"),
            ("mem_allocator", "pymalloc"),
        ],
        "Jobs": [("registered_jobs", len(node.jobs) + node.on_disk),
                 *node.rereplication.info_fields(),
                 *node.repair.info_fields(),
                 ("deadlettered_jobs", node.deadletters.deadlettered),
                 ("redriven_jobs", node.deadletters.redriven),
                 ("redrive_pending", node.deadletters.pending()),
                 *node.overflow.info_fields()],
        "Queues": [("registered_queues", len(node.queues))],
        "Cluster": server.membership.info_fields(),
        "Persistence": server.persistence_info(),
        "Stats": [
            ("total_connections_received", server.stat_connections),
            ("total_commands_processed", server.stat_commands),
            ("instantaneous_ops_per_sec", ops),
            ("total_net_input_bytes", server.shared.stat_net_input),
            ("total_net_output_bytes", server.shared.stat_net_output),
            ("instantaneous_input_kbps", f"{ikbps:.2f}"),
            ("instantaneous_output_kbps", f"{okbps:.2f}"),
            ("rejected_connections", server.stat_rejected),
            *server.tls.info_fields(),
            ("latest_fork_usec", 0),
        ],
        "CPU": [
            ("used_cpu_sys", f"{self_usage.ru_stime:.2f}"),
            ("used_cpu_user", f"{self_usage.ru_utime:.2f}"),
            ("used_cpu_sys_children", f"{child_usage.ru_stime:.2f}"),
            ("used_cpu_user_children", f"{child_usage.ru_utime:.2f}"),
        ],
    }
    stats = []
    for cmd in sorted(TABLE.values(), key=lambda c: c.name):
        if cmd.calls:
            stats.append((f"cmdstat_{cmd.name}",
                          f"calls={cmd.calls},usec={cmd.usec},"
                          f"usec_per_call={cmd.usec / cmd.calls:.2f}"))
    sections["Commandstats"] = stats
    return sections


def render_info(server: Server, section: str | None) -> bytes:
    sections = info_sections(server)
    if section in (None, "default"):
        names = [n for n in sections if n != "Commandstats"]
    elif section == "all":
        names = list(sections)
    else:
        names = [n for n in sections if n.lower() == section]
    parts = []
    for name in names:
        lines = [f"# {name}"] + [f"{k}:{v}" for k, v in sections[name]]
        parts.append("\r\n".join(lines) + "\r\n")
    return "\r\n".join(parts).encode()
