"""Executors that do not have disque-py: `make spark-zip`'s zip shipped with
spark.submit.pyFiles is all they need. The Spark job runs in a subprocess whose workers use
the system `python3` (no redis, no disque) from a directory outside the repository, so every
import on the executors must come from the zip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from disque.client import Client
from disque.spark import package
from tests.cluster.conftest import Cluster

# (a Spark job on a loaded 2-core machine can outlast the suite's 120 s; a timeout in the
# middle of a py4j call breaks the shared session for every Spark test after it)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

JOB = '''
import sys
from pyspark.sql import SparkSession
from disque.spark import write_jobs

zip_path, nodes = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.submit.pyFiles", zip_path)
         .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

def where(_):
    import sys
    import disque.client
    import redis
    yield (disque.client.__file__, redis.__file__, sys.executable)

print("WHERE", spark.sparkContext.parallelize([1], 1).mapPartitions(where).collect()[0])
df = spark.range(0, 3000, 1, 3).selectExpr("concat('z-', cast(id as string)) as body")
result = write_jobs(df, "zipped", nodes, replicate=1)
print("RESULT", result.added, result.failed)
spark.stop()
'''


def system_python() -> str | None:
    """A python3 of the driver's minor version that lacks redis (what a bare worker has)."""
    exe = shutil.which("python3", path="/usr/bin:/bin")
    if exe is None:
        return None
    probe = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2]); import redis"],
                           capture_output=True, text=True, cwd="/")
    if probe.stdout.strip() != str(sys.version_info[:2]) or probe.returncode == 0:
        return None
    return exe


def test_executors_import_everything_from_the_zip(disque_cluster: Cluster, tmp_path: Path):
    worker_python = system_python()
    if worker_python is None:
        pytest.skip("needs a system python3 of the same minor version, without redis")
    zip_path = tmp_path / "disque-py.zip"
    assert package.build(zip_path)[:2] == ["disque", "redis"]
    script = tmp_path / "job.py"
    script.write_text(JOB)
    nodes = ",".join(f"127.0.0.1:{p.port}" for p in disque_cluster)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSPARK_PYTHON=worker_python, PYSPARK_DRIVER_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, str(script), str(zip_path), nodes], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    where = next(line for line in out.stdout.splitlines() if line.startswith("WHERE"))
    assert where.count("disque-py.zip") == 2 and worker_python in where, where
    assert "RESULT 3000 0" in out.stdout
    total = 0
    for p in disque_cluster:
        with Client([f"127.0.0.1:{p.port}"], discover=False) as c:
            total += c.qlen("zipped")
    assert total == 3000
