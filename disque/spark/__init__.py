"""PySpark integration: produce jobs from DataFrames, consume them as a stream.

    from disque.spark import write_jobs, register
    result = write_jobs(df, "emails", "h1:7711,h2:7711,h3:7711", body_col="payload")
    register(spark)                       # the `disque` data source
    df.write.format("disque").option("nodes", "h1:7711").option("queue", "q") \\
        .mode("append").save()
    spark.readStream.format("disque").option("nodes", "h1:7711").option("queues", "q").load()

Modules: `producer` (what runs on the executors: one client per partition, partition p on
node p mod N, ADDJOBS batches (pipelined ADDJOBs where a node lacks it) with DEDUP keys,
retries with backoff; no Spark import, unit-testable), `writer` (`write_jobs` over
`foreachPartition` with accumulators), `datasource` (the Python Data Source: Arrow batch
writer, at-least-once stream reader that ACKs only committed micro-batches).

Executors must be able to import `disque` and `redis` (see the README: install the package on
the workers, or ship `make spark-zip`'s dist/disque-py.zip with --py-files), and they run
PYSPARK_PYTHON, which must be a Python that has them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disque.spark.writer import WriteResult, write_jobs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["WriteResult", "register", "write_jobs"]


def register(spark: SparkSession) -> None:
    """Register the `disque` data source with this SparkSession (once per session)."""
    from disque.spark.datasource import DisqueDataSource

    spark.dataSource.register(DisqueDataSource)
