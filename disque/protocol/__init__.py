"""RESP: the request reader (hiredis for multibulk, our own inline parser), reply encoding
for RESP2 and RESP3, and the typed error that every layer raises.

Invariant: nothing here knows about jobs or queues; handlers build replies with the
functions of `reply` and raise `CommandError` for failures.
"""
