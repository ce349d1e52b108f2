"""Session lanes: one job at a time per session, run in the lane's own worker task; stopping a
job (``/stop``) ends that job only, never the lane or the jobs queued behind it."""

from __future__ import annotations

import asyncio

from pluto.gateway.pipeline.lanes import SessionLanes


class Jobs:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def handle(self, job: str) -> None:
        self.started.append(job)
        gate = self.gates.setdefault(job, asyncio.Event())
        try:
            await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(job)
            await asyncio.sleep(0)  # a job's cleanup may await (the pipeline records the end)
            raise
        self.finished.append(job)


async def until(predicate, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


async def test_a_stopped_job_ends_alone_and_the_lane_runs_the_next():
    jobs = Jobs()
    lanes: SessionLanes[str] = SessionLanes(jobs.handle)
    assert lanes.submit("s", "first") and lanes.submit("s", "second")
    await until(lambda: jobs.started == ["first"])
    running, dropped = lanes.cancel("s", drop_queued=False)
    assert running and dropped == []
    await until(lambda: jobs.started == ["first", "second"])
    assert jobs.cancelled == ["first"]
    jobs.gates["second"].set()
    await lanes.idle()
    assert jobs.finished == ["second"] and not lanes.busy("s")


async def test_stop_drops_what_waits_and_a_new_message_starts_a_fresh_lane():
    jobs = Jobs()
    lanes: SessionLanes[str] = SessionLanes(jobs.handle)
    lanes.submit("s", "a")
    lanes.submit("s", "b")
    await until(lambda: jobs.started == ["a"])
    running, dropped = lanes.cancel("s")
    assert running and dropped == ["b"]
    await lanes.idle()
    assert jobs.cancelled == ["a"] and "b" not in jobs.started
    lanes.submit("s", "c")
    jobs.gates.setdefault("c", asyncio.Event()).set()
    await lanes.idle()
    assert jobs.finished == ["c"]


async def test_other_sessions_run_meanwhile_and_close_cancels_what_outlives_the_grace():
    jobs = Jobs()
    lanes: SessionLanes[str] = SessionLanes(jobs.handle)
    lanes.submit("s1", "slow")
    lanes.submit("s1", "never")
    lanes.submit("s2", "quick")
    jobs.gates.setdefault("quick", asyncio.Event()).set()
    await until(lambda: jobs.finished == ["quick"])
    dropped = await lanes.close(grace=0.05)
    assert dropped == ["never"] and jobs.cancelled == ["slow"]
    assert not lanes.submit("s3", "late")  # closed
    assert len(lanes) == 0


async def test_a_job_that_swallows_its_stop_leaves_the_lane_stoppable_and_uncancelled():
    """A job may end quietly on its stop instead of raising; the lane still goes on with the
    next job as an ordinary one: stoppable again, its worker no longer counted as cancelled."""
    ended: list[str] = []
    gates = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def quiet(job: str) -> None:
        try:
            await gates[job].wait()
        except asyncio.CancelledError:
            ended.append(f"{job} stopped")
            return  # swallowed
        ended.append(f"{job} done")

    lanes: SessionLanes[str] = SessionLanes(quiet)
    lanes.submit("s", "a")
    lanes.submit("s", "b")
    await until(lambda: lanes._lanes["s"].running and not gates["a"].is_set())
    assert lanes.cancel("s", drop_queued=False)[0]
    await until(lambda: ended == ["a stopped"])
    worker = lanes._lanes["s"].worker
    await asyncio.sleep(0)
    assert worker is not None and worker.cancelling() == 0
    assert lanes.cancel("s", drop_queued=False)[0]  # "b" is stopped like any job
    await lanes.idle()
    assert ended == ["a stopped", "b stopped"] and not lanes.busy("s")
