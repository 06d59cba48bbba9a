"""A small, real pipeline: Spark generates and transforms a data set, produces one job per
row into a local 3-node disque-py cluster, and workers consume, process and ACK the jobs.

    make example                        # or: .venv/bin/python examples/spark_pipeline.py
    .venv/bin/python examples/spark_pipeline.py --rows 100000 --keep

1. Start a 3-node cluster on free ports in a temporary directory (`python -m
   disque.tools.cluster start`, or plain `python -m disque` processes and CLUSTER MEET when
   that tool is not there).
2. Spark (local[2]) generates orders, keeps the ones worth invoicing, joins the VAT rate of
   their country and computes the invoice total.
3. `write_jobs` produces one JSON job per invoice (REPLICATE 2, the order id as DEDUP key so
   a retried Spark task adds nothing twice), and the `disque` data source writes one summary
   job per country to a second queue.
4. Three workers (one per node, `Client.consume`) take the invoice jobs, "send" them (sum
   the totals), ACK them; the report compares what they saw with Spark's own aggregate.

Spark's Python workers run PYSPARK_PYTHON; it is set to this interpreter, which has redis-py
and disque installed. On a real cluster, see the README ("Spark").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from disque.client import Client, Job
from disque.spark import register, write_jobs

VAT = {"FR": 0.20, "DE": 0.19, "IT": 0.22, "ES": 0.21, "NL": 0.21}


# ---------------------------------------------------------------------------- the cluster
def free_base_port(count: int = 3, start: int = 7811) -> int:
    """First port p >= start with p..p+count-1 and their bus ports (+10000) free."""
    for base in range(start, 55000 - count):
        ports = [p + k for p in range(base, base + count) for k in (0, 10000)]
        try:
            socks = []
            for port in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no free ports")


class LocalCluster:
    """Three nodes in `workdir`, stopped by `stop()`."""

    def __init__(self, workdir: Path, base: int, size: int = 3) -> None:
        self.workdir = workdir
        self.ports = list(range(base, base + size))
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def start(self) -> None:
        try:
            import disque.tools.cluster  # noqa: F401 - the development tool, if present
        except ImportError:
            self._start_processes()
            return
        subprocess.run([sys.executable, "-m", "disque.tools.cluster", "start", "--nodes",
                        str(len(self.ports)), "--port", str(self.ports[0]), "--dir",
                        str(self.workdir), "--timeout", "5000"], check=True,
                       stdout=subprocess.DEVNULL)
        self.tool = True

    def _start_processes(self) -> None:
        self.tool = False
        for port in self.ports:
            d = self.workdir / f"node-{port}"
            d.mkdir(parents=True, exist_ok=True)
            with open(d / "log.txt", "ab") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "disque", "--port", str(port), "--dir", str(d),
                     "--cluster-node-timeout", "5000"], stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        for addr in self.nodes:
            while True:
                try:
                    Client([addr], discover=False).ping()
                    break
                except ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        first = Client([self.nodes[0]], discover=False)
        for port in self.ports[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        while len(Client([self.nodes[0]]).hello().nodes) < len(self.ports) or not all(
                Client([a], discover=False).info("cluster")["cluster_reachable_nodes"]
                == len(self.ports) - 1 for a in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not form a cluster")
            time.sleep(0.1)

    def stop(self) -> None:
        if getattr(self, "tool", False):
            subprocess.run([sys.executable, "-m", "disque.tools.cluster", "stop", "--dir",
                            str(self.workdir)], stdout=subprocess.DEVNULL, check=False)
        for p in self.procs:
            p.terminate()
            p.wait(timeout=20)


# ---------------------------------------------------------------------------- the Spark job
def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("disque-spark-pipeline")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "6")
             # a loaded machine can be slow to connect to the driver's local sockets
             .config("spark.python.authenticate.socketTimeout", "120s")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def invoices(spark: Any, rows: int) -> Any:
    """Generated orders -> the ones worth invoicing, with their country's VAT."""
    from pyspark.sql import functions as F

    countries = F.array(*[F.lit(c) for c in VAT])
    orders = spark.range(0, rows, 1, 6).select(
        F.col("id").alias("order_id"),
        F.concat(F.lit("customer-"), (F.col("id") % 997).cast("string")).alias("customer"),
        F.element_at(countries, (F.col("id") % len(VAT) + 1).cast("int")).alias("country"),
        F.round(F.rand(seed=7) * 200, 2).alias("amount"),
        (F.col("id") % 5 + 1).alias("quantity"))
    rates = spark.createDataFrame(list(VAT.items()), "country string, vat double")
    return (orders.filter(F.col("amount") >= 5.0)
            .join(F.broadcast(rates), "country")
            .withColumn("total", F.round(F.col("amount") * F.col("quantity")
                                         * (1 + F.col("vat")), 2))
            .select("order_id", "customer", "country", "quantity", "amount", "vat", "total"))


