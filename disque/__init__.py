"""disque-py: a distributed, in-memory job queue server speaking the Redis protocol.

A faithful successor of antirez's Disque: the same commands, replies and guarantees. The
package mirrors the original's subsystems: `protocol` (RESP), `commands` (one module per
command family), `jobs` (job model, IDs, registry), `queues` (ordered queues, blocking,
pause), `cluster` (bus, membership, replication state machines), `aof` (persistence),
`timers` (the timer wheel), with `server.py` wiring them to one asyncio event loop.
"""

__version__ = "0.1.0"
