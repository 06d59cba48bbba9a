"""The cluster: bus framing, the node table and membership, and the job state machines that
run across nodes (replication, re-queue, ACK garbage collection, federation).

- `messages`: every bus message as a typed record, its msgpack wire form, `FrameDecoder`,
  the cluster-password HMAC helpers;
- `nodes`: `ClusterNode`, the record every view of the cluster (HELLO, CLUSTER NODES,
  nodes.conf) is built from, its flags and the nodes.conf format;
- `membership`: the node table's sans-I/O state machine (handshake, gossip, failure
  detection, FORGET/RESET/LEAVING), events in, effects out.

Nothing here does I/O or reads a clock: the asyncio bus in `disque.server` moves the frames,
and tests drive the same code over a simulated network (tests/sim).
"""