# ---------------------------------------------------------------------------- the workers
class Books:
    """What the workers did, per country (the handler runs in several threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: dict[str, int] = defaultdict(int)
        self.total: dict[str, float] = defaultdict(float)
        self.orders: set[int] = set()

    def handle(self, job: Job) -> None:
        invoice = json.loads(job.body)
        with self.lock:
            if invoice["order_id"] in self.orders:  # a redelivery: already "sent"
                return
            self.orders.add(invoice["order_id"])
            self.count[invoice["country"]] += 1
            self.total[invoice["country"]] += invoice["total"]


def consume_all(nodes: list[str], expected: int, books: Books) -> int:
    """One worker per node (each consumes where its jobs were produced); stop when done."""
    stop = threading.Event()
    acked = [0] * len(nodes)

    def worker(i: int, addr: str) -> None:
        with Client([addr], discover=False) as c:
            stats = c.consume("invoices", books.handle, concurrency=2, count=50, poll_ms=200,
                              stop_event=stop, handle_signals=False, follow_producers=False)
            acked[i] = stats.acked

    threads = [threading.Thread(target=worker, args=(i, a)) for i, a in enumerate(nodes)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    while len(books.orders) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join()
    return sum(acked)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=30000, help="orders to generate")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="disque-example-"))
    cluster = LocalCluster(workdir, free_base_port())
    cluster.start()
    nodes = cluster.nodes
    print(f"cluster: {', '.join(nodes)} ({workdir})")
    spark = None
    try:
        spark = spark_session()
        register(spark)
        df = invoices(spark, a.rows).cache()
        n = df.count()
        from pyspark.sql import functions as F

        truth = {r["country"]: (r["n"], r["total"]) for r in df.groupBy("country").agg(
            F.count("*").alias("n"), F.sum("total").alias("total")).collect()}
        print(f"spark: {a.rows} orders generated, {n} to invoice")

        t = time.monotonic()
        result = write_jobs(df, "invoices", nodes, body_format="json",
                            dedup_key_col="order_id", replicate=2, retry=120)
        print(f"write_jobs: {result.added} invoice jobs added, {result.failed} failed "
              f"({result.added / (time.monotonic() - t):,.0f} rows/s)")

        summary = spark.createDataFrame(
            [(c, int(cnt), float(tot)) for c, (cnt, tot) in sorted(truth.items())],
            "country string, invoices long, total double")
        (summary.coalesce(1).write.format("disque").option("nodes", ",".join(nodes))
         .option("queue", "reports").option("bodyFormat", "json").mode("append").save())

        books = Books()
        t = time.monotonic()
        acked = consume_all(nodes, result.added, books)
        print(f"workers: {len(books.orders)} invoices processed, {acked} jobs acked "
              f"({acked / (time.monotonic() - t):,.0f} jobs/s)")

        reports: list[Job] = []
        for addr in nodes:  # the summary jobs are queued where they were produced
            with Client([addr], discover=False) as c:
                jobs = c.get_job("reports", nohang=True, count=100)
                c.ack_job(*[j.id for j in jobs])
                reports += jobs
        print(f"\n{'country':<8} {'spark':>7} {'workers':>8} {'spark total':>14} "
              f"{'workers total':>14}")
        ok = len(books.orders) == n
        for country in sorted(truth):
            cnt, tot = truth[country]
            ok &= books.count[country] == cnt and abs(books.total[country] - tot) < 0.01
            print(f"{country:<8} {cnt:>7} {books.count[country]:>8} {tot:>14,.2f} "
                  f"{books.total[country]:>14,.2f}")
        print(f"\n{len(reports)} summary job(s) in 'reports' (from the data source), e.g. "
              f"{reports[0].body.decode() if reports else '-'}")
        print(f"{'OK' if ok else 'MISMATCH'}: every invoice produced once and processed once "
              f"({time.monotonic() - t0:.0f}s)")
        return 0 if ok else 1
    finally:
        if spark is not None:
            spark.stop()
        if a.keep:
            print(f"cluster left running: python -m disque.tools.cluster stop --dir {workdir}")
        else:
            cluster.stop()
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
