"""The provider kit's public functions (pluto.providers.kit), each on its own: caps on files
read and downloaded, HTTP errors as typed errors, webhook signatures good and bad, the backoff
loop, quiet notices, settings checks, defensive payload reads and capped request bodies."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import ValidationError

from pluto.errors import (ConfigError, DeliveryRefused, ProviderError, ProviderUnusable,
                          RateLimited)
from pluto.gateway.ports import ProviderContext
from pluto.settings import ProviderConfig
from pluto.providers.kit import bounded, errors, files, loops, markup, notices, payload, settings
from pluto.providers.kit import signatures
from pluto.providers.kit.http import read_limited
from pluto.types import Attachment, OutgoingMessage

log = logging.getLogger("tests.kit")


async def _blocks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


# files ---------------------------------------------------------------------------------------

async def test_a_download_under_the_cap_is_saved_and_each_block_seen(tmp_path: Path) -> None:
    digest = hashlib.sha256()
    path = tmp_path / "in" / "chat" / "a.csv"
    size = await files.save_stream(_blocks(b"a,b\n", b"1,2\n"), path, limit=8,
                                   each=digest.update)
    assert size == 8 and path.read_bytes() == b"a,b\n1,2\n"
    assert digest.hexdigest() == hashlib.sha256(b"a,b\n1,2\n").hexdigest()


async def test_a_download_over_the_cap_stops_and_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    with pytest.raises(files.TooLarge):
        await files.save_stream(_blocks(b"x" * 6, b"x" * 6, b"never read"), path, limit=10)
    assert not path.exists()


async def test_a_failing_download_leaves_no_partial_file(tmp_path: Path) -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"part"
        raise aiohttp.ClientPayloadError("connection lost")

    path = tmp_path / "cut.bin"
    with pytest.raises(aiohttp.ClientPayloadError):
        await files.save_stream(broken(), path, limit=100)
    assert not path.exists()


async def test_an_outgoing_file_is_read_within_its_cap(tmp_path: Path) -> None:
    chart = tmp_path / "chart.png"
    chart.write_bytes(b"\x89PNG" + b"0" * 96)
    assert len(await files.read_outgoing(Attachment(filename="chart.png", path=chart))) == 100
    assert len(await files.read_outgoing(Attachment(filename="chart.png", path=chart),
                                         limit=100)) == 100
    with pytest.raises(DeliveryRefused, match="larger than the platform takes"):
        await files.read_outgoing(Attachment(filename="chart.png", path=chart), limit=99)
    with pytest.raises(DeliveryRefused, match="can no longer be read"):
        await files.read_outgoing(Attachment(filename="gone.png", path=tmp_path / "gone.png"))
    with pytest.raises(DeliveryRefused, match="has no path"):
        await files.read_outgoing(Attachment(filename="nowhere.png"))


def test_file_names_sizes_and_sentences() -> None:
    assert files.safe_filename("../../etc/passwd") == "passwd"
    assert files.safe_filename("..\\..\\win.ini") == "win.ini"
    assert files.safe_filename("...") == "file" and len(files.safe_filename("a" * 300)) == 100
    assert files.max_bytes(1.5) == 1572864
    assert files.too_large("a.csv", 20) == (
        "The file a.csv is too large for me to read (the limit is 20 MB).")
    assert files.not_downloaded("a.csv") == (
        "I could not download the file a.csv; please send it again.")
    assert files.kind_of("image/png") == "image" and files.kind_of("text/csv") == "file"


# errors --------------------------------------------------------------------------------------

def test_retry_after_is_read_from_the_header_in_any_case() -> None:
    assert errors.retry_after_header({"Retry-After": "2.5"}) == 2.5
    assert errors.retry_after_header({"retry-after": "3"}) == 3.0
    assert errors.retry_after_header({"Retry-After": "-4"}) == 0.0
    assert errors.retry_after_header({"Retry-After": "soon"}) is None
    assert errors.retry_after_header({"Content-Type": "text/plain"}) is None
    assert errors.retry_after_header(None) is None


def test_http_statuses_become_typed_errors() -> None:
    unusable = errors.by_status(401, refused="refused", failed="failed", unusable="bad token")
    assert isinstance(unusable, ProviderUnusable) and str(unusable) == "bad token"
    assert isinstance(errors.by_status(401, refused="refused", failed="failed"),
                      DeliveryRefused)  # no sentence for credentials: a refusal
    refused = errors.by_status(403, refused="no access", failed="failed")
    assert isinstance(refused, DeliveryRefused) and str(refused) == "no access"
    for status in (500, 503, 302):
        failed = errors.by_status(status, refused="refused", failed="try later")
        assert type(failed) is ProviderError and str(failed) == "try later"
    limited = errors.rate_limited("Slack", 1.5)
    assert isinstance(limited, RateLimited) and limited.retry_after == 1.5
    assert str(limited) == "Slack asked to slow down for 1.5s"


def test_transport_failures_are_errors_to_try_again() -> None:
    timeout = errors.transport_error(asyncio.TimeoutError(), "Slack")
    assert type(timeout) is ProviderError and str(timeout) == "Slack did not answer in time"
    lost = errors.transport_error(aiohttp.ServerDisconnectedError(), "the Matrix homeserver")
    assert str(lost) == "could not reach the Matrix homeserver (ServerDisconnectedError)"
    assert str(errors.transport_error(ConnectionRefusedError(), "X")) == (
        "could not reach X (ConnectionRefusedError)")
    assert errors.transport_error(ValueError("not JSON"), "X") is None
    # whether the platform may have taken the call: no connection made — certainly not; a
    # timeout or a connection lost mid-call — perhaps (its "may have been delivered" stays)
    assert errors.transport_error(ConnectionRefusedError(), "X").unsent  # type: ignore[union-attr]
    assert not timeout.unsent and not lost.unsent  # type: ignore[union-attr]
    assert errors.rate_limited("X", 1).unsent
    assert errors.by_status(403, refused="no", failed="later").unsent
    assert not errors.by_status(502, refused="no", failed="later").unsent


# signatures ----------------------------------------------------------------------------------

BODY = b'{"entry": [{"changes": []}]}'


def test_a_body_signature_is_checked() -> None:
    good = "sha256=" + hmac.new(b"app-secret", BODY, hashlib.sha256).hexdigest()
    assert signatures.body_signature_ok("app-secret", BODY, good)
    assert signatures.body_signature_ok("app-secret", BODY, f"  {good} ")
    assert not signatures.body_signature_ok("other-secret", BODY, good)
    assert not signatures.body_signature_ok("app-secret", BODY + b" ", good)  # tampered
    assert not signatures.body_signature_ok("app-secret", BODY, good.removeprefix("sha256="))
    assert not signatures.body_signature_ok("app-secret", BODY, "sha256=ö")
    assert not signatures.body_signature_ok("app-secret", BODY, None)


def test_a_timestamped_signature_is_checked_and_must_be_fresh() -> None:
    base = b"v0:1700000000:" + BODY
    good = "v0=" + hmac.new(b"signing", base, hashlib.sha256).hexdigest()
    ok = signatures.timestamped_signature_ok
    assert ok("signing", "1700000000", BODY, good, now=1700000100)
    assert not ok("signing", "1700000000", BODY, good, now=1700000301)  # replayed later
    assert not ok("signing", "1700000001", BODY, good, now=1700000100)  # another timestamp
    assert not ok("wrong", "1700000000", BODY, good, now=1700000100)
    assert not ok("signing", "yesterday", BODY, good, now=1700000100)
    assert not signatures.fresh(None)


def test_a_shared_secret_is_compared_whole() -> None:
    assert signatures.same_secret("s3cret-token", "s3cret-token")
    assert not signatures.same_secret("s3cret", "s3cret-token")
    assert not signatures.same_secret("", "s3cret-token")
    assert not signatures.same_secret(None, "s3cret-token")
    assert signatures.same_secret(b"\xff\xfe", b"\xff\xfe")


# loops ---------------------------------------------------------------------------------------

class Attempts:
    """An attempt that fails with the given errors in turn, then returns "done"; the waits it
    was made to sleep are recorded (no time passes)."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0
        self.waits: list[float] = []

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def _typed(exc: Exception) -> ProviderError:
    match exc:
        case ProviderError():
            return exc
        case _:
            return ProviderError(f"failed: {exc}")


