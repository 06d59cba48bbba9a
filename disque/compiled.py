"""The per-job hot path compiled with mypyc (issue 21), and how to tell whether it is.

`HOT_MODULES` is the set the build compiles (setup.py reads it from here): the job and
queue classes, the registry, the timer wheel, the node state, the node and its cluster
subsystems, the bus (codec and links), and the request path (RESP, connection, dispatch). The gain needs the callers compiled with the callees (a
compiled call into a compiled function skips the interpreter; an interpreted caller does
not), so the set grows by whole call chains, not by single modules.

Invariants: the source stays the program. A compiled module is one `.so` next to its `.py`
(an in-place build, as an editable install makes); the code of all of them is in one shared
library, and compiled modules call each other directly, not through the import system. So
a build older than any of its sources would run old code without a word: `check_fresh`
(called by `disque/__init__.py` before any hot module is imported) refuses the compiled
build as a whole when a source differs from the one compiled, with a warning that says how
to rebuild, and the pure-Python modules are loaded instead. The build records a hash of
each source it compiled (`write_record`, in `_compiled.json` beside this module): file
times do not tell (a rebuild leaves a module's small `.so` untouched when only the shared
library changed; a checkout sets a file's time to now), contents do.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from hashlib import sha256
from types import ModuleType
from typing import Final

HOT_MODULES: Final = (
    "disque.scan",
    "disque.timers",
    "disque.jobs.job",
    "disque.jobs.ids",
    "disque.jobs.states",
    "disque.queues.ordered",
    "disque.queues.queue",
    "disque.queues.waiting",
    "disque.state",
    "disque.node",
    "disque.memory",
    "disque.cluster.messages",
    "disque.cluster.effects",
    "disque.cluster.nodes",
    "disque.cluster.membership",
    "disque.cluster.records",
    "disque.cluster.replication",
    "disque.cluster.requeue",
    "disque.cluster.acks",
    "disque.cluster.federation",
    "disque.cluster.deadletters",
    "disque.cluster.rereplication",
    "disque.cluster.repair",
    # the bus: links, framing and flushing (per message on the cluster rows)
    "disque.cluster.bus",
    # the request path: RESP reader and replies, the client connection, the dispatcher,
    # the command table (read on every request) and the job and queue commands (in process,
    # benchmarks.dispatch: ADDJOB x16 3.72 -> 2.97 us, GETJOB NOHANG x16 2.26 -> 1.64).
    # Not the admin commands: none is per job (PING x16 0.75 -> 0.68 us compiled), and
    # their unit tests run them against a stand-in server that compiled code would refuse
    "disque.protocol.errors",
    "disque.protocol.reader",
    "disque.protocol.reply",
    "disque.connection",
    "disque.dispatch",
    "disque.commands.registry",
    "disque.commands.basic",
    "disque.commands.addjob",
    "disque.commands.jobs",
    "disque.commands.queues",
    # the loop's per-iteration work: bus routing and delivery, deferred replies, the loop
    # timer, the clock (interpreted in server.py, several calls per job)
    "disque.iteration",
    # overflow to disk: the spill (rows built, jobs forgotten), a job's row data, and the
    # store's per-job work around SQLite (a segment's columns, the places of jobs taken by
    # ID) while a backlog overflows or drains
    "disque.overflow.record",
    "disque.overflow.spill",
    "disque.overflow.store",
)

# mypyc's group: the shared library of the compiled code, disque/_hot__mypyc*.so (in the
# package, where an editable install finds it from any directory)
GROUP: Final = "disque._hot"

_PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__))
_EXT: Final = importlib.machinery.EXTENSION_SUFFIXES[0]  # .cpython-311-x86_64-linux-gnu.so
RECORD: Final = os.path.join(_PACKAGE_DIR, "_compiled.json")

# Set by check_fresh: why the compiled build was refused ("" when it was not).
refused = ""


def module_paths(module: str) -> tuple[str, str]:
    """The module's source and the path its compiled form would have (in place)."""
    base = os.path.join(os.path.dirname(_PACKAGE_DIR), *module.split("."))
    return base + ".py", base + _EXT


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return sha256(f.read()).hexdigest()


