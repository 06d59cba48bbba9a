"""disque-check-aof: find the first bad record of an AOF and optionally truncate there.

    disque-check-aof FILE            report: records, jobs, first bad offset
    disque-check-aof --fix FILE      truncate to the last good record (asks first)
    disque-check-aof --fix --yes FILE
"""

from __future__ import annotations

import argparse
import os
import sys

from disque.aof.format import AofFormatError, Incomplete, parse_record
from disque.jobs.serialize import SerializeError, deserialize_job


def scan(path: str) -> tuple[int, int, str | None]:
    """(records, offset of the end of the last good record, reason it stopped or None)."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    records = 0
    while pos < len(data):
        try:
            argv, end = parse_record(data, pos, pos)
        except Incomplete:
            return records, pos, "truncated record"
        except AofFormatError as exc:
            return records, pos, exc.reason
        cmd = argv[0].upper()
        if cmd == b"LOADJOB" and len(argv) == 2:
            try:
                _, used = deserialize_job(argv[1])
            except SerializeError as exc:
                return records, pos, f"bad LOADJOB payload ({exc})"
            if used != len(argv[1]):
                return records, pos, "bad LOADJOB payload (trailing bytes)"
        elif not (cmd == b"DELJOB" and len(argv) == 2):
            return records, pos, f"unknown command '{argv[0].decode(errors='replace')}'"
        records += 1
        pos = end
    return records, pos, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="disque-check-aof",
                                     description="Check (and fix) a disque-py AOF file.")
    parser.add_argument("--fix", action="store_true", help="truncate at the first bad record")
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask before fixing")
    parser.add_argument("file")
    args = parser.parse_args(argv)
    try:
        size = os.path.getsize(args.file)
        records, good, reason = scan(args.file)
    except OSError as exc:
        print(f"Cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    if reason is None:
        print(f"AOF is valid: {records} records, {size} bytes")
        return 0
    print(f"AOF is not valid: {reason} at offset {good} (of {size} bytes); "
          f"{records} good records before it, {size - good} bytes would be cut")
    if not args.fix:
        return 1
    if not args.yes:
        answer = input(f"Truncate {args.file} to {good} bytes? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing changed")
            return 1
    with open(args.file, "r+b") as f:
        f.truncate(good)
        f.flush()
        os.fsync(f.fileno())
    print(f"Truncated to {good} bytes: {records} records kept")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
