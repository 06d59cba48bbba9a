"""A real local Spark session and a real 3-node cluster, both shared by every Spark test of
the test process (modules use queue names of their own). Under pytest-xdist the Spark tests
all run on one worker (group "spark"), so the JVM starts once per run.

Spark's Python workers run PYSPARK_PYTHON, not the interpreter running pytest: without it
they would start the system `python3`, which has neither redis nor disque. The session also
puts the repository on the workers' PYTHONPATH so functions defined in test modules can be
unpickled there. `local[2,4]`: two task threads, and a failed task is tried up to 4 times (in
plain `local[2]` Spark gives up after the first failure, so no retry could be tested).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import Cluster
from tests.harness import REPO, DisqueProcess

SPARK_ENV = {
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in SPARK_ENV}
    os.environ.update(SPARK_ENV)
    session = (SparkSession.builder.master("local[2,4]").appName("disque-py-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.python.authenticate.socketTimeout", "120s")
               .config("spark.ui.showConsoleProgress", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def disque_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes meshed through the first one, shared by the module's tests."""
    base: Path = tmp_path_factory.mktemp("spark-cluster")
    procs = [DisqueProcess(base / f"node{i}", args=["--cluster-node-timeout", "3000",
                                                     "--maxmemory", "2gb"])
             for i in range(3)]
    try:
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_ready()
        c = Cluster(procs)
        c.meet_via_first()
        c.wait_mesh()
        yield c
    finally:
        for p in procs:
            p.kill()
