"""Queues: jobs ordered by creation time, the GETJOB clients blocked on them, pause state and
counters.

A queue only holds jobs in state `queued` on this node; the job's own `state` is the truth
and `Queue.jobs` mirrors it exactly (enqueue/dequeue in `disque.state` keep both in step; `waiting`: the blocked clients).
Empty queues with no blocked client and no pause are evicted after `queue-idle-timeout`.
"""
