"""`pluto serve` raises its open-files limit and grows its descriptor table before it starts
(gateway/fdpolicy.py). Each case runs in a fresh Python process: limits are per process, and a
lowered hard limit cannot be raised again."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from pluto.gateway import fdpolicy

PROBE = r"""
import json, logging, os, resource, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))

def table():
    for line in open("/proc/self/status"):
        if line.startswith("FDSize:"):
            return int(line.split()[1])

from pluto.gateway import fdpolicy
before, opened = table(), len(os.listdir("/proc/self/fd"))
now = fdpolicy.prepare(reserve=int(sys.argv[3]))
print(json.dumps({"limit": now, "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                  "before": before, "after": table(),
                  "leaked": len(os.listdir("/proc/self/fd")) - opened}))
"""


def _probe(soft: int, hard: int, reserve: int) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(soft), str(hard), str(reserve)],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout), done.stderr


def test_the_soft_limit_is_raised_to_the_hard_one_and_the_table_grown_at_once():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    seen, said = _probe(256, hard, 4096)
    assert seen["limit"] == seen["soft"] == min(hard, fdpolicy.CEILING)
    assert seen["before"] < 4096 <= seen["after"]  # grown once, now: no doubling while serving
    assert seen["leaked"] == 0
    assert said == ""  # a limit this high is not worth a word


def test_doctor_says_the_limit_serve_will_run_with():
    said = subprocess.run([sys.executable, "-c", "import resource; "
                           "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024)); "
                           "from pluto.gateway import fdpolicy; print(fdpolicy.describe())"],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert said.strip() == ("up to 1,024 (pluto serve raises the soft limit from 256): about 462 "
                            "answers can stream at once")


def test_the_soft_limit_is_raised_no_higher_than_the_ceiling_and_never_lowered():
    infinity = -1
    assert fdpolicy._target(256, 1024, infinity) == 1024
    assert fdpolicy._target(1024, 1 << 20, infinity) == fdpolicy.CEILING  # children inherit it
    assert fdpolicy._target(256, infinity, infinity) == fdpolicy.CEILING
    assert fdpolicy._target(100_000, 200_000, infinity) == 100_000  # set higher by the admin
    assert fdpolicy._target(infinity, infinity, infinity) == infinity


def test_a_low_hard_limit_is_said_and_the_table_grown_as_far_as_it_allows():
    seen, said = _probe(256, 1024, 16_384)
    assert seen["limit"] == seen["soft"] == 1024
    assert seen["after"] >= 1024
    assert seen["leaked"] == 0
    assert "open files are limited to 1024 (ulimit -n)" in said
    assert "about 462 answers can stream at once" in said


def test_the_listen_backlog_is_as_deep_as_the_kernel_allows():
    """The connection guard drains the queue itself in bounded batches, so the queue is as deep
    as net.core.somaxconn: a burst waits in it rather than losing SYNs (1 s, 3 s retries)."""
    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    assert fdpolicy.listen_backlog() == max(128, somaxconn)
