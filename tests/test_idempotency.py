"""``Idempotency-Key`` on the API's POST of tasks and steps (issue 29, item 10): a retried
request makes its task or step once; the same key with another body is 422, with a request
still being answered 409; keys are per API key, kept 24 h in the database (SQLite and
PostgreSQL, across instances), then forgotten.

The PostgreSQL tests use tests/helpers/pg.py: they fail, never skip, without a server."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pluto.gateway.app import Gateway
from pluto.runtime.testing import Scripted, ScriptedModel
from pluto.settings import PlutoConfig
from pluto.storage.postgres import PostgresStore
from pluto.storage.sql.store import SqlStore
from pluto.storage.sqlite import SqliteStore
from tests.helpers.inspect_store import runs
from tests.helpers.inspect_store import (age_idempotency_keys, end_idempotency_holds,
                                          idempotency_key)
from tests.helpers.inspect_store import idempotency_keys as keys_of
from tests.helpers.pg import fresh_schema
from tests.helpers.served import API_KEY, served, url, wait_for

AUTH = {"Authorization": f"Bearer {API_KEY}"}
OTHER_KEY = "other-key-abcdefghijklmnop"
OTHER = {"Authorization": f"Bearer {OTHER_KEY}"}
DAY = 24 * 3600


@pytest.fixture
def keys(monkeypatch) -> None:
    monkeypatch.setenv("PLUTO_TEST_API_KEYS", f"{OTHER_KEY}, {API_KEY}")


class GatedModel(ScriptedModel):
    """Echoes, each answer held until ``gate`` is open; counts the calls per input."""

    def __init__(self) -> None:
        super().__init__(fallback=lambda m: Scripted(text=f"re: {m[-1]['content']}"))
        self.gate = asyncio.Event()
        self.gate.set()
        self.asked: list[str] = []

    async def stream(self, messages, tools, settings):
        self.asked.append(messages[-1]["content"])
        await self.gate.wait()
        async for item in super().stream(messages, tools, settings):
            yield item


async def post(http: aiohttp.ClientSession, gw: Gateway, path: str, body: Any, key: str | None,
               auth: dict[str, str] = AUTH) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    headers = {**auth, **({"Idempotency-Key": key} if key is not None else {})}
    async with http.post(url(gw, path), data=json.dumps(body), headers=headers) as resp:
        assert resp.content_type == "application/json"
        return resp.status, await resp.json(), resp.headers


async def reset_after_sending(gw: Gateway, path: str, body: Any, key: str) -> None:
    """A POST whose connection is reset while the server works on it: the server takes it,
    the client never reads a byte of what it says."""
    assert gw.http is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.http.port)
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}"
                 f"\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    await wait_for(lambda: _holding(gw.store, key.strip('"')))  # it is being answered ...
    writer.transport.abort()  # ... when the connection is reset: nothing of it is read


async def _holding(store: SqlStore, key: str) -> bool:
    return await idempotency_key(store, key) is not None


async def steps_of(gw: Gateway, task_id: str) -> list[str]:
    rows, _ = await gw.store.tasks.steps(task_id, 0, 100)
    return [s.input for s in rows]


async def test_a_step_retried_after_a_connection_reset_is_taken_once(config_dir, data_dir,
                                                                     keys):
    model = GatedModel()
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        status, task, _ = await post(http, gw, "/api/v1/agent/tasks?wait=10",
                                     {"input": "first"}, '"task-1"')
        assert status == 201
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        body = {"input": "second", "additional_input": {"n": 1}}
        model.gate.clear()  # the answer takes a while: the reset comes while it is awaited
        await reset_after_sending(gw, path + "?wait=10", body, '"step-1"')
        model.gate.set()
        answered = await wait_for(lambda: _answered(gw.store, "step-1"))  # the server's side
        assert answered[2] == 201 and model.asked == ["first", "second"]

        # the client retries (same key, same body, its keys in another order): the first answer
        retry = {"additional_input": {"n": 1}, "input": "second"}
        status, step, headers = await post(http, gw, path + "?wait=10", retry, '"step-1"')
        assert status == 201 and headers["Idempotent-Replayed"] == "true"
        assert step["input"] == "second" and step["output"] == "re: second"
        assert step["step_id"] == answered[3].split("/")[1]
        status, again, _ = await post(http, gw, path, retry, "step-1")  # a bare token: the same
        assert (status, again) == (201, step)
        assert await steps_of(gw, task["task_id"]) == ["first", "second"]
        assert model.asked == ["first", "second"]  # one run, not two
        assert [r["input"] for r in await runs(gw.store)].count("second") == 1

        # the first task's POST, retried, is the same task
        status, same, headers = await post(http, gw, "/api/v1/agent/tasks?wait=10",
                                           {"input": "first"}, '"task-1"')
        assert status == 201 and same == task and headers["Idempotent-Replayed"] == "true"
        status, tasks = await _get(http, gw, "/api/v1/agent/tasks")
        assert tasks["pagination"]["total_items"] == 1


async def _answered(store: SqlStore, key: str) -> tuple[Any, ...] | None:
    row = await idempotency_key(store, key)
    return row if row is not None and row[2] is not None else None


async def _get(http: aiohttp.ClientSession, gw: Gateway, path: str) -> tuple[int, Any]:
    async with http.get(url(gw, path), headers=AUTH) as resp:
        return resp.status, await resp.json()


async def test_the_same_key_for_another_request_is_422_and_in_progress_is_409(
        config_dir, data_dir, keys):
    model = GatedModel()
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        _, task, _ = await post(http, gw, "/api/v1/agent/tasks?wait=10", {"input": "one"}, "k1")
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps"
        for other_path, body in ((path, {"input": "two"}),  # same key, same path, other body
                                 ("/api/v1/agent/tasks", {"input": "one", "agent": None}),
                                 (path, {"input": "one"})):  # other path, same body
            status, error, _ = await post(http, gw, other_path, body, "k1")
            assert status == 422 and error["code"] == "idempotency_key_reused", other_path
            assert "Idempotency-Key was used with another request" in error["error"]

        model.gate.clear()  # the next answer is held: its request is still being answered
        first = asyncio.ensure_future(post(http, gw, path + "?wait=30", {"input": "two"}, "k2"))
        await wait_for(lambda: "two" in model.asked)
        status, error, _ = await post(http, gw, path + "?wait=30", {"input": "two"}, "k2")
        assert status == 409 and error["code"] == "idempotency_key_in_use"
        assert "still being answered" in error["error"]
        status, error, _ = await post(http, gw, path, {"input": "three"}, "k2")
        assert status == 422  # another body is wrong whatever the state
        model.gate.set()
        status, step, _ = await first
        assert status == 201 and step["output"] == "re: two"
        status, replay, _ = await post(http, gw, path + "?wait=30", {"input": "two"}, "k2")
        assert (status, replay) == (201, step)
        assert model.asked == ["one", "two"]


async def test_keys_are_per_api_key_malformed_ones_are_400_and_refusals_keep_none(
        config_dir, data_dir, keys):
    async with served(config_dir, data_dir, GatedModel()) as gw, \
            aiohttp.ClientSession() as http:
        status, mine, _ = await post(http, gw, "/api/v1/agent/tasks", {"input": "hi"}, "same")
        status2, theirs, headers = await post(http, gw, "/api/v1/agent/tasks", {"input": "hi"},
                                              "same", auth=OTHER)
        assert (status, status2) == (201, 201) and "Idempotent-Replayed" not in headers
        assert mine["task_id"] != theirs["task_id"]  # the other key's is its own task
        for bad in ['""', '"a"b"', "two words", "x" * 256, '"unterminated', "a,b", "é"]:
            async with http.post(url(gw, "/api/v1/agent/tasks"), data=b'{"input": "x"}',
                                 headers={**AUTH, "Idempotency-Key": bad}) as resp:
                error = await resp.json()
            assert resp.status == 400 and "Idempotency-Key" in error["error"], bad
        # a request refused before anything is made keeps no key: corrected, it goes through
        status, error, _ = await post(http, gw, "/api/v1/agent/tasks", {"input": " "}, "fixme")
        assert status == 400
        status, task, headers = await post(http, gw, "/api/v1/agent/tasks", {"input": "ok"},
                                           "fixme")
        assert status == 201 and "Idempotent-Replayed" not in headers
        status, tasks = await _get(http, gw, "/api/v1/agent/tasks")
        assert tasks["pagination"]["total_items"] == 2  # "hi" and "ok": nothing else made
        assert {(r[0], r[1]) for r in await keys_of(gw.store)} == {
            (_scope(API_KEY), "same"), (_scope(OTHER_KEY), "same"), (_scope(API_KEY), "fixme")}


def _scope(key: str) -> str:
    """The name the API gives a bare key: its caller, the scope of its idempotency keys."""
    return f"key-{hashlib.sha256(key.encode()).digest()[:6].hex()}"


async def test_a_key_is_forgotten_after_24_hours(config_dir, data_dir, keys):
    model = GatedModel()
    async with served(config_dir, data_dir, model) as gw, aiohttp.ClientSession() as http:
        _, task, _ = await post(http, gw, "/api/v1/agent/tasks?wait=10", {"input": "a"}, None)
        path = f"/api/v1/agent/tasks/{task['task_id']}/steps?wait=10"
        _, first, _ = await post(http, gw, path, {"input": "b"}, "daily")
        await age_idempotency_keys(gw.store, DAY - 60)  # a minute short of a day: still kept
        status, replay, headers = await post(http, gw, path, {"input": "b"}, "daily")
        assert (status, replay, headers["Idempotent-Replayed"]) == (201, first, "true")
        await age_idempotency_keys(gw.store, 120)  # now past 24 h: a new request
        status, second, headers = await post(http, gw, path, {"input": "b"}, "daily")
        assert status == 201 and second["step_id"] != first["step_id"]
        assert "Idempotent-Replayed" not in headers
        assert await steps_of(gw, task["task_id"]) == ["a", "b", "b"]
        assert model.asked == ["a", "b", "b"]


# the store, on both engines ---------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    if request.param == "sqlite":
        async with SqliteStore(tmp_path / "pluto.db") as s:
            yield s
    else:
        with fresh_schema() as url_:
            async with PostgresStore(url_) as s:
                yield s


async def test_the_store_claims_answers_replays_expires_and_prunes(store):
    keys = store.idempotency
    assert await keys.begin("alice", "k", "fp1", "t1", lock=60) is None  # claimed
    held = await keys.begin("alice", "k", "fp1", "t2", lock=60)
    assert held is not None and held.same and held.status is None and not held.abandoned
    assert not (await keys.begin("alice", "k", "fp2", "t2", lock=60)).same
    assert await keys.begin("bob", "k", "fp2", "t3", lock=60) is None  # per caller
    await keys.made("alice", "k", "t1", "task/step")
    assert not await keys.answered("alice", "k", "t2", 201, "{}")  # not t2's to answer
    assert await keys.answered("alice", "k", "t1", 201, '{"id": 1}')
    done = await keys.begin("alice", "k", "fp1", "t4", lock=60)
    assert (done.status, done.response, done.resource) == (201, '{"id": 1}', "task/step")

    # an attempt that fails before making anything frees its key; one that made its
    # resource leaves it for a retry to adopt at once
    assert await keys.begin("alice", "free", "fp", "t5", lock=60) is None
    await keys.release("alice", "free", "t5")
    assert await keys.begin("alice", "free", "fp", "t6", lock=60) is None
    await keys.made("alice", "free", "t6", "task/made")
    await keys.release("alice", "free", "t6")
    left = await keys.begin("alice", "free", "fp", "t7", lock=60)
    assert left.abandoned and left.resource == "task/made"
    assert await keys.adopt("alice", "free", "t7", lock=60)
    assert not await keys.adopt("alice", "free", "t8", lock=60)  # taken: one retry adopts it

    # a dead attempt (its hold ran out) that made nothing: the same request takes it over
    assert await keys.begin("alice", "dead", "fp", "t9", lock=60) is None
    await end_idempotency_holds(store, key="dead", by=120)
    assert not (await keys.begin("alice", "dead", "other", "t10", lock=60)).same
    assert await keys.begin("alice", "dead", "fp", "t11", lock=60) is None
    assert not await keys.answered("alice", "dead", "t9", 201, "{}")  # fenced: not t9's

    await age_idempotency_keys(store, DAY + 1, scope="alice", key="k")
    assert await keys.begin("alice", "k", "fp2", "t12", lock=60) is None  # expired: new
    await age_idempotency_keys(store, DAY + 1, scope="bob")
    assert await keys.prune() == 1
    assert sorted(r[:2] for r in await keys_of(store)) == [
        ("alice", "dead"), ("alice", "free"), ("alice", "k")]


# PostgreSQL: two instances share the keys ------------------------------------------------

@contextlib.asynccontextmanager
async def pg_gateway(config_dir: Path, data_dir: Path, db: str,
                     model: ScriptedModel) -> AsyncIterator[Gateway]:
    providers = {"api": {"enabled": True, "keys_env": "PLUTO_TEST_API_KEYS"}}
    gw = Gateway(config_dir, config=PlutoConfig(data_dir=data_dir, providers=providers),
                 model_factory=model, serve=True, http_bind=("127.0.0.1", 0),
                 store=PostgresStore(db))
    async with gw:
        await wait_for(lambda: gw.health["api"].state == "running")
        yield gw


async def test_on_postgresql_a_retry_to_another_instance_gets_the_first_answer(
        config_dir, tmp_path, keys):
    model = GatedModel()
    with fresh_schema() as db:
        async with pg_gateway(config_dir, tmp_path / "a", db, model) as a, \
                pg_gateway(config_dir, tmp_path / "b", db, model) as b, \
                aiohttp.ClientSession() as http:
            _, task, _ = await post(http, a, "/api/v1/agent/tasks?wait=10", {"input": "x"},
                                    None)
            path = f"/api/v1/agent/tasks/{task['task_id']}/steps?wait=10"
            await reset_after_sending(a, path, {"input": "y"}, '"pg-1"')
            await wait_for(lambda: _answered(a.store, "pg-1"))
            status, step, headers = await post(http, b, path, {"input": "y"}, '"pg-1"')
            assert status == 201 and headers["Idempotent-Replayed"] == "true"
            assert step["output"] == "re: y"
            status, error, _ = await post(http, b, path, {"input": "z"}, '"pg-1"')
            assert status == 422 and error["code"] == "idempotency_key_reused"
            assert await steps_of(b, task["task_id"]) == ["x", "y"]
            assert model.asked == ["x", "y"]


async def test_the_api_prunes_keys_past_24_hours_while_it_runs(config_dir, data_dir, keys,
                                                               monkeypatch):
    from pluto.providers.api import idempotency
    monkeypatch.setattr(idempotency, "PRUNE_EVERY", 0.01)
    async with served(config_dir, data_dir, GatedModel()) as gw, \
            aiohttp.ClientSession() as http:
        for key in ("old", "new"):
            assert (await post(http, gw, "/api/v1/agent/tasks", {"input": key}, key))[0] == 201
        await age_idempotency_keys(gw.store, DAY + 1, key="old")
        await wait_for(lambda: _only_new(gw.store))


async def _only_new(store: SqlStore) -> bool:
    return [r[1] for r in await keys_of(store)] == ["new"]


async def test_an_answer_that_cannot_be_kept_is_given_all_the_same(config_dir, data_dir, keys,
                                                                   caplog):
    async with served(config_dir, data_dir, GatedModel()) as gw, \
            aiohttp.ClientSession() as http:
        store = gw.store.idempotency

        async def broken(*args: Any) -> bool:
            raise OSError("disk full")

        store.answered = broken  # type: ignore[method-assign]
        status, task, _ = await post(http, gw, "/api/v1/agent/tasks?wait=10", {"input": "x"},
                                     "k")
        assert status == 201 and task["last_step"]["output"] == "re: x"
        assert "could not be kept for its retries: disk full" in caplog.text
        status, error, _ = await post(http, gw, "/api/v1/agent/tasks", {"input": "x"}, "k")
        assert status == 409  # held until its hold runs out: never made twice
        await end_idempotency_holds(gw.store)
        del store.answered
        status, again, headers = await post(http, gw, "/api/v1/agent/tasks", {"input": "x"},
                                            "k")
        assert status == 201 and again["task_id"] == task["task_id"]  # the task it made
        assert "Idempotent-Replayed" not in headers
        status, tasks = await _get(http, gw, "/api/v1/agent/tasks")
        assert tasks["pagination"]["total_items"] == 1
        status, replay, headers = await post(http, gw, "/api/v1/agent/tasks", {"input": "x"},
                                             "k")
        assert (status, replay, headers["Idempotent-Replayed"]) == (201, again, "true")
