"""AofManager: the AOF's life in the server: load at start, turn on and off at run time,
rewrite (BGREWRITEAOF, automatic growth, SHUTDOWN REWRITE-AOF), hold replies until what
they confirm is written, and report INFO persistence.

A reply never confirms a record that is not in the file: a command that logged something
(`Client.aof_marks`, noted by the dispatcher) has its reply sent only after the write
(`hold`: at once under `everysec` and `no`; after the iteration's group fsync under
`always`), and when that write fails its reply becomes -MISCONF and the jobs it added are
cancelled (`Node.cancel_adds`). While the AOF cannot be written the dispatcher refuses new
jobs; the cron retries the write until it succeeds, which is the way back to normal."""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import structlog

from disque.aof.loader import AofLoader, AofLoadError
from disque.aof.writer import AppendOnlyFile, Rewrite
from disque.config import Config, ConfigSetError, config_rewrite, on_set
from disque.latency import AOF_REWRITE
from disque.protocol.errors import aof_write_failed

if TYPE_CHECKING:
    from disque.connection import Client
    from disque.server import Server

log = structlog.get_logger("disque.aof")

PROGRESS_EVERY = 3.0  # seconds between "still loading" log lines
REWRITE_LIMIT_AFTER = 3  # failed rewrites in a row before automatic ones are spaced out
REWRITE_DELAY_MAX = 3600.0  # longest wait between two automatic attempts (1 min, doubling)


def misconf_reply(error: str) -> bytes:
    return aof_write_failed(error).resp()


def rewrite_backoff(failures: int) -> float:
    """How long automatic rewrites wait after `failures` failed ones in a row: not at all
    before REWRITE_LIMIT_AFTER, then 1 minute, doubling up to an hour, as Redis 7 does
    (each attempt on a full disk would fill it again). BGREWRITEAOF never waits."""
    if failures < REWRITE_LIMIT_AFTER:
        return 0.0
    return min(60.0 * 2 ** (failures - REWRITE_LIMIT_AFTER), REWRITE_DELAY_MAX)


