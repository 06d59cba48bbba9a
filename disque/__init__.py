"""disque-py: a distributed, in-memory job queue server speaking the Redis protocol.

A faithful successor of antirez's Disque: the same commands, replies and guarantees. The
package mirrors the original's subsystems: `protocol` (RESP), `commands` (one module per
command family), `jobs` (job model, IDs, registry), `queues` (ordered queues, blocking,
pause), `cluster` (bus, membership, replication state machines), `aof` (persistence),
`timers` (the timer wheel), with `server.py` wiring them to one asyncio event loop.
"""

__version__ = "0.1.0"

# Before any hot module is imported: a compiled build older than its source is refused (see
# disque/compiled.py); DISQUE_NO_COMPILE=1 runs pure Python beside a compiled build.
from disque import compiled as _compiled  # noqa: E402

_compiled.check_fresh()
