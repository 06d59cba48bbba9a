"""Which build runs, compiled or pure Python, and that a stale compiled module never runs
(issue 21; disque/compiled.py). The refusal cases run `python` on a copy of the package,
built as this checkout is, with one source edited after the build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import disque
from disque import compiled
from tests.harness import DisqueProcess
from tests.integration.resp import Conn, info

REPO = Path(disque.__file__).resolve().parent.parent
HOT = list(compiled.HOT_MODULES)
ENV_FLAGS = ("DISQUE_NO_COMPILE", "DISQUE_REQUIRE_COMPILED")

PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import disque.node, disque.timers
from disque import compiled
print(json.dumps({"compiled": compiled.compiled_modules(), "refused": compiled.refused,
                  "edited": hasattr(disque.timers, "EDITED_AFTER_THE_BUILD"),
                  "warnings": [str(w.message) for w in caught]}))
"""


def run_in(tree: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ENV_FLAGS and k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tree, env={**clean, "PYTHONPATH": str(tree), **env}, timeout=60)


def probe(tree: Path, **env: str) -> dict:
    out = run_in(tree, PROBE, **env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def built_copy(tmp_path: Path) -> Path:
    """The package as this checkout has it (with its compiled modules and their shared
    library, disque/_hot__mypyc*.so), in a directory of its own."""
    if not compiled.compiled_modules():
        pytest.skip("this checkout runs pure Python: no compiled build to refuse "
                    "(CI runs this file on the compiled build)")
    shutil.copytree(REPO / "disque", tmp_path / "disque",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_this_run_has_the_build_its_environment_asks_for() -> None:
    running = compiled.compiled_modules()
    if os.environ.get("DISQUE_REQUIRE_COMPILED") == "1":
        assert running == HOT, "CI must test the compiled build, every hot module of it"
    elif os.environ.get("DISQUE_NO_COMPILE") == "1":
        assert running == []
    else:  # never a mix: the build is used whole or refused whole
        assert running in ([], HOT)


def test_a_fresh_build_runs_compiled(built_copy: Path) -> None:
    got = probe(built_copy)
    assert got["compiled"] == HOT
    assert got["refused"] == "" and got["warnings"] == []


def test_a_source_edited_after_the_build_refuses_the_compiled_build_and_runs(
        built_copy: Path) -> None:
    timers = built_copy / "disque" / "timers.py"
    timers.write_text(timers.read_text() + "\nEDITED_AFTER_THE_BUILD = 1\n")
    got = probe(built_copy)
    assert got["compiled"] == []       # as a whole: the others call it directly
    assert got["edited"]               # the edited source is what runs
    assert "disque.timers" in got["refused"]
    assert any("make install" in w for w in got["warnings"]), got["warnings"]

    required = run_in(built_copy, PROBE, DISQUE_REQUIRE_COMPILED="1")
    assert required.returncode != 0
    assert "DISQUE_REQUIRE_COMPILED=1 but the compiled build is stale (disque.timers)" in \
        required.stderr


def test_a_build_without_its_record_is_refused(built_copy: Path) -> None:
    # (a build stopped half-way leaves no record: setup.py writes it once all is built)
    (built_copy / "disque" / "_compiled.json").unlink()
    got = probe(built_copy)
    assert got["compiled"] == []
    assert all(m in got["refused"] for m in HOT)


def test_disque_no_compile_runs_pure_python_beside_a_compiled_build(built_copy: Path) -> None:
    got = probe(built_copy, DISQUE_NO_COMPILE="1")
    assert got["compiled"] == [] and got["refused"] == "DISQUE_NO_COMPILE=1"


def test_version_says_which_build(built_copy: Path) -> None:
    version = "import sys; from disque.process import main; sys.argv = ['disque-server', " \
              "'--version']; main()"
    assert f"compiled=yes ({len(HOT)}/{len(HOT)} hot modules)" in run_in(built_copy, version).stdout
    assert f"compiled=no (0/{len(HOT)} hot modules)" in run_in(
        built_copy, version, DISQUE_NO_COMPILE="1").stdout


def test_the_client_alone_imports_under_require_compiled(tmp_path: Path) -> None:
    # the zip Spark ships to executors holds the client, not the hot modules
    for rel in ("__init__.py", "compiled.py"):
        (tmp_path / "disque").mkdir(exist_ok=True)
        shutil.copy2(REPO / "disque" / rel, tmp_path / "disque" / rel)
    shutil.copytree(REPO / "disque" / "client", tmp_path / "disque" / "client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "disque" / "protocol", tmp_path / "disque" / "protocol",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for hot in HOT:  # (protocol's hot modules are not in the zip either)
        (tmp_path / (hot.replace(".", "/") + ".py")).unlink(missing_ok=True)
    out = run_in(tmp_path, "import disque.client; print('ok')", DISQUE_REQUIRE_COMPILED="1")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_info_server_says_which_build(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        fields = info(c, "server")
    want = compiled.compiled_modules()  # the server runs the build this suite runs
    assert fields["compiled"] == ("yes" if want else "no")
    assert fields["compiled_modules"] == f"{len(want)}/{len(HOT)}"


def test_a_module_taken_out_of_the_hot_set_is_not_run_compiled(built_copy: Path) -> None:
    # its .so stays beside its .py after the build that no longer compiles it
    assert "disque.commands.admin" not in HOT
    so = built_copy / "disque" / "commands" / ("admin" + compiled._EXT)
    shutil.copy2(next((built_copy / "disque").glob("node.*.so")), so)  # any extension file
    code = "import warnings; warnings.simplefilter('always'); import disque.commands.admin as m; print(m.__file__)"
    out = run_in(built_copy, code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("admin.py")
    assert "compiled modules outside the hot set, ignored: disque.commands.admin" in out.stderr
