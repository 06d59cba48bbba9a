"""/metrics: the node's state in the Prometheus text format, via the official client library.

`DisqueCollector` is a custom collector: nothing is counted on the hot path for it. At scrape
time it reads the node through the `NodeView` (the same functions INFO and QSTAT render, the
per-queue counters the node bumps where the events happen, and a census of the job registry
taken a slice at a time by the view). Names follow the Prometheus rules: `disque_` prefix,
`_total` counters, base units (bytes, seconds). The `queue` label is bounded: only the
`metrics-max-queues` busiest queues get series (by length, then active jobs, then traffic);
`disque_metrics_queues_omitted` says how many did not. docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from disque.http.view import Census, NodeView, QueueTable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DisqueCollector:
    """Reads the node at scrape time; built per scrape with that scrape's census and queue
    table (both walked a slice at a time before the synchronous collection)."""

    def __init__(self, view: NodeView, census: Census, table: QueueTable) -> None:
        self.view = view
        self.census = census
        self.table = table

    def collect(self) -> Iterator[Metric]:
        yield from self._node()
        yield from self._commands()
        yield from self._jobs_and_queues()
        yield from self._cluster()
        yield from self._copies()
        yield from self._aof()

    # ------------------------------------------------------------------ node
    def _node(self) -> Iterator[Metric]:
        view = self.view
        info = view.info()
        me = view.myself()
        server, mem, clients, stats = (info["Server"], info["Memory"], info["Clients"],
                                       info["Stats"])
        i = InfoMetricFamily("disque_node", "This node: its ID, version and build (compiled "
                             "hot path: yes / no).")
        i.add_metric([], {"node_id": me["id"], "version": str(server["disque_py_version"]),
                          "port": str(me["port"]), "compiled": str(server["compiled"])})
        yield i
        for kind, name, help_, value in (
            ("g", "uptime_seconds", "Seconds since the node started.",
             server["uptime_in_seconds"]),
            ("g", "memory_used_bytes", "Estimated memory held by jobs and queues "
             "(INFO used_memory).", mem["used_memory"]),
            ("g", "memory_max_bytes", "maxmemory (0 = no limit).", view.maxmemory),
            ("g", "memory_rss_bytes", "Resident set size of the process.",
             mem["used_memory_rss"]),
            ("g", "connected_clients", "Client connections (RESP).",
             clients["connected_clients"]),
            ("g", "blocked_clients", "Clients blocked in GETJOB or waiting for job copies.",
             clients["blocked_clients"]),
            ("c", "connections_received", "Client connections accepted.",
             stats["total_connections_received"]),
            ("c", "connections_rejected", "Client connections refused (maxclients).",
             stats["rejected_connections"]),
            ("c", "net_input_bytes", "Bytes read from clients.", stats["total_net_input_bytes"]),
            ("c", "net_output_bytes", "Bytes written to clients.",
             stats["total_net_output_bytes"]),
        ):
            family = GaugeMetricFamily if kind == "g" else CounterMetricFamily
            yield family(f"disque_{name}", help_, value=value)

    def _commands(self) -> Iterator[Metric]:
        view = self.view
        calls = CounterMetricFamily("disque_commands", "Commands run, by command.",
                                    labels=["command"])
        secs = CounterMetricFamily("disque_commands_duration_seconds",
                                   "Time spent running each command.", labels=["command"])
        errors = CounterMetricFamily(
            "disque_command_errors",
            "Commands that answered an error: `failed` by the command itself, `rejected` "
            "before it ran (arity, NOAUTH, OOM, LOADING, MISCONF).",
            labels=["command", "kind"])
        for name, n, usec, failed, rejected in view.commands():
            calls.add_metric([name], n)
            secs.add_metric([name], usec / 1e6)
            errors.add_metric([name, "failed"], failed)
            errors.add_metric([name, "rejected"], rejected)
        yield calls
        yield secs
        yield errors
        yield CounterMetricFamily("disque_commands_processed",
                                  "Commands run (INFO total_commands_processed).",
                                  value=view.info()["Stats"]["total_commands_processed"])
        yield CounterMetricFamily("disque_unknown_commands", "Requests naming no command.",
                                  value=view.unknown_commands())

    # ------------------------------------------------------------------ jobs and queues
    def _jobs_and_queues(self) -> Iterator[Metric]:
        census = self.census
        jobs = GaugeMetricFamily("disque_jobs", "Jobs this node holds, by state.",
                                 labels=["state"])
        for state, n in census.by_state.items():
            jobs.add_metric([state], n)
        yield jobs
        yield GaugeMetricFamily("disque_census_age_seconds",
                                "Age of the registry census behind disque_jobs and "
                                "disque_queue_active_jobs.", value=self.view.census_age())
        table = self.table
        shown = table.queues
        yield GaugeMetricFamily("disque_queues", "Queue objects on this node.",
                                value=table.count)
        yield GaugeMetricFamily("disque_metrics_queues_omitted",
                                "Queues left out of the per-queue metrics by "
                                "metrics-max-queues.", value=table.count - len(shown))
        g = {k: GaugeMetricFamily(f"disque_queue_{k}", h, labels=["queue"]) for k, h in (
            ("length", "Jobs queued (QLEN)."),
            ("active_jobs", "Jobs of the queue delivered (or waiting to be requeued) and not "
                            "acked."),
            ("blocked_clients", "Clients blocked in GETJOB on the queue."),
            ("oldest_job_age_seconds", "Age of the oldest queued job (0 when empty)."),
            ("import_rate", "Jobs per second imported from other nodes (QSTAT import-rate)."),
        )}
        paused = GaugeMetricFamily("disque_queue_paused",
                                   "1 if the queue is paused in that direction.",
                                   labels=["queue", "direction"])
        c = {k: CounterMetricFamily(f"disque_queue_jobs_{k}", h, labels=["queue"])
             for k, h in (
            ("enqueued", "Jobs put into the queue (QSTAT jobs-in): added + requeued."),
            ("added", "Jobs queued on this node for the first time."),
            ("requeued", "Jobs queued again (RETRY timer, NACK, ENQUEUE)."),
            ("delivered", "Jobs taken out of the queue for consumers or other nodes "
                          "(QSTAT jobs-out)."),
            ("acked", "Jobs acknowledged here by ACKJOB or FASTACK."),
            ("nacked", "Jobs given back here by NACK."),
        )}
        for q in shown:
            label = [q["name"]]
            g["length"].add_metric(label, q["len"])
            g["active_jobs"].add_metric(label, q["active"])
            g["blocked_clients"].add_metric(label, q["blocked"])
            g["oldest_job_age_seconds"].add_metric(label, q["oldest_age"])
            g["import_rate"].add_metric(label, q["import-rate"])
            pause = q["pause"]
            paused.add_metric([q["name"], "in"], 1 if pause in ("in", "all") else 0)
            paused.add_metric([q["name"], "out"], 1 if pause in ("out", "all") else 0)
            c["enqueued"].add_metric(label, q["jobs-in"])
            c["added"].add_metric(label, q["added"])
            c["requeued"].add_metric(label, q["requeued"])
            c["delivered"].add_metric(label, q["jobs-out"])
            c["acked"].add_metric(label, q["acked"])
            c["nacked"].add_metric(label, q["nacked"])
        yield from g.values()
        yield paused
        yield from c.values()

    # ------------------------------------------------------------------ cluster
    def _cluster(self) -> Iterator[Metric]:
        view = self.view
        nodes = view.cluster_nodes()
        yield GaugeMetricFamily("disque_cluster_known_nodes", "Nodes in the node table.",
                                value=len(nodes))
        by_flag = GaugeMetricFamily("disque_cluster_nodes", "Known nodes, by flag.",
                                    labels=["flag"])
        counts: dict[str, int] = dict.fromkeys(
            ("myself", "fail?", "fail", "handshake", "noaddr", "leaving", "noflags"), 0)
        for n in nodes:
            for f in n["flags"]:
                counts[f] = counts.get(f, 0) + 1
        for f, count in counts.items():
            by_flag.add_metric([f], count)
        yield by_flag
        yield GaugeMetricFamily("disque_bus_links_up",
                                "Other nodes with a connected outbound bus link.",
                                value=sum(1 for n in nodes if n["link"] == "up"))
        sent = CounterMetricFamily("disque_bus_messages_sent", "Bus messages sent, by type.",
                                   labels=["type"])
        received = CounterMetricFamily("disque_bus_messages_received",
                                       "Bus messages received, by type.", labels=["type"])
        bsent = CounterMetricFamily("disque_bus_sent_bytes", "Bus bytes sent, by type.",
                                    labels=["type"])
        breceived = CounterMetricFamily("disque_bus_received_bytes",
                                        "Bus bytes received, by type.", labels=["type"])
        for name, (ms, mr, bs, br) in view.bus_messages().items():
            sent.add_metric([name], ms)
            received.add_metric([name], mr)
            bsent.add_metric([name], bs)
            breceived.add_metric([name], br)
        yield sent
        yield received
        yield bsent
        yield breceived

    def _copies(self) -> Iterator[Metric]:
        """Re-replication, repair and overflow (INFO's jobs section)."""
        jobs = self.view.info()["Jobs"]
        yield GaugeMetricFamily("disque_rereplication_pending",
                                "Copies sent again to restarted nodes, GOTJOB not back yet.",
                                value=jobs["rereplication_pending"])
        yield CounterMetricFamily("disque_jobs_rereplicated",
                                  "Copies restored on restarted nodes (confirmed).",
                                  value=jobs["rereplicated_jobs"])
        yield GaugeMetricFamily("disque_jobs_underreplicated",
                                "Jobs held here short of reachable copies, not repaired yet.",
                                value=jobs["underreplicated_jobs"])
        yield CounterMetricFamily("disque_jobs_repaired",
                                  "Copies made on new nodes for jobs short of a down holder "
                                  "(confirmed).", value=jobs["repaired_jobs"])
        yield GaugeMetricFamily("disque_overflow_jobs", "Jobs on disk (overflow), now.",
                                value=jobs["overflow_jobs"])
        yield GaugeMetricFamily("disque_overflow_bytes",
                                "Bytes of the jobs on disk (overflow), now.",
                                value=jobs["overflow_bytes"])
        yield GaugeMetricFamily("disque_overflow_file_bytes",
                                "Size of the overflow file.", value=jobs["overflow_file_bytes"])
        yield CounterMetricFamily("disque_overflow_written_jobs",
                                  "Jobs moved to disk since start.",
                                  value=jobs["overflow_written_jobs"])
        yield CounterMetricFamily("disque_overflow_read_jobs",
                                  "Jobs brought back from disk since start.",
                                  value=jobs["overflow_read_jobs"])
        yield GaugeMetricFamily("disque_overflow_full",
                                "1 while the overflow file or its disk is full.",
                                value=1 if jobs["overflow_status"] == "full" else 0)

    def _aof(self) -> Iterator[Metric]:
        aof = self.view.aof()
        yield GaugeMetricFamily("disque_aof_enabled", "1 if the AOF is on.",
                                value=1 if aof["enabled"] else 0)
        yield GaugeMetricFamily("disque_aof_size_bytes", "Current AOF size (0 when off).",
                                value=aof["size"])
        yield GaugeMetricFamily("disque_aof_fsync_lag_seconds",
                                "Age of the oldest AOF write not yet fsynced (0 when all "
                                "is on disk).", value=aof["fsync_lag"])
        yield GaugeMetricFamily("disque_aof_last_write_ok",
                                "0 while the AOF cannot be written (a full disk: new jobs are "
                                "refused with MISCONF), else 1.",
                                value=1 if aof["write_ok"] else 0)
        yield CounterMetricFamily("disque_aof_write_errors",
                                  "Failed AOF write or fsync attempts (each retry counts).",
                                  value=aof["write_errors"])


async def exposition(view: NodeView) -> bytes:
    """One scrape: the text format of a registry holding only this node's collector."""
    census = await view.census()
    table = await view.queue_table(view.metrics_max_queues, census.active_by_queue)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DisqueCollector(view, census, table))
    return generate_latest(registry)