def write_record(modules: Sequence[str] = HOT_MODULES, path: str = RECORD) -> None:
    """Called by the build before it compiles: the hash of each source it compiles (setup.py
    writes it aside and moves it to RECORD when the build succeeded)."""
    record = {name: _digest(module_paths(name)[0]) for name in modules}
    with open(path, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)


def stale_modules(modules: Sequence[str] = HOT_MODULES) -> list[str]:
    """The modules compiled in place whose source is not the one compiled (all of them
    when the build left no record)."""
    compiled = [name for name in modules if os.path.exists(module_paths(name)[1])]
    if not compiled:
        return []
    try:
        with open(RECORD) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return compiled
    return [name for name in compiled if record.get(name) != _digest(module_paths(name)[0])]


def orphan_modules() -> list[str]:
    """Modules with a compiled form in place that the hot set no longer names (a module
    taken out of HOT_MODULES leaves its `.so`, which Python would import before the `.py`)."""
    root = os.path.dirname(_PACKAGE_DIR)
    shared = GROUP + "__mypyc"
    out = []
    for dirpath, _dirs, files in os.walk(_PACKAGE_DIR):
        for name in files:
            if name.endswith(_EXT):
                rel = os.path.relpath(os.path.join(dirpath, name[:-len(_EXT)]), root)
                module = rel.replace(os.sep, ".")
                if module not in HOT_MODULES and module != shared:
                    out.append(module)
    return sorted(out)


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Loads `modules` from their `.py` even where a `.so` sits beside it."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = frozenset(modules)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        src, _ = module_paths(fullname)
        loader = importlib.machinery.SourceFileLoader(fullname, src)
        return importlib.util.spec_from_file_location(fullname, src, loader=loader)


def check_fresh() -> None:
    """Refuse the compiled build if a compiled module's source changed since the build, or
    if DISQUE_NO_COMPILE=1 asks for pure Python: then every hot module loads from source.
    DISQUE_REQUIRE_COMPILED=1 (CI) makes a stale or missing compiled build an ImportError."""
    global refused
    from_source = orphan_modules()
    if from_source:  # never run; `make compile` (setup.py) deletes them
        warnings.warn("disque: compiled modules outside the hot set, ignored: "
                      + ", ".join(from_source), RuntimeWarning, stacklevel=2)
    if os.environ.get("DISQUE_NO_COMPILE") == "1":
        refused = "DISQUE_NO_COMPILE=1"
    else:
        stale = stale_modules()
        if os.environ.get("DISQUE_REQUIRE_COMPILED") == "1":
            # only where the sources are: the client zip Spark ships (disque.spark.package)
            # has none of the hot modules, compiled or not
            missing = []
            for m in HOT_MODULES:
                src, so = module_paths(m)
                if os.path.exists(src) and not os.path.exists(so):
                    missing.append(m)
            if stale or missing:
                raise ImportError("disque: DISQUE_REQUIRE_COMPILED=1 but the compiled build is "
                                  f"stale ({', '.join(stale) or '-'}) or missing "
                                  f"({', '.join(missing) or '-'}): run `make compile`")
        if stale:
            refused = "compiled modules whose source changed since: " + ", ".join(stale)
            warnings.warn(f"disque: {refused}; running pure Python (rebuild with `make "
                          "install`)", RuntimeWarning, stacklevel=2)
    if refused:
        from_source += HOT_MODULES
    if from_source and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst(from_source))


def is_compiled(module: str) -> bool:
    """Whether `module` is (or, imported now, would be) loaded compiled."""
    mod = sys.modules.get(module)
    if mod is not None:
        origin = getattr(mod, "__file__", None) or ""
    else:
        spec = importlib.util.find_spec(module)
        origin = (spec.origin or "") if spec is not None else ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def compiled_modules() -> list[str]:
    """The hot modules that run compiled (for INFO, --version and the start log)."""
    return [m for m in HOT_MODULES if is_compiled(m)]


def summary() -> tuple[str, int]:
    """("yes" or "no", how many hot modules run compiled): for INFO server, --version and
    the start log line."""
    n = len(compiled_modules())
    return ("yes" if n else "no"), n
