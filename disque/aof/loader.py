"""Replaying an AOF into a node at start.

`AofLoader.steps()` reads the file in chunks and applies each record through the node
(`Node.load_job` for LOADJOB, unregister for DELJOB), yielding between chunks so the server
can keep answering `-LOADING` while a large file loads. A truncated last record (a crash in
the middle of a write) is cut off when `aof-load-truncated yes`; anything else that is not a
valid record stops the load with its offset.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from disque.aof.format import AofFormatError, Incomplete, parse_record
from disque.jobs.serialize import SerializeError, deserialize_job

if TYPE_CHECKING:
    from disque.node import Node

CHUNK = 256 * 1024  # bytes per step (~1-2k jobs): clients get -LOADING between steps


class AofLoadError(Exception):
    """The AOF cannot be loaded; the message names the offset and the way out."""


class AofLoader:
    def __init__(self, path: str, node: Node, enqueue_queued: bool, load_truncated: bool) -> None:
        self.path = path
        self.node = node
        self.enqueue_queued = enqueue_queued
        self.load_truncated = load_truncated
        try:
            self.file = open(path, "rb")  # noqa: SIM115 (steps reads it and closes it)
            self.total_bytes = os.fstat(self.file.fileno()).st_size
        except OSError as exc:
            # Not a listener's error: process.main reports an AofLoadError as the AOF's.
            raise AofLoadError(f"Cannot read the AOF {path}: {exc.strerror}") from None
        self.loaded_bytes = 0
        self.start_time = time.time()
        self.jobs_loaded = 0
        self.jobs_deleted = 0
        self.records = 0
        self.truncated_at: int | None = None

    def steps(self) -> Iterator[int]:
        """Apply the file chunk by chunk; yields the bytes loaded so far after each chunk."""
        buf = b""  # unparsed bytes; buf[0] is at file offset `base`
        base = 0
        with self.file as f:
            while True:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                buf = buf + chunk if buf else chunk
                pos = 0
                while pos < len(buf):
                    try:
                        argv, end = parse_record(buf, pos, base + pos)
                    except Incomplete:
                        break
                    except AofFormatError as exc:
                        raise AofLoadError(self._bad(exc.offset, exc.reason)) from None
                    self.apply(argv, base + pos)
                    pos = end
                base += pos
                buf = buf[pos:]
                self.loaded_bytes = base
                yield base
        if buf:
            self.truncated(base)
        yield base

    def apply(self, argv: list[bytes], offset: int) -> None:
        self.records += 1
        cmd = argv[0].upper()
        if cmd == b"LOADJOB" and len(argv) == 2:
            try:
                job, end = deserialize_job(argv[1])
            except SerializeError as exc:
                raise AofLoadError(self._bad(offset, f"bad LOADJOB payload ({exc})")) from None
            if end != len(argv[1]):
                raise AofLoadError(self._bad(offset, "bad LOADJOB payload (trailing bytes)"))
            if self.node.load_job(job, self.enqueue_queued):
                self.jobs_loaded += 1
        elif cmd == b"DELJOB" and len(argv) == 2:
            known = self.node.lookup_job(argv[1])
            if known is not None:
                self.node.unregister(known)
                self.jobs_deleted += 1
        else:
            name = argv[0].decode(errors="replace")
            raise AofLoadError(self._bad(offset, f"unknown command '{name}' in the AOF"))

    def truncated(self, offset: int) -> None:
        if not self.load_truncated:
            raise AofLoadError(
                f"The AOF {self.path} ends with a truncated record at offset {offset} "
                f"(of {self.total_bytes} bytes) and aof-load-truncated is no. Run "
                f"'disque-check-aof --fix {self.path}' or set aof-load-truncated yes.")
        self.truncated_at = offset
        with open(self.path, "r+b") as f:
            f.truncate(offset)
            f.flush()
            os.fsync(f.fileno())

    def _bad(self, offset: int, reason: str) -> str:
        return (f"Bad record in the AOF {self.path} at offset {offset} of {self.total_bytes}: "
                f"{reason}. Run 'disque-check-aof {self.path}' to inspect it and "
                f"'disque-check-aof --fix {self.path}' to truncate the file there "
                f"(the records after it are lost).")
