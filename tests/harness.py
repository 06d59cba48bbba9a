"""Start real disque-server processes on free loopback ports for the tests.

Nothing here mocks the server: every `DisqueProcess` is `python -m disque` in its own
directory, driven over real sockets. Conditions are polled with generous deadlines; no test
sleeps a fixed amount to "let things settle".
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from disque.tools.ports import free_port  # noqa: F401 - re-exported

REPO = Path(__file__).resolve().parent.parent

# antirez's original Disque server (src/disque-server, built by hand; never part of this
# repository). Tests that run against it take the `original` fixture, which skips without it.
ORIGINAL_ENV = "DISQUE_ORIGINAL"




def wait_for(cond: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02,
             what: str = "condition") -> Any:
    """Poll `cond` until it returns a truthy value; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling through transient errors
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last error: {last_exc!r}")


class DisqueProcess:
    """One real server process. `args` are extra `--directive value` flags."""

    NAME = "disque-server"
    READY_REPLIES: tuple[bytes, ...] = (b"+PONG",)

    def __init__(self, workdir: Path, port: int | None = None, args: list[str] | None = None,
                 config_text: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.args = list(args or [])
        self.config_text = config_text
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "stdout.log"

    # -- lifecycle -------------------------------------------------------------------------
    def executable(self) -> list[str]:
        """How the server is run (the subclass: the original's binary)."""
        return [sys.executable, "-m", "disque"]

    def command(self) -> list[str]:
        cmd = self.executable()
        if self.config_text is not None:
            conf = self.workdir / "disque.conf"
            conf.write_text(self.config_text)
            cmd.append(str(conf))
        cmd += ["--port", str(self.port), "--dir", str(self.workdir)]
        return cmd + self.args

    def start(self, wait: bool = True) -> DisqueProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     cwd=str(REPO), env=env)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Up once it answers PING with one of READY_REPLIES."""
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"*1\r\n$4\r\nPING\r\n")
                    return s.recv(64).startswith(self.READY_REPLIES)
            except OSError:
                return False
        wait_for(ready, timeout=timeout, what=f"{self.NAME} on port {self.port}")

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM and wait: the clean shutdown path."""
        self.kill(signal.SIGTERM)
        return self.proc.returncode if self.proc else None

    # -- clients ---------------------------------------------------------------------------
    def client(self, **kw: Any) -> redis.Redis:
        """redis-py with its defaults (RESP3 via HELLO 3 in redis-py 8) unless overridden."""
        kw.setdefault("socket_timeout", 30)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def cli(self, *args: str, timeout: float = 30.0, raw: bool = False) -> str:
        """Run Debian's redis-cli against the server and return its stdout."""
        exe = shutil.which("redis-cli")
        if exe is None:
            raise RuntimeError("redis-cli missing: `make test` installs Debian's redis-tools")
        cmd = [exe, "-h", "127.0.0.1", "-p", str(self.port)]
        if raw:
            cmd.append("--raw")
        out = subprocess.run(cmd + list(args), capture_output=True, timeout=timeout, check=True)
        return out.stdout.decode(errors="replace")

    def raw(self, payload: bytes, timeout: float = 5.0, expect_close: bool = False) -> bytes:
        """Send raw bytes on a fresh socket and return everything read until a pause or close."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(payload)
            chunks = []
            s.settimeout(0.5 if not expect_close else timeout)
            try:
                while True:
                    data = s.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
            except (TimeoutError, ConnectionResetError):
                pass
            return b"".join(chunks)


def connect_at_once(proc: DisqueProcess) -> socket.socket:
    """A connection made as soon as the node listens (connect in a tight loop): its first
    commands are served while the node still starts."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return socket.create_connection(("127.0.0.1", proc.port), timeout=30)
        except OSError:
            assert proc.alive() and time.monotonic() < deadline, proc.output()[-3000:]


def original_server_path() -> str | None:
    """The original Disque's `disque-server` named by $DISQUE_ORIGINAL, if it is executable."""
    path = os.environ.get(ORIGINAL_ENV)
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    return None


class OriginalDisqueProcess(DisqueProcess):
    """antirez's Disque (`$DISQUE_ORIGINAL`) on a free port in its own directory: it speaks
    RESP2 only (it refuses `HELLO 3`) and has no ADDJOBS, which is what the client's
    fallbacks are tested against."""

    NAME = "the original disque-server"
    READY_REPLIES = (b"+PONG", b"-NOAUTH")  # (up, with a password set)

    def __init__(self, workdir: Path, executable: str, **kw: Any) -> None:
        super().__init__(workdir, **kw)
        self.binary = executable

    def executable(self) -> list[str]:
        return [self.binary]