async def test_failures_wait_longer_each_time_up_to_the_cap(
        caplog: pytest.LogCaptureFixture) -> None:
    attempt = Attempts(*(OSError(f"down {n}") for n in range(6)))
    backoff = loops.Backoff(first=2.0, cap=30.0)
    with caplog.at_level(logging.WARNING, logger="tests.kit"):
        got = await loops.retry_until_done(attempt, failures=(OSError,), typed=_typed,
                                           backoff=backoff, what="x: polling", log=log,
                                           sleep=attempt.sleep)
    assert got == "done" and attempt.calls == 7
    assert attempt.waits == [2, 4, 8, 16, 30, 30]
    assert backoff.failures == 0  # reset by the success
    assert "x: polling failed (failed: down 0); retrying in 2s" in caplog.messages
    for _ in range(5000):  # days of failures: the wait stays at the cap
        wait = backoff.next()
    assert wait == 30.0


async def test_a_rate_limit_waits_as_asked_and_credentials_end_the_loop() -> None:
    attempt = Attempts(RateLimited("slow down", retry_after=7.5), TimeoutError(),
                       OSError("down"))
    got = await loops.retry_until_done(attempt, failures=(OSError, ProviderError),
                                       at_once=(TimeoutError,), typed=_typed,
                                       backoff=loops.Backoff(), what="x", log=log,
                                       sleep=attempt.sleep)
    assert got == "done" and attempt.waits == [7.5, 2.0]  # the timeout: tried again at once
    stopped = Attempts(OSError("down"), ProviderUnusable("token rejected"))
    with pytest.raises(ProviderUnusable, match="token rejected"):
        await loops.retry_until_done(stopped, failures=(OSError, ProviderError), typed=_typed,
                                     backoff=loops.Backoff(), what="x", log=log,
                                     sleep=stopped.sleep)
    assert stopped.waits == [2.0]


