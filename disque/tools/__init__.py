"""Command-line helpers for developers and operators that are not the server itself.

- `cluster`: start, stop and inspect a local N-node cluster (`make cluster`).

Tools talk to the nodes over their client port like any client would; nothing here imports
the server's internals.
"""
