"""Open files in a gateway that holds thousands of sockets.

Every open chat connection is a socket, and so is every streamed answer's model connection: 1,000
answers at once hold over 2,000 descriptors, past the soft limit of 1,024 that many systems set.
And the kernel keeps a process's descriptors in a table that grows by doubling; in a process
with threads (the database's), each growth waits for an RCU grace period. Measured in
`pluto serve` under a burst of 200 new conversations (180 new model connections): ``socket()``
took 114 µs on average instead of 18 — milliseconds of the event loop among the answers' first
words, each time the table doubled.

So :func:`prepare`, before the gateway starts, raises the soft limit to the hard one (as Go's
runtime does for every program) and grows the table once, while the process is quiet. The soft
limit is raised to :data:`CEILING` at most: the programs the gateway starts (MCP servers, the
data child) inherit it, and some close every possible descriptor one by one at start.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

RESERVE = 16_384  # the table is grown to this many descriptors at start (~130 KB of kernel memory)
CEILING = 65_536  # the soft limit is raised no higher (about 32,000 answers at once)
FEW = 2_048  # below this soft limit, say that it limits how many chats can be served at once


def _answers(limit: int) -> int:
    """About how many answers can stream at once: a socket to the chat and one to the model
    each, less what the process holds anyway (its database, its listening sockets, …)."""
    return max(0, limit // 2 - 50)


def _target(soft: int, hard: int, infinity: int) -> int:
    """The soft limit ``pluto serve`` runs with: the hard one, up to :data:`CEILING` (never
    lower than it is already)."""
    ceiling = CEILING if hard == infinity else min(hard, CEILING)
    return soft if soft == infinity or soft >= ceiling else ceiling


def http_connections(limit: int | None = None, held: int | None = None) -> int:
    """How many HTTP connections the server keeps at once when ``http.max_connections`` is not
    set: as many as answers can stream (each may need a model connection beside it) in what
    the process does not hold already, so a flood of connections meets a 503 long before
    ``accept()`` meets EMFILE. ``limit``: the soft open-files limit (default: the one in
    force); ``held``: descriptors open now (default: counted)."""
    if limit is None:
        limit = soft_limit()
    if limit is None:
        return 32_768
    return max(64, _answers(limit - (in_use() if held is None else held)))


def in_use() -> int:
    """Descriptors this process holds now (0 where that cannot be told)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def backlog(limit: int | None = None) -> int:
    """The listening socket's backlog: deep, so a burst of connections waits in the kernel's
    queue instead of losing SYNs (then a second or three of retransmission), but at most a
    eighth of the open-files limit: asyncio accepts up to ``backlog`` connections at each
    readiness of the socket, each a descriptor for a few turns of the loop before the
    connection guard can close one, and a flood makes it ready at every turn (three bursts
    may be in flight at once: at a 1,024 limit, 3 × 256 on top of the connections held met
    EMFILE; the kernel caps it at net.core.somaxconn)."""
    if limit is None:
        limit = soft_limit()
    return 4096 if limit is None else max(64, min(4096, limit // 8))


def listen_backlog() -> int:
    """The listening socket's backlog when the connection guard accepts (gateway/http/guard.py):
    as deep as the kernel allows (``net.core.somaxconn``, 4,096 by default since Linux 5.4).
    A full queue drops new connections' SYNs — a second, then three, of retransmission for
    every client, a health probe too — and the guard takes only a bounded batch of them at
    each turn of the loop, closing one to make room before it takes the next, so a deep queue
    costs no descriptors."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return max(128, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 4096


def soft_limit() -> int | None:
    """The soft open-files limit in force (None where there is none, or no such platform)."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def describe() -> str | None:
    """For ``pluto doctor``: the limit ``pluto serve`` will run with, and what it allows."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = _target(soft, hard, resource.RLIM_INFINITY)
    raised = f" (pluto serve raises the soft limit from {soft:,})" if soft < limit else ""
    return f"up to {limit:,}{raised}: about {_answers(limit):,} answers can stream at once"


def prepare(reserve: int = RESERVE) -> int | None:
    """Raise the soft open-files limit to the hard one (:data:`CEILING` at most) and grow the
    descriptor table to
    ``reserve`` entries (fewer if the limit is lower). Returns the soft limit in force (None
    where the platform has no such limit)."""
    try:
        import fcntl
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _target(soft, hard, resource.RLIM_INFINITY)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as e:  # e.g. above the kernel's nr_open
            log.debug("open files: the soft limit stays at %d (%s)", soft, e)
    if soft != resource.RLIM_INFINITY and soft < FEW:
        log.warning("open files are limited to %d (ulimit -n): every chat socket held open and "
                    "every answer being streamed takes one, so about %d answers can stream at "
                    "once; raise the hard limit to serve more", soft, _answers(soft))
    # the highest descriptor the table must hold: the reserve's last (or the limit's, if lower)
    top = (reserve if soft == resource.RLIM_INFINITY else min(reserve, soft)) - 1
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.close(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top))  # the lowest free one >= top
    except OSError as e:  # (the table then grows when it must, as before)
        log.debug("open files: the descriptor table was not grown: %s", e)
    finally:
        os.close(fd)
    return soft
