"""Slowloris from its own process (its own descriptors; the server measured is not slowed by
the attacker's work): ``python tests/helpers/slowloris.py PORT COUNT PARTIAL`` opens COUNT
sockets, sends each the PARTIAL request head, then a header line to every socket still open
every 2 s; prints ``opened N``, and once every socket was closed (or after 120 s) ``closed N
answered M`` (M: sockets that got bytes back before closing). Used by tests/test_slow_clients.py
and bench/slowloris.py."""

import contextlib
import resource
import selectors
import socket
import sys
import time


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port, count, partial = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(partial)
        s.setblocking(False)
        socks.append(s)
    print("opened", len(socks), flush=True)
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    alive, answered, trickle = set(socks), 0, time.monotonic() + 2
    deadline = time.monotonic() + 120
    while alive and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            try:
                data = key.fileobj.recv(65536)
            except (ConnectionResetError, BlockingIOError) as e:
                data = b"" if isinstance(e, ConnectionResetError) else None
            if data is None:
                continue
            if data:
                answered += 1
            sel.unregister(key.fileobj)
            alive.discard(key.fileobj)
        if time.monotonic() >= trickle:  # a header line to every socket still open, every 2 s
            trickle = time.monotonic() + 2
            for s in alive:
                with contextlib.suppress(OSError):  # (closed by the server: the reader counts it)
                    s.send(b"X-Slow: 1\r\n")
    print("closed", len(socks) - len(alive), "answered", answered, flush=True)


if __name__ == "__main__":
    main()
