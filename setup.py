"""The build hook of disque-py: the per-job hot path compiled with mypyc (issue 21).

Everything else about the package is in pyproject.toml; this file only adds the extension
modules. The set compiled is `disque.compiled.HOT_MODULES`; the mypy that compiles it is
the one pinned in pyproject.toml's [build-system] (a different mypyc may generate different
code, as a different mypy finds different errors).

- DISQUE_NO_COMPILE=1: no extension modules, the pure-Python package.
- A failed compile (no C compiler, no Python headers, a mypyc error) warns and leaves the
  pure-Python package, unless DISQUE_REQUIRE_COMPILED=1 (CI: a run must prove the compiled
  build), which fails the install.
- The build records a hash of each source it compiled (disque/_compiled.json, written once
  the whole build succeeded); at import,
  a source that differs from its compiled form refuses the whole compiled build (see
  disque/compiled.py), so an editable install never runs a stale `.so` silently.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
NO_COMPILE = os.environ.get("DISQUE_NO_COMPILE") == "1"
REQUIRE = os.environ.get("DISQUE_REQUIRE_COMPILED") == "1"


def _compiled_module() -> Any:
    """disque/compiled.py on its own (stdlib only): the package's dependencies are not in
    the build environment."""
    spec = importlib.util.spec_from_file_location(
        "_disque_compiled", os.path.join(HERE, "disque", "compiled.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _warn(what: str, error: BaseException) -> None:
    print(f"disque: {what} ({type(error).__name__}: {error}); installing pure Python "
          "(DISQUE_REQUIRE_COMPILED=1 makes this an error)", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext whose failure falls back to pure Python, unless DISQUE_REQUIRE_COMPILED:
    one warning, the record removed (so any `.so` left behind is refused at import)."""

    failed = False

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # compiler missing or failing: the package still works
            if REQUIRE:
                raise
            self._fail("compiling the hot path failed", e)
        if not self.failed and os.path.exists(PENDING):
            os.replace(PENDING, RECORD)  # the build is whole: its record takes effect

    def build_extension(self, ext: Any) -> None:
        if self.failed:
            return
        try:
            super().build_extension(ext)
        except Exception as e:
            if REQUIRE:
                raise
            self._fail(f"compiling {ext.name} failed", e)

    def _fail(self, what: str, error: BaseException) -> None:
        if not self.failed:
            self.failed = True
            _warn(what, error)
        _remove_record()


COMPILED = _compiled_module()
RECORD = COMPILED.RECORD
PENDING = RECORD + ".pending"


def _remove_record() -> None:
    for path in (RECORD, PENDING):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _ext_modules() -> list[Any]:
    if NO_COMPILE:
        _remove_record()
        return []
    compiled = COMPILED
    paths = [os.path.join(*m.split(".")) + ".py" for m in compiled.HOT_MODULES]
    try:
        from mypyc.build import mypycify

        # The record names the sources as they are now, when compiled; it takes effect
        # (PENDING -> RECORD) only once every module is built: a build stopped half-way
        # leaves no record, so its modules are refused, not run beside a record that
        # vouches for sources they were not compiled from.
        _remove_record()
        for module in compiled.orphan_modules():  # taken out of the hot set since
            os.remove(compiled.module_paths(module)[1])
        compiled.write_record(path=PENDING)
        extensions = list(mypycify(paths, opt_level="3", group_name=compiled.GROUP))
        if os.name == "posix":
            # gcc's -Wmisleading-indentation (part of -Wall, in Python's CFLAGS) spent 44 s
            # of a 130 s build parsing the one 18 MB C file of the group; the generated
            # code's indentation is not ours to warn about
            for ext in extensions:
                ext.extra_compile_args.append("-Wno-misleading-indentation")
        return extensions
    except Exception as e:  # mypy missing, or the hot set no longer compiles
        if REQUIRE:
            raise
        _warn("mypyc could not translate the hot path", e)
        _remove_record()
        return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
