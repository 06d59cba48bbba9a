"""AOF records: RESP multibulk exactly as a client would send them (checklist section 12).

Two kinds: `LOADJOB <serialized job, storage form>` and `DELJOB <job id>`. An acknowledged
job is logged as a LOADJOB in state `acked` without its body (`ackjob_record`), so that a
restarted node still knows the acknowledgement and answers for it (issue 13). `RecordParser`
walks a buffer record by record with exact byte offsets, so a loader can tell a truncated
tail (crash mid-write: cut and go on) from corruption in the middle (stop and say where).
"""

from __future__ import annotations

from disque.jobs.job import Job
from disque.jobs.serialize import serialize_job

KNOWN_COMMANDS = (b"LOADJOB", b"DELJOB")


def loadjob_record(job: Job) -> bytes:
    blob = serialize_job(job)
    return b"*2\r\n$7\r\nLOADJOB\r\n$%d\r\n%b\r\n" % (len(blob), blob)


def ackjob_record(job: Job) -> bytes:
    blob = serialize_job(job, with_body=False)
    return b"*2\r\n$7\r\nLOADJOB\r\n$%d\r\n%b\r\n" % (len(blob), blob)


def deljob_record(job_id: bytes) -> bytes:
    return b"*2\r\n$6\r\nDELJOB\r\n$%d\r\n%b\r\n" % (len(job_id), job_id)


class AofFormatError(Exception):
    """Bytes at `offset` are not a valid record."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.offset = offset
        self.reason = reason


class Incomplete(Exception):
    """The buffer ends inside a record."""


def _line(buf: bytes | bytearray | memoryview, pos: int, prefix: int, offset: int,
          limit: int) -> tuple[int, int]:
    """Parse `<prefix><integer>\\r\\n` at pos; returns (value, position after it)."""
    if pos >= len(buf):
        raise Incomplete
    if buf[pos] != prefix:
        raise AofFormatError(offset, f"expected '{chr(prefix)}'")
    end = bytes(buf[pos:pos + 32]).find(b"\r\n")
    if end < 0:
        if len(buf) - pos < 32:
            raise Incomplete
        raise AofFormatError(offset, "bad count line")
    text = bytes(buf[pos + 1:pos + end])
    if not text.isdigit() or int(text) > limit:
        raise AofFormatError(offset, "bad count line")
    return int(text), pos + end + 2


def parse_record(buf: bytes | bytearray, pos: int, offset: int,
                 max_bulk: int = 1 << 40) -> tuple[list[bytes], int]:
    """One record at `pos` of `buf` (whose first byte is at file offset `offset - pos`
    ... i.e. `offset` is the file offset of `pos`). Returns (argv, position after it).
    Raises Incomplete at the end of the buffer, AofFormatError for bad bytes."""
    argc, p = _line(buf, pos, 42, offset, 1024)
    if argc < 1:
        raise AofFormatError(offset, "empty record")
    argv = []
    for _ in range(argc):
        n, p = _line(buf, p, 36, offset, max_bulk)
        if p + n + 2 > len(buf):
            raise Incomplete
        if buf[p + n:p + n + 2] != b"\r\n":
            raise AofFormatError(offset, "bulk not terminated by CRLF")
        argv.append(bytes(buf[p:p + n]))
        p += n + 2
    return argv, p
