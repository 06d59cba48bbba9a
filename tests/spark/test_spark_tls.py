"""Spark over TLS (issue 23): write_jobs to a `disque+tls://` URL with the CA in
client_options, and the data source's `tls*` options, both ways, against a real TLS-only
node, from the real local Spark session of the other Spark tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disque.client import Client
from disque.spark import WriteResult, register, write_jobs
from tests.harness import DisqueProcess, free_port, wait_for
from tests.tlscerts import Pki, make_pki, tls_only_args

ROWS = 300


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pki, int]]:
    where = tmp_path_factory.mktemp("spark-tls")
    pki = make_pki(where / "pki")
    port = free_port()
    node = DisqueProcess(where / "node",
                         args=tls_only_args(pki, port, "--tls-auth-clients", "optional"))
    node.start(wait=False)

    def up() -> bool:
        try:
            with Client(f"disque+tls://127.0.0.1:{port}", ssl_ca_certs=str(pki.ca),
                        discover=False) as c:
                return c.execute_command("PING") in (b"PONG", "PONG", True)
        except Exception:
            return False

    wait_for(up, what="the TLS-only node")
    try:
        yield pki, port
    finally:
        node.stop()


def drain(pki: Pki, port: int, queue: str) -> list[bytes]:
    out: list[bytes] = []
    with Client(f"disque+tls://127.0.0.1:{port}", ssl_ca_certs=str(pki.ca)) as c:
        while jobs := c.get_job(queue, nohang=True, count=1000):
            out += [j.body for j in jobs]
            c.ack_job(*[j.id for j in jobs])
    return out


def test_write_jobs_and_the_data_source_over_tls(spark: Any, tls_node: tuple[Pki, int]
                                                 ) -> None:
    pki, port = tls_node
    df = spark.createDataFrame([(f"tls{i}",) for i in range(ROWS)], "body string").repartition(3)
    result = write_jobs(df, "sparktls", f"disque+tls://127.0.0.1:{port}", replicate=1,
                        client_options={"ssl_ca_certs": str(pki.ca)})
    assert result == WriteResult(added=ROWS, failed=0)
    assert Counter(drain(pki, port, "sparktls")) == Counter(
        f"tls{i}".encode() for i in range(ROWS))
    register(spark)
    (df.write.format("disque").option("nodes", f"127.0.0.1:{port}").option("queue", "dstls")
     .option("tls", "true").option("tlsCaCertFile", str(pki.ca))
     .option("tlsCertFile", str(pki.client_crt)).option("tlsKeyFile", str(pki.client_key))
     .option("replicate", "1").mode("append").save())
    assert Counter(drain(pki, port, "dstls")) == Counter(f"tls{i}".encode() for i in range(ROWS))


def test_the_streaming_reader_over_tls(spark: Any, tls_node: tuple[Pki, int],
                                       tmp_path: Path) -> None:
    pki, port = tls_node
    with Client(f"disque+tls://127.0.0.1:{port}", ssl_ca_certs=str(pki.ca)) as c:
        for i in range(50):
            c.add_job("readtls", f"r{i}", retry=60)
    register(spark)
    stream = (spark.readStream.format("disque").option("nodes", f"disque+tls://127.0.0.1:{port}")
              .option("queues", "readtls").option("tlsCaCertFile", str(pki.ca))
              .option("bodyType", "string").load())
    query = (stream.writeStream.format("memory").queryName("readtls")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        wait_for(lambda: spark.sql("select count(*) from readtls").collect()[0][0] >= 50,
                 timeout=60, what="50 jobs read over TLS")
    finally:
        query.stop()
    bodies = sorted(r[0] for r in spark.sql("select body from readtls").collect())
    assert bodies == sorted(f"r{i}" for i in range(50))
