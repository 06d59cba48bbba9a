"""The per-job hot path compiled with mypyc (issue 21), and how to tell whether it is.

`HOT_MODULES` is the set the build compiles (setup.py reads it from here): the job and
queue classes, the registry, the timer wheel, the node state, the node and its cluster
subsystems, and the bus codec. The gain needs the callers compiled with the callees (a
compiled call into a compiled function skips the interpreter; an interpreted caller does
not), so the set grows by whole call chains, not by single modules.

Invariants: the source stays the program. A compiled module is one `.so` next to its `.py`
(an in-place build, as an editable install makes); all of them share one library, and
compiled modules call each other directly, not through the import system. So a `.so`
older than its `.py` would run old code without a word: `check_fresh` (called by
`disque/__init__.py` before any hot module is imported) refuses the compiled build as a
whole when any compiled module is older than its source, with a warning that says how to
rebuild, and the pure-Python modules are loaded instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
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
    "disque.cluster.records",
    "disque.cluster.replication",
    "disque.cluster.requeue",
    "disque.cluster.acks",
    "disque.cluster.federation",
    "disque.cluster.deadletters",
    "disque.cluster.rereplication",
    "disque.cluster.repair",
)

_PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__))
_EXT: Final = importlib.machinery.EXTENSION_SUFFIXES[0]  # .cpython-311-x86_64-linux-gnu.so

# Set by check_fresh: why the compiled build was refused ("" when it was not).
refused = ""


def _paths(module: str) -> tuple[str, str]:
    """The module's source and the path its compiled form would have (in place)."""
    base = os.path.join(os.path.dirname(_PACKAGE_DIR), *module.split("."))
    return base + ".py", base + _EXT


def stale_modules(modules: Sequence[str] = HOT_MODULES) -> list[str]:
    """The modules whose compiled form exists and is older than their source."""
    out = []
    for name in modules:
        src, ext = _paths(name)
        try:
            if os.stat(ext).st_mtime < os.stat(src).st_mtime:
                out.append(name)
        except FileNotFoundError:
            continue
    return out


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Loads the hot modules from their `.py` even where a `.so` sits beside it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in HOT_MODULES:
            return None
        src, _ = _paths(fullname)
        loader = importlib.machinery.SourceFileLoader(fullname, src)
        return importlib.util.spec_from_file_location(fullname, src, loader=loader)


def check_fresh() -> None:
    """Refuse the compiled build if any compiled module is older than its source, or if
    DISQUE_NO_COMPILE=1 asks for pure Python: then every hot module loads from source."""
    global refused
    if os.environ.get("DISQUE_NO_COMPILE") == "1":
        refused = "DISQUE_NO_COMPILE=1"
    else:
        stale = stale_modules()
        if not stale:
            return
        refused = "compiled modules older than their source: " + ", ".join(stale)
        warnings.warn(f"disque: {refused}; running pure Python (rebuild with `make install`)",
                      RuntimeWarning, stacklevel=2)
    if not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


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
