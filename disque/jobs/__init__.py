"""Jobs: the Job record, job IDs, the table of state transitions (`states`), DEDUP keys
(`dedup`), restoring a job from the AOF (`restore`), the dead-letter policy and the job's
binary form. The registry itself is the node state's (disque.state).

A job is in exactly one state: wait-repl (waiting for synchronous replication), active
(held, not queued here), queued (in its queue on this node) or acked. `qtime` is when this
node will (re)queue it (0 = never again), `awake` when the timer wheel must look at it next.
Times are milliseconds; `ctime` is creation ms x 1e6 plus a per-node tie counter, so it is
strictly increasing for the jobs a node creates and orders every queue.
"""
