"""Persistence: the append-only file.

When `appendonly yes`, every job this node accepts with a local copy is logged as a LOADJOB
record and every acknowledgement or deletion as a DELJOB record (`format`), written by
`writer.AppendOnlyFile` under the configured fsync policy; at start `loader` replays the
file. Queues are not logged: reloaded jobs come back active and are re-queued by their
retry timer, except after a controlled restart (`SHUTDOWN REWRITE-AOF` with
`aof-enqueue-jobs-once yes`), when the AOF was written with no client connected and the
queued state can be restored exactly.

Invariants: a record reaches the file in the order the node produced it; with
`appendfsync always` no client sees a reply before the records its command produced are
fsynced; a rewrite produces a file equivalent to the old file plus everything logged while
it ran, and replaces the old one atomically (rename, then fsync of the directory).
"""
