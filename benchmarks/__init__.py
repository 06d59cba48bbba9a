"""Benchmarks behind `make bench`: disque-py against Debian's redis-server as a queue.

`python -m benchmarks.run` starts a fresh disque-py node and a fresh redis-server on free
loopback ports, drives both with the same loads and prints throughput, latency and the ratio
disque/redis for each scenario, checking the ratios issue 3 sets as targets. Single-command
loads use redis-benchmark (C, one process); the produce -> GETJOB -> ACKJOB loop uses our own
multi-process generator in `loadgen.py`. See README.md in this folder for how to read the
numbers (and why absolute numbers on a 2-core machine mean little).
"""