async def test_an_error_not_named_is_raised() -> None:
    attempt = Attempts(KeyError("bug"))
    with pytest.raises(KeyError):
        await loops.retry_until_done(attempt, failures=(OSError,), typed=_typed,
                                     backoff=loops.Backoff(), what="x", log=log,
                                     sleep=attempt.sleep)


async def test_following_a_feed_hands_each_item_and_closes_it(
        caplog: pytest.LogCaptureFixture) -> None:
    closed: list[str] = []

    async def feed(fail: bool) -> AsyncGenerator[int, None]:
        try:
            yield 1
            yield 2
            if fail:
                raise RuntimeError("storage went away")
            yield 3
        finally:
            closed.append("closed")

    seen: list[int] = []
    await loops.follow(feed(False), seen.append, what="web: showing run r1", log=log)
    assert seen == [1, 2, 3] and closed == ["closed"]
    with caplog.at_level(logging.ERROR, logger="tests.kit"):
        await loops.follow(feed(True), seen.append, what="web: showing run r2", log=log)
    assert seen == [1, 2, 3, 1, 2] and closed == ["closed", "closed"]
    assert "web: showing run r2 failed" in caplog.messages


# notices -------------------------------------------------------------------------------------

async def test_a_notice_that_cannot_be_sent_is_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    sent: list[OutgoingMessage] = []

    async def send(message: OutgoingMessage) -> str:
        sent.append(message)
        return "m1"

    async def refuse(message: OutgoingMessage) -> str:
        raise DeliveryRefused("the bot was removed from the channel")

    message = notices.notice("C1", "The file a.csv is too large", thread_id="t1")
    assert message.kind == "notice" and message.thread_id == "t1"
    assert await notices.quiet_notice(send, message, log=log, provider="x", place="channel C1")
    assert sent == [message]
    with caplog.at_level(logging.WARNING, logger="tests.kit"):
        assert not await notices.quiet_notice(refuse, message, log=log, provider="x",
                                              place="channel C1")
    assert caplog.messages == [
        "x: could not tell channel C1: the bot was removed from the channel"]


