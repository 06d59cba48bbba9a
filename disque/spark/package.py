"""Build the zip Spark ships to executors that do not have disque-py installed:

    python -m disque.spark.package --out dist/disque-py.zip      # (make spark-zip)
    spark-submit --py-files dist/disque-py.zip my_job.py
    # or: .config("spark.submit.pyFiles", "dist/disque-py.zip"), or sc.addPyFile(...)

It holds what the executors import: `disque/__init__.py`, `disque/client`, `disque/spark`,
the consume policy and drivers `Client.consume` runs (`disque/worker`'s core, driver,
threads and aio modules; not `disque-worker`'s command line, which needs structlog),
`disque/protocol/values.py` (RESP values as text), and (unless `--no-redis`) redis-py, which is pure Python, with async-timeout (redis-py needs
it on Python < 3.11.3). hiredis is a C extension and cannot
be shipped in a zip: where the workers have it installed, redis-py and the client use it
(several times faster packing and parsing); without it they fall back to pure Python.
The server itself is not included: executors never run it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import zipfile
from pathlib import Path

PACKAGES = ("disque/client", "disque/spark")
MODULES = ("disque/compiled.py",  # disque/__init__.py imports it (the build check)
           "disque/worker/__init__.py", "disque/worker/core.py", "disque/worker/driver.py",
           "disque/worker/threads.py", "disque/worker/aio.py",
           # RESP values as text, shared by the client and the node's HTTP side
           "disque/protocol/__init__.py", "disque/protocol/values.py")


def _add_tree(zf: zipfile.ZipFile, root: Path, base: Path) -> int:
    n = 0
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        zf.write(path, path.relative_to(base).as_posix())
        n += 1
    return n


def build(out: Path, with_redis: bool = True) -> list[str]:
    """Write the zip; returns the top-level packages it contains."""
    import disque

    disque_dir = Path(disque.__file__).resolve().parent
    base = disque_dir.parent
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    contents = ["disque"]
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(disque_dir / "__init__.py", "disque/__init__.py")
        for pkg in PACKAGES:
            _add_tree(zf, base / pkg, base)
        for module in MODULES:
            zf.write(base / module, module)
        if with_redis:
            spec = importlib.util.find_spec("redis")
            if spec is None or spec.origin is None:
                raise SystemExit("redis-py is not installed here: pip install redis")
            redis_dir = Path(spec.origin).parent
            _add_tree(zf, redis_dir, redis_dir.parent)
            contents.append("redis")
            # redis-py imports it on Python < 3.11.3 (the workers' Python may be older)
            extra = importlib.util.find_spec("async_timeout")
            if extra is not None and extra.origin is not None:
                extra_dir = Path(extra.origin).parent
                _add_tree(zf, extra_dir, extra_dir.parent)
                contents.append("async_timeout")
    os.replace(tmp, out)
    return contents


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m disque.spark.package", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="dist/disque-py.zip", help="zip to write")
    ap.add_argument("--no-redis", action="store_true",
                    help="leave redis-py out (the workers have it installed)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    contents = build(out, with_redis=not a.no_redis)
    print(f"{out}: {', '.join(contents)} ({out.stat().st_size // 1024} KiB); ship it with "
          f"--py-files {out} or spark.submit.pyFiles")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
