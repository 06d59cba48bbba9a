"""A small filesystem for the full-disk tests, made with what this machine allows.

In this order: a tmpfs mount (`mount -t tmpfs -o size=...`: needs CAP_SYS_ADMIN, which the
tests have when they run as root outside a restricted container), a loop-mounted ext4 image
(the same right, plus loop devices), or a file-size limit on the server process
(RLIMIT_FSIZE via prlimit: writes past it fail with EFBIG, which the server handles as a
full disk; no rights needed). `DISQUE_SMALL_DISK=tmpfs|loop|fsize` forces one, to check the
fallbacks on a machine where the first one works.

The same verbs whatever the kind: `fill(leave)` leaves about `leave` bytes free for the
server's files (a filler file, or a limit just above the largest file), `room_for_new_file`
leaves room for a new file of a given size (a rewrite's copy), `free()` gives the space back
(deletes the filler, lifts the limit), `close()` unmounts.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

KINDS = ("tmpfs", "loop", "fsize")
FILLER = "filler.bin"


def _run(*cmd: str) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _fill_once(fd: int) -> bool:
    """Write until ENOSPC with smaller and smaller chunks; whether anything was written."""
    wrote = False
    for size in (65536, 4096, 512, 1):
        chunk = b"\0" * size
        while True:
            try:
                os.write(fd, chunk)  # (a short write: the next one says ENOSPC)
            except OSError:  # full
                break
            wrote = True
    return wrote


class SmallDisk:
    def __init__(self, kind: str, path: Path, image: Path | None = None) -> None:
        self.kind = kind
        self.path = path  # the directory on the small filesystem (the server's `dir`)
        self.image = image
        self.pid: int | None = None  # fsize: the process the limit applies to

    # -------------------------------------------------------------------- making one
    @classmethod
    def make(cls, base: Path, size_mb: int = 2) -> SmallDisk:
        base.mkdir(parents=True, exist_ok=True)
        forced = os.environ.get("DISQUE_SMALL_DISK", "")
        kinds = (forced,) if forced else KINDS
        assert all(k in KINDS for k in kinds), f"DISQUE_SMALL_DISK must be one of {KINDS}"
        path = base / "small"
        path.mkdir()
        for kind in kinds:
            if kind == "tmpfs" and _run("mount", "-t", "tmpfs", "-o", f"size={size_mb}m",
                                        "tmpfs", str(path)):
                return cls("tmpfs", path)
            if kind == "loop":
                image = base / "small.img"
                with open(image, "wb") as f:
                    f.truncate(max(size_mb, 4) * 1024 * 1024)  # ext4's journal needs room
                if (_run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image))
                        and _run("mount", "-o", "loop", str(image), str(path))):
                    shutil.rmtree(path / "lost+found", ignore_errors=True)
                    return cls("loop", path, image)
                image.unlink(missing_ok=True)
            if kind == "fsize":
                return cls("fsize", path)
        raise AssertionError(f"no small disk could be made of kinds {kinds}")

    def close(self) -> None:
        if self.kind in ("tmpfs", "loop") and not _run("umount", str(self.path)):
            _run("umount", "-l", str(self.path))  # still busy (a process the test left)
        if self.image is not None:
            self.image.unlink(missing_ok=True)

    # -------------------------------------------------------------------- the verbs
    def attach(self, pid: int) -> None:
        """The server writing there (a file-size limit applies per process; after a restart,
        attach the new one)."""
        self.pid = pid

    def fill(self, leave: int = 0) -> None:
        """Leave about `leave` bytes for the server's files to grow into."""
        if self.kind == "fsize":
            assert self.pid is not None, "attach() the server first"
            largest = max((p.stat().st_size for p in self.path.iterdir() if p.is_file()),
                          default=0)
            self.limit(largest + leave)
            return
        fd = os.open(self.path / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            # Down to single bytes, and again after an fsync: ext4 holds back room for the
            # metadata of unallocated writes and gives it back once they are allocated.
            while _fill_once(fd):
                os.fsync(fd)
            size = os.fstat(fd).st_size
            os.ftruncate(fd, max(0, size - leave))
            os.fsync(fd)
        finally:
            os.close(fd)

    def room_for_new_file(self, nbytes: int) -> None:
        """A file written from now on cannot grow past about `nbytes` (a rewrite's copy);
        under a file-size limit the files already there cannot grow either."""
        if self.kind == "fsize":
            self.limit(nbytes)
        else:
            self.fill(leave=nbytes)

    def limit(self, nbytes: int | None) -> None:
        """Set the soft limit only (None: up to the hard one): raising a hard limit again
        takes CAP_SYS_RESOURCE, which root may not have."""
        assert self.pid is not None, "attach() the server first"
        hard = resource.prlimit(self.pid, resource.RLIMIT_FSIZE)[1]
        resource.prlimit(self.pid, resource.RLIMIT_FSIZE, (hard if nbytes is None else nbytes,
                                                           hard))

    def free(self) -> None:
        """Give the space back."""
        if self.kind == "fsize":
            if self.pid is not None:
                self.limit(None)
            return
        with contextlib.suppress(FileNotFoundError):
            (self.path / FILLER).unlink()

    def available(self) -> int:
        """Bytes free for an unprivileged writer (fsize: unlimited, -1)."""
        if self.kind == "fsize":
            return -1
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def small_disk(base: Path, size_mb: int = 2) -> Iterator[SmallDisk]:
    disk = SmallDisk.make(base, size_mb)
    try:
        yield disk
    finally:
        disk.close()