# settings ------------------------------------------------------------------------------------

class Example(settings.ProviderSettings):
    token_env: str = "X_TOKEN"
    api_base: settings.HttpUrl = "https://api.example.com"


def test_settings_fields_are_checked() -> None:
    assert Example.model_validate({"api_base": " http://127.0.0.1:8080/ "}).api_base == (
        "http://127.0.0.1:8080")
    with pytest.raises(ValidationError, match="must be an http:// or https:// URL"):
        Example.model_validate({"api_base": "ftp://example.com"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        Example.model_validate({"enabeld": True})  # a typo is an error
    assert not Example().enabled
    assert settings.ws_url("ws://127.0.0.1/gw") == "ws://127.0.0.1/gw/"
    with pytest.raises(ValueError):
        settings.ws_url("http://127.0.0.1/gw")


def test_a_webhook_without_the_http_server_is_a_config_error(tmp_path: Path) -> None:
    ctx = ProviderContext(name="x", config=ProviderConfig(enabled=True), data_dir=tmp_path,
                          feed=None)  # type: ignore[arg-type]  # (no feed is read)
    with pytest.raises(ConfigError) as refused:
        settings.needs_http_server(ctx, "x", "mode", "webhook mode needs the HTTP server")
    assert refused.value.problems == [("pluto.yaml", None, "providers.x.mode",
                                       "webhook mode needs the HTTP server")]


# bounded memory -----------------------------------------------------------------------------

def test_remembering_keeps_the_newest_and_forgets_the_oldest() -> None:
    kept: OrderedDict[str, int] = OrderedDict()
    for n, key in enumerate(["a", "b", "c"]):
        bounded.remember(kept, key, n, most=3)
    bounded.remember(kept, "a", 9, most=3)  # seen again: the newest now
    bounded.remember(kept, "d", 3, most=3)
    assert list(kept.items()) == [("c", 2), ("a", 9), ("d", 3)]


# payload, markup -----------------------------------------------------------------------------

def test_payload_reads_never_crash_on_the_wrong_type() -> None:
    data = {"id": 42, "none": None, "content": {"body": "hi"}, "list": [1], "bad": "text"}
    assert payload.text_at(data, "id") == "42" and payload.text_at(data, "none") == ""
    assert payload.dict_at(data, "content") == {"body": "hi"}
    assert payload.dict_at(data, "bad") == {} and payload.dict_at(data, "missing") == {}
    assert payload.list_at(data, "list") == [1] and payload.list_at(data, "content") == []


def test_markup_parts() -> None:
    assert markup.code_language("py<script>") == "pyscript"
    assert markup.code_language("c++") == "c++" and len(markup.code_language("x" * 50)) == 32
    assert markup.HtmlEscaped().escape("<b>&</b>") == "&lt;b&gt;&amp;&lt;/b&gt;"


# http ----------------------------------------------------------------------------------------

async def test_a_request_body_is_read_no_further_than_its_cap() -> None:
    async def handler(request: web.Request) -> web.Response:
        body = await read_limited(request, 10)
        return web.Response(text="too large" if body is None else body.decode())

    app = web.Application()
    app.router.add_post("/hook", handler)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        assert await (await client.post("/hook", data=b"0123456789")).text() == "0123456789"
        assert await (await client.post("/hook", data=b"0123456789X")).text() == "too large"

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length to check first
            for _ in range(4):
                yield b"0123"

        assert await (await client.post("/hook", data=chunked())).text() == "too large"