class AofManager:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.cfg = server.cfg
        self.node = server.node
        self.aof: AppendOnlyFile | None = None
        # clients whose replies wait for the fsync (always), or for the one write of the
        # loop iteration (everysec, no: see hold)
        self.held: list[Client] = []
        self.write_scheduled = False
        self.rewrite: Rewrite | None = None
        self.rewrite_scheduled = False
        self.last_bgrewrite_ok = True
        self.last_rewrite_time = -1
        self.rewrite_failures = 0  # in a row (INFO aof_rewrites_consecutive_failures)
        self.rewrite_failed_at = 0.0
        self.loader: AofLoader | None = None  # while the AOF loads
        self.start_with = (False, False)  # (appendonly, aof-enqueue-jobs-once) at start
        on_set(self.cfg, "appendonly", self._on_appendonly)
        on_set(self.cfg, "appendfsync", self._on_appendfsync)

    @property
    def path(self) -> str:
        return self.cfg.appendfilename

    # ------------------------------------------------------------------ start
    def begin_start(self, appendonly: bool, enqueue_once: bool) -> None:
        """Called before the listeners open, with the values the node started with (a
        CONFIG SET served while it starts does not change this start). A client served
        from the first accepted command on sees the whole loading state: -LOADING, and in
        INFO the loading_* fields of the file about to be loaded. Raises AofLoadError when
        the AOF exists but cannot be opened."""
        self.start_with = (appendonly, enqueue_once)
        # -LOADING until the AOF is loaded *and* open for writing: a write accepted earlier
        # would be acknowledged and never logged.
        self.server.loading = appendonly or enqueue_once
        if self.server.loading and os.path.exists(self.path):
            self.loader = AofLoader(self.path, self.node, enqueue_once,
                                    self.cfg.aof_load_truncated)

    async def load_at_start(self) -> None:
        """Load the AOF if appendonly or aof-enqueue-jobs-once asked for it at begin_start,
        then open it for appending. Raises AofLoadError when the file cannot be loaded."""
        cfg = self.cfg
        appendonly, enqueue_once = self.start_with
        try:
            if self.loader is not None:
                await self.load(self.loader)
            elif enqueue_once:
                raise AofLoadError(f"aof-enqueue-jobs-once is yes but the AOF "
                                   f"{self.path} does not exist in {os.getcwd()}")
            if appendonly:
                self.open()
        finally:
            self.server.loading = False
        if enqueue_once:
            # Self-disabling: the queued state is restored once, never on a later restart.
            cfg.aof_enqueue_jobs_once = False
            if cfg.config_file:
                try:
                    config_rewrite(cfg)
                except ConfigSetError as exc:
                    log.warning("aof.enqueue_once_rewrite_failed", error=str(exc))
            log.info("aof.enqueue_jobs_once_done", config_rewritten=bool(cfg.config_file))

    async def load(self, loader: AofLoader) -> None:
        t0 = time.monotonic()
        last_log = t0
        try:
            for done in loader.steps():
                now = time.monotonic()
                if now - last_log >= PROGRESS_EVERY:
                    last_log = now
                    log.info("aof.loading", loaded_bytes=done, total_bytes=loader.total_bytes,
                             jobs=loader.jobs_loaded)
                self.node.overflow.spill_if_needed()  # a backlog larger than memory
                await asyncio.sleep(0)  # let clients in: they get -LOADING
        finally:
            self.loader = None
        if loader.truncated_at is not None:
            log.warning("aof.truncated", path=self.path, offset=loader.truncated_at,
                        cut_bytes=loader.total_bytes - loader.truncated_at)
        log.info("aof.loaded", path=self.path, jobs=loader.jobs_loaded,
                 deleted=loader.jobs_deleted, records=loader.records,
                 seconds=round(time.monotonic() - t0, 3), queued=loader.enqueue_queued)

    def open(self, wait_rewrite: bool = False) -> AppendOnlyFile:
        assert self.server.loop is not None
        aof = self.aof = AppendOnlyFile(self.path, self.cfg.appendfsync,
                                        self.server.loop.call_soon, self.release,
                                        wait_rewrite=wait_rewrite, latency=self.server.latency,
                                        on_failed=self.node.cancel_adds)
        aof.no_fsync_on_rewrite = self.cfg.no_appendfsync_on_rewrite
        self.node.persist = aof
        return aof

    # ------------------------------------------------------------------ replies
    def hold(self, client: Client) -> bool:
        """Called with a client's replies ready: True if they must wait. Under `always` they
        wait for the fsync. Under `everysec` and `no` the replies of commands that logged
        records wait for the end of the loop iteration, where one write puts every client's
        records on disk before their replies leave (as Redis's beforeSleep: one write per
        iteration, not one per client). A failed write turns those replies into -MISCONF."""
        aof = self.aof
        marks = client.aof_marks
        if aof is None:
            if marks:
                marks.clear()
            return False
        if aof.hold_replies:
            if not aof.flush_scheduled:
                if marks and aof.last_write_error is not None:
                    client.refuse_logged(misconf_reply(aof.last_write_error))
                return False
            if not client.aof_held:
                client.aof_held = True
                self.held.append(client)
            return True
        if not marks:
            return False
        if not client.aof_held:
            client.aof_held = True
            self.held.append(client)
            if not self.write_scheduled:
                self.write_scheduled = True
                loop = self.server.loop
                assert loop is not None
                loop.call_soon(self.write_and_release)
        return True

    def write_and_release(self) -> None:
        """End of the loop iteration (everysec, no): write what the held replies confirm,
        then send them (release refuses them if the write failed)."""
        self.write_scheduled = False
        if self.aof is not None:
            self.aof.flush(force=True)
        self.release()

    def release(self) -> None:
        held = self.held
        if not held:
            return
        self.held = []
        aof = self.aof
        error = aof.last_write_error if aof is not None else None
        refused = misconf_reply(error) if error is not None else b""
        for c in held:
            c.aof_held = False
            if error is not None:
                c.refuse_logged(refused)  # never confirm what is not on disk
            transport = c.transport
            if transport is None or transport.is_closing():
                continue
            c.flush()
            if c.closing:  # it asked to close once its replies were out (a protocol error)
                transport.close()

    def flush_before_send(self) -> bool:
        """Before bus messages leave: write (and fsync under `always`) what they may confirm.
        False if that failed: the caller then sends no GOTJOB."""
        aof = self.aof
        if aof is None:
            return True
        if aof.buf or aof.last_write_error is not None:
            return aof.flush(fsync=aof.policy == "always", force=True)
        return True

    def write_now(self) -> bool:
        """Write (and fsync under `always`) what was logged, at once (the HTTP door, whose
        replies cannot be held); False if that failed."""
        aof = self.aof
        return aof is None or aof.flush(fsync=aof.policy == "always", force=True)

    def misconf_text(self) -> str:
        aof = self.aof
        error = aof.last_write_error if aof is not None else None
        return str(aof_write_failed(error or "unknown error"))

    # ------------------------------------------------------------------ run time
    def _on_appendonly(self, cfg: Config, name: str) -> None:
        if cfg.appendonly and self.aof is None:
            aof = self.open(wait_rewrite=True)
            if not self.start_rewrite():
                aof.close()
                self.aof = None
                self.node.persist = None
                raise ConfigSetError("ERR Unable to turn on AOF. Check server logs.")
        elif not cfg.appendonly and self.aof is not None:
            self.stop()

    def _on_appendfsync(self, cfg: Config, name: str) -> None:
        if self.aof is not None:
            self.aof.set_policy(cfg.appendfsync)

    def stop(self) -> None:
        self.abort_rewrite()
        if self.aof is not None:
            self.aof.close()
            self.aof = None
            self.node.persist = None
        self.release()

    def start_rewrite(self) -> bool:
        """Begin a background rewrite; False if one is running or it cannot start."""
        if self.rewrite is not None:
            return False
        temp = f"temp-rewriteaof-bg-{os.getpid()}.aof"
        try:
            self.rewrite = Rewrite(self.node.jobs, self.path, temp, self.aof, self._rewrite_done,
                                   self.cfg.aof_rewrite_incremental_fsync,
                                   disk=self.node.overflow.scan)
        except OSError as exc:
            log.warning("aof.rewrite_failed", error=exc.strerror)
            self.last_bgrewrite_ok = False
            return False
        self.rewrite_scheduled = False
        self.rewrite_started = time.monotonic()
        log.info("aof.rewrite_started", path=self.path)
        self._rewrite_step()
        return True

    def _rewrite_step(self) -> None:
        rw = self.rewrite
        if rw is None or rw.finished:
            return
        latency = self.server.latency
        started = latency.start()
        try:
            done = rw.step()
        except OSError as exc:
            rw.fail(exc.strerror or str(exc))
            return
        finally:
            latency.end(AOF_REWRITE, started)
        if not done:
            assert self.server.loop is not None
            self.server.loop.call_soon(self._rewrite_step)

    def _rewrite_done(self, ok: bool, reason: str) -> None:
        self.last_bgrewrite_ok = ok
        self.last_rewrite_time = int(time.monotonic() - self.rewrite_started)
        self.rewrite = None
        if ok:
            self.rewrite_failures = 0
            log.info("aof.rewrite_done", path=self.path, seconds=self.last_rewrite_time)
        else:
            # the temporary file is gone and the AOF is the one it was before
            self.rewrite_failures += 1
            self.rewrite_failed_at = time.monotonic()
            log.warning("aof.rewrite_failed", error=reason, path=self.path,
                        failures_in_a_row=self.rewrite_failures)
        if self.rewrite_scheduled and self.aof is not None:
            # CONFIG SET dir during a rewrite: the AOF has yet to be written in the new dir
            assert self.server.loop is not None
            self.server.loop.call_soon(self.start_scheduled_rewrite)

    def start_scheduled_rewrite(self) -> None:
        if self.rewrite_scheduled and self.rewrite is None and self.aof is not None:
            self.start_rewrite()

    def abort_rewrite(self) -> None:
        if self.rewrite is not None:
            self.rewrite.abort()
            self.rewrite = None

    def rewrite_now(self) -> bool:
        """A synchronous full rewrite (SHUTDOWN REWRITE-AOF): no client runs meanwhile, so
        the file holds the exact state, queued jobs included."""
        self.abort_rewrite()
        temp = f"temp-rewriteaof-{os.getpid()}.aof"
        ok = [True]

        def done(success: bool, reason: str) -> None:
            ok[0] = success
            if not success:
                log.warning("aof.rewrite_failed", error=reason)

        try:
            rw = Rewrite(self.node.jobs, self.path, temp, self.aof, done,
                         self.cfg.aof_rewrite_incremental_fsync,
                         disk=self.node.overflow.scan)
            rw.run_to_end()
        except OSError as exc:
            log.warning("aof.rewrite_failed", error=exc.strerror)
            return False
        return ok[0]

    def rewrite_limited(self) -> bool:
        """Whether automatic rewrites still wait after failed ones (rewrite_backoff)."""
        delay = rewrite_backoff(self.rewrite_failures)
        return bool(delay) and time.monotonic() - self.rewrite_failed_at < delay

    def cron(self) -> None:
        aof = self.aof
        if aof is None:
            return
        if (aof.buf or aof.last_write_error is not None) and not aof.flush_scheduled:
            # also the retry of a failed write: its success lets writes in again
            aof.flush(fsync=aof.policy == "always")
        if aof.fd is None and self.rewrite is None and not self.rewrite_limited():
            # CONFIG SET appendonly yes: its first rewrite failed (a full disk); what was
            # logged meanwhile went with it, but a new one writes the state as it is now
            self.start_rewrite()
            return
        cfg = self.cfg
        if (self.rewrite is None and aof.fd is not None and cfg.auto_aof_rewrite_percentage
                and aof.current_size > cfg.auto_aof_rewrite_min_size
                and not self.rewrite_limited()):
            base = aof.base_size or 1
            growth = (aof.current_size - base) * 100 // base
            if growth >= cfg.auto_aof_rewrite_percentage:
                log.info("aof.auto_rewrite", size=aof.current_size, base=aof.base_size,
                         growth_percent=growth)
                self.start_rewrite()

    def prepare_shutdown(self, mode: bytes) -> bool:
        """SHUTDOWN [REWRITE-AOF]: write what must be on disk before exiting."""
        if mode == b"rewrite-aof" and not self.server.loading and not self.rewrite_now():
            return False
        if self.aof is not None:
            if not self.aof.flush(fsync=True, force=True):
                return False  # (left open: it keeps retrying, SHUTDOWN can be tried again)
            self.aof.close()
            if self.aof.last_write_error is not None:
                return False
            self.aof = None
            self.node.persist = None
        return True

    def debug_loadaof(self) -> bool:
        """DEBUG LOADAOF: write what is buffered, forget everything, load the AOF again."""
        if self.aof is not None and not self.aof.flush(fsync=True, force=True):
            return False
        persist, self.node.persist = self.node.persist, None  # clearing memory is not a deletion
        try:
            self.node.flushall()
        finally:
            self.node.persist = persist
        if not os.path.exists(self.path):
            return True
        try:
            for _ in AofLoader(self.path, self.node, False, self.cfg.aof_load_truncated).steps():
                pass
        except AofLoadError as exc:
            log.warning("aof.debug_loadaof_failed", error=str(exc))
            return False
        return True

    # ------------------------------------------------------------------ INFO
    def info(self) -> list[tuple[str, Any]]:
        aof = self.aof
        if aof is None:
            state = "off"
        elif aof.fd is None:
            state = "wait-rewrite"
        else:
            state = "on"
        rewriting = self.rewrite is not None
        fields: list[tuple[str, Any]] = [
            ("loading", int(self.server.loading)),
            ("aof_enabled", int(aof is not None)),
            ("aof_state", state),
            ("aof_rewrite_in_progress", int(rewriting)),
            ("aof_rewrite_scheduled", int(self.rewrite_scheduled)),
            ("aof_last_rewrite_time_sec", self.last_rewrite_time),
            ("aof_current_rewrite_time_sec",
             int(time.monotonic() - self.rewrite_started) if rewriting else -1),
            ("aof_last_bgrewrite_status", "ok" if self.last_bgrewrite_ok else "err"),
            ("aof_rewrites_consecutive_failures", self.rewrite_failures),
            ("aof_last_write_status", "ok" if aof is None or aof.last_write_error is None
             else "err"),
            ("aof_last_write_error", "" if aof is None else aof.last_write_error or ""),
            ("aof_write_errors", 0 if aof is None else aof.write_errors),
        ]
        if aof is not None:
            fields += [
                ("aof_current_size", aof.current_size),
                ("aof_base_size", aof.base_size),
                ("aof_pending_rewrite", int(self.rewrite_scheduled)),
                ("aof_buffer_length", len(aof.buf)),
                ("aof_rewrite_buffer_length", len(aof.rewrite_buf or b"")),
                ("aof_pending_bio_fsync", int(aof.fsync_running)),
                ("aof_delayed_fsync", aof.delayed_fsync),
            ]
        loader = self.loader
        if loader is not None:
            elapsed = max(time.time() - loader.start_time, 1e-6)
            rate = loader.loaded_bytes / elapsed
            left = loader.total_bytes - loader.loaded_bytes
            fields += [
                ("loading_start_time", int(loader.start_time)),
                ("loading_total_bytes", loader.total_bytes),
                ("loading_loaded_bytes", loader.loaded_bytes),
                ("loading_loaded_perc",
                 f"{loader.loaded_bytes * 100 / max(loader.total_bytes, 1):.2f}"),
                ("loading_eta_seconds", int(left / rate) if rate else 1),
            ]
        return fields

    rewrite_started = 0.0
