"""The cluster: bus framing, the node table and membership, and the job state machines that
run across nodes (replication, re-queue, ACK garbage collection, federation).

For now a node knows only itself; `ClusterNode` is the record every view of the cluster
(HELLO, CLUSTER NODES, nodes.conf) is built from.
"""
