"""A `logfile` that cannot be opened (checklist §8: file validation "must be openable"; errors
print `*** FATAL CONFIG FILE ERROR ***`, the line and a reason, exit 1).

disque-py opens the log only after daemonizing, and prints a bare "Can't open the log file"
line. With `daemonize yes` that line goes to /dev/null and the command exits 0: the operator
sees a successful start and no server, and nothing anywhere says why.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.harness import free_port


def run_server(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=str(cwd))


def test_unopenable_logfile_is_a_fatal_config_error(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text(f"logfile {tmp_path}/no/such/dir/log.txt\n")
    out = run_server(str(conf), "--port", str(free_port()), "--dir", str(tmp_path / "d"),
                     cwd=tmp_path)
    assert out.returncode == 1
    assert "*** FATAL CONFIG FILE ERROR ***" in out.stderr
    assert "log" in out.stderr and "No such file or directory" in out.stderr


def test_unopenable_logfile_with_daemonize_fails_before_detaching(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text(f"daemonize yes\nlogfile {tmp_path}/no/such/dir/log.txt\n")
    out = run_server(str(conf), "--port", str(free_port()), "--dir", str(tmp_path / "d"),
                     cwd=tmp_path)
    assert out.returncode == 1, "a start that cannot log must not report success"
    assert "*** FATAL CONFIG FILE ERROR ***" in out.stderr
