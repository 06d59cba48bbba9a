"""In-process cost of the request path (parse -> dispatch -> reply) per command.

No sockets: a real `Server` and `Client` with a transport stub that swallows writes, fed
the bytes of pipelined requests. This isolates the Python work per command from the kernel
and from the load generator sharing the machine's cores, so optimisations can be compared
run to run. `python -m benchmarks.dispatch [N]`.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time

from disque.config import load_config
from disque.server import Client, Server


class NullTransport:
    def write(self, data: bytes) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


def measure(label: str, server: Server, payload: bytes, per_chunk: int, n: int,
            rounds: int = 5) -> float:
    """Best of `rounds` runs of n/rounds commands: the machine's noise only ever adds."""
    client = Client(server)
    client.connection_made(NullTransport())
    chunks = max(1, n // per_chunk // rounds)
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        t0 = time.perf_counter()
        for i in range(chunks):
            client.data_received(payload)
            if i % 2000 == 0:
                server.cron.gc_tick()
        best = min(best, (time.perf_counter() - t0) * 1e6 / (chunks * per_chunk))
    print(f"{label:<34} {best:6.2f} us/command  {1 / best * 1e6:>10,.0f} commands/s")
    return best


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    gc.disable()
    server = Server(load_config(["--maxmemory", "8gb"]))
    # timers are armed, never run (the per-iteration wiring arms them on the same loop)
    server.loop = server.iteration.loop = asyncio.new_event_loop()
    add = resp(b"ADDJOB", b"q", b"0123456789abcdef", b"0")
    measure("ADDJOB unpipelined", server, add, 1, n)
    measure("ADDJOB pipelined x16", server, add * 16, 16, n)
    get = resp(b"GETJOB", b"NOHANG", b"FROM", b"q")
    measure("GETJOB NOHANG pipelined x16", server, get * 16, 16, n)
    measure("PING unpipelined", server, resp(b"PING"), 1, n)
    measure("PING pipelined x16", server, resp(b"PING") * 16, 16, n)


if __name__ == "__main__":
    main()
