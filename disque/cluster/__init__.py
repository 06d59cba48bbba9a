"""The cluster: bus framing, the node table and membership, and the job state machines that
run across nodes, one subsystem per module (see docs/architecture.md).

- `messages`: every bus message as a typed record, its msgpack wire form, `FrameDecoder`,
  the cluster-password HMAC helpers;
- `nodes`: `ClusterNode`, the record every view of the cluster (HELLO, CLUSTER NODES,
  nodes.conf) is built from, its flags and the nodes.conf format;
- `membership`: the node table's sans-I/O state machine (handshake, gossip, failure
  detection, FORGET/RESET/LEAVING), events in, effects out (`effects`: the effect values);
- `replication` (REPLJOB / GOTJOB / ENQUEUE), `requeue` (WILLQUEUE / QUEUED / WORKING),
  `acks` (ACKJOB, FASTACK, SETACK / GOTACK / DELJOB), `federation` (NEEDJOBS / YOURJOBS),
  `deadletters`, `rereplication`, `repair`: the job subsystems, each built by disque.node
  with the node's `NodeState` (disque.state); `records`: jobs as they travel on the bus;
- `bus`: the asyncio bus links (the only I/O here).

Nothing but `bus` does I/O or reads a clock: the bus moves the frames, and tests drive the
same code over a simulated network (tests/sim).
"""
