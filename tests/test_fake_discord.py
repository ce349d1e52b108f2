"""The fake Discord (REST + gateway), driven by the real discord.py Client over the wire."""

from __future__ import annotations

import asyncio
import io
import struct
import time
import zlib

import aiohttp
import discord
import pytest

from tests.fakes.discord_server import FakeDiscord
from tests.fakes.discord_state import PRIVILEGED_INTENTS, INTENT_MESSAGE_CONTENT


def png(width: int = 3, height: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x10\x20\x30" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


async def until(predicate, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
    return value


class Bot(discord.Client):
    """A discord.py client that records what it receives."""

    def __init__(self, *, message_content: bool = True, members: bool = False) -> None:
        intents = discord.Intents.default()
        intents.message_content = message_content
        intents.members = members
        super().__init__(intents=intents, guild_ready_timeout=0.1)
        self.received: list[discord.Message] = []
        self.events: list[str] = []
        self.ready_event = asyncio.Event()

    async def before_identify_hook(self, shard_id, *, initial=False):
        # discord.py sleeps 5 s before every re-IDENTIFY (not the first one); tests don't
        return None

    async def on_ready(self):
        self.events.append("ready")
        self.ready_event.set()

    async def on_resumed(self):
        self.events.append("resumed")

    async def on_guild_join(self, guild):
        self.events.append(f"guild_join:{guild.id}")

    async def on_message(self, message: discord.Message):
        self.received.append(message)

    def from_users(self) -> list[discord.Message]:
        return [m for m in self.received if m.author.id != self.user.id]


@pytest.fixture
async def fake():
    async with FakeDiscord(heartbeat_interval=0.5) as server:
        yield server


@pytest.fixture
def world(fake: FakeDiscord) -> dict:
    bob = fake.add_user(username="bob", global_name="Bob")
    guild = fake.add_guild(name="Pluto Lab", members=[bob["id"]])
    general = fake.add_channel(guild["id"], name="general")
    thread = fake.add_thread(int(general["id"]), name="a thread")
    dm = fake.add_dm(fake.default_user)
    return {"guild": guild["id"], "general": int(general["id"]), "thread": int(thread["id"]),
            "dm": int(dm["id"]), "bob": int(bob["id"]), "alice": int(fake.default_user["id"])}


async def start_bot(fake: FakeDiscord, bot: Bot) -> asyncio.Task:
    task = asyncio.create_task(bot.start(fake.token))
    ready = asyncio.create_task(bot.ready_event.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    if ready not in done:
        ready.cancel()
        if task in done:
            task.result()                   # raises the client's error
        raise TimeoutError("discord.py client never became ready")
    return task


async def stop_bot(bot: Bot, task: asyncio.Task) -> None:
    await bot.close()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def bot(fake: FakeDiscord, world: dict):
    with fake.redirect():
        client = Bot()
        task = await start_bot(fake, client)
        try:
            yield client
        finally:
            await stop_bot(client, task)


# ---------------------------------------------------------------------- login, READY, caches
async def test_login_ready_with_guilds_cached(fake: FakeDiscord, world: dict, bot: Bot):
    assert bot.user.id == fake.bot_id and bot.user.bot
    guild = bot.get_guild(world["guild"])
    assert guild is not None and guild.name == "Pluto Lab" and not guild.unavailable
    assert isinstance(bot.get_channel(world["general"]), discord.TextChannel)
    thread = guild.get_thread(world["thread"])
    assert isinstance(thread, discord.Thread) and thread.parent_id == world["general"]
    assert guild.me is not None and guild.me.id == fake.bot_id
    assert bot.application_id == fake.bot_id
    # the wire: one IDENTIFY with the message_content intent, zlib-stream asked for, heartbeats ACKed
    [ident] = fake.identifies
    assert ident.accepted and ident.intents & INTENT_MESSAGE_CONTENT
    [conn] = fake.connections
    assert conn.path == "/gw/" and conn.query["v"] == "10" and conn.query["compress"] == "zlib-stream"
    assert conn.compressor is not None
    await until(lambda: bot.latency != float("inf"), what="a heartbeat ACK")
    assert [c.route for c in fake.calls][:2] == ["GET /users/@me", "GET /oauth2/applications/@me"]


async def test_plain_text_frames_when_compression_off(world: dict):
    async with FakeDiscord(compress=False) as server:
        server.add_guild(world["guild"], name="Other")
        with server.redirect():
            client = Bot()
            task = await start_bot(server, client)
            try:
                assert server.connections[0].compressor is None
                assert client.get_guild(world["guild"]) is not None
            finally:
                await stop_bot(client, task)


async def test_redirect_is_restored(fake: FakeDiscord):
    before_base = discord.http.Route.BASE
    before_gw = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    with fake.redirect():
        assert discord.http.Route.BASE == fake.api_base
        assert str(discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == fake.gateway_url
    assert discord.http.Route.BASE == before_base
    assert discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY == before_gw


# ---------------------------------------------------------------------- incoming messages
async def test_guild_message_with_mention(fake: FakeDiscord, world: dict, bot: Bot):
    injected = fake.inject_message(world["general"], f"{fake.bot_mention} hello there", author=world["bob"])
    [msg] = await until(lambda: bot.from_users(), what="on_message")
    assert msg.id == int(injected["id"])
    assert msg.guild is not None and msg.guild.id == world["guild"]
    assert isinstance(msg.channel, discord.TextChannel) and msg.channel.id == world["general"]
    assert isinstance(msg.author, discord.Member) and msg.author.name == "bob"
    assert bot.user.mentioned_in(msg)
    assert [m.id for m in msg.mentions] == [fake.bot_id]
    assert msg.content == f"<@{fake.bot_id}> hello there"


async def test_mentions_argument_and_dm(fake: FakeDiscord, world: dict, bot: Bot):
    fake.inject_message(world["general"], "hey bot", mentions=["bot"])
    fake.inject_message(world["dm"], "private hello")
    guild_msg, dm_msg = await until(lambda: len(m := bot.from_users()) >= 2 and m, what="two messages")
    assert bot.user.mentioned_in(guild_msg) and guild_msg.guild is not None
    assert dm_msg.guild is None and isinstance(dm_msg.channel, discord.DMChannel)
    assert dm_msg.author.id == world["alice"] and dm_msg.content == "private hello"
    reply = await dm_msg.channel.send("hi in private")
    assert fake.messages(world["dm"])[0].content == "hi in private" and reply.channel.id == world["dm"]


async def test_thread_message_reply_and_attachment(fake: FakeDiscord, world: dict, bot: Bot):
    first = fake.inject_message(world["thread"], "look at this", attachments=[("chart.png", png(4, 3))])
    second = fake.inject_message(world["thread"], "and reply", reply_to=int(first["id"]), author=world["bob"])
    m1, m2 = await until(lambda: len(m := bot.from_users()) >= 2 and m, what="two thread messages")
    assert isinstance(m1.channel, discord.Thread) and m1.channel.parent_id == world["general"]
    assert m1.guild is not None and m1.guild.id == world["guild"]
    [att] = m1.attachments
    assert (att.filename, att.content_type, att.width, att.height) == ("chart.png", "image/png", 4, 3)
    assert await att.read() == png(4, 3)
    assert await att.read(use_cached=True) == png(4, 3)
    assert m2.type == discord.MessageType.reply and m2.id == int(second["id"])
    assert m2.reference.message_id == m1.id and m2.reference.resolved.content == "look at this"
    assert world["alice"] in [u.id for u in m2.mentions]       # replies mention the replied author
    # unsigned CDN URLs are refused, as on the real CDN
    async with aiohttp.ClientSession() as s:
        async with s.get(att.url.split("?")[0]) as r:
            assert r.status == 404


async def test_message_content_intent_missing(fake: FakeDiscord, world: dict):
    with fake.redirect():
        client = Bot(message_content=False)
        task = await start_bot(fake, client)
        try:
            fake.inject_message(world["general"], "secret", attachments=[("a.txt", b"x")])
            fake.inject_message(world["general"], f"{fake.bot_mention} for you")
            fake.inject_message(world["dm"], "dm text")
            msgs = await until(lambda: len(m := client.from_users()) >= 3 and m)
            assert [m.content for m in msgs] == ["", f"<@{fake.bot_id}> for you", "dm text"]
            assert msgs[0].attachments == []
        finally:
            await stop_bot(client, task)


async def test_guild_and_channel_added_while_connected(fake: FakeDiscord, world: dict, bot: Bot):
    guild = fake.add_guild(name="Second")
    channel = fake.add_channel(guild["id"], name="news")
    await until(lambda: bot.get_channel(int(channel["id"])) is not None, what="CHANNEL_CREATE")
    assert f"guild_join:{guild['id']}" in bot.events
    fake.inject_message(int(channel["id"]), "in the new guild")
    [msg] = await until(lambda: bot.from_users())
    assert msg.guild.name == "Second"


# ---------------------------------------------------------------------- outgoing REST
async def test_send_edit_typing_delete(fake: FakeDiscord, world: dict, bot: Bot):
    channel = bot.get_channel(world["general"])
    await channel.typing()
    msg = await channel.send("thinking…")
    await msg.edit(content="the answer is 42")
    [sent] = await fake.wait_for_messages(world["general"])
    assert sent.message_id == msg.id and sent.content == "thinking…"
    assert [e.content for e in sent.edits] == ["the answer is 42"]
    assert sent.current_content == "the answer is 42"
    assert fake.message(world["general"], msg.id)["edited_timestamp"] is not None
    assert [t.channel_id for t in fake.typing] == [world["general"]]
    # the bot's own messages come back over the gateway, as on Discord
    own = await until(lambda: [m for m in bot.received if m.author.id == bot.user.id])
    assert own[0].id == msg.id
    fetched = await channel.fetch_message(msg.id)
    assert fetched.content == "the answer is 42"
    await msg.delete()
    assert fake.deleted == [(world["general"], msg.id)] and sent.deleted
    with pytest.raises(discord.NotFound) as err:
        await channel.fetch_message(msg.id)
    assert err.value.code == 10008


async def test_send_file_multipart_and_reply(fake: FakeDiscord, world: dict, bot: Bot):
    incoming = fake.inject_message(world["general"], "send me the csv")
    [user_msg] = await until(lambda: bot.from_users())
    data = b"a,b\n1,2\n"
    reply = await user_msg.reply("here it is", file=discord.File(io.BytesIO(data), "report.csv"))
    [sent] = fake.messages(world["general"])
    [att] = sent.attachments
    assert (att.filename, att.data) == ("report.csv", data)
    assert att.uploaded_content_type == "application/octet-stream"    # what discord.py sends
    assert att.content_type == "text/csv; charset=utf-8"              # what Discord reports
    assert sent.reply_to == int(incoming["id"]) and reply.reference.message_id == user_msg.id
    assert await reply.attachments[0].read() == data
    # edit keeps the old attachment and adds one
    await reply.edit(content="v2", attachments=[*reply.attachments, discord.File(io.BytesIO(b"x"), "b.txt")])
    assert [a.filename for a in sent.edits[-1].attachments] == ["report.csv", "b.txt"]


async def test_content_limit_and_empty_message(fake: FakeDiscord, world: dict, bot: Bot):
    channel = bot.get_channel(world["general"])
    await channel.send("x" * 2000)
    with pytest.raises(discord.HTTPException) as err:
        await channel.send("x" * 2001)
    assert err.value.status == 400 and err.value.code == 50035
    assert "Must be 2000 or fewer in length." in err.value.text
    with pytest.raises(discord.HTTPException) as err:
        await channel.send("")
    assert err.value.code == 50006
    assert len(fake.messages(world["general"])) == 1


async def test_errors_unknown_channel_forbidden_and_server_errors(fake: FakeDiscord, world: dict, bot: Bot):
    with pytest.raises(discord.NotFound) as nf:
        await bot.get_partial_messageable(123456789012345678).send("hi")
    assert nf.value.code == 10003
    channel = bot.get_channel(world["general"])
    fake.fail_next("send_message", 403, 50013)
    with pytest.raises(discord.Forbidden) as fb:
        await channel.send("no")
    assert fb.value.code == 50013 and "Missing Permissions" in fb.value.text
    fake.forbid(world["dm"], 50007)
    with pytest.raises(discord.Forbidden) as fb:
        await bot.get_partial_messageable(world["dm"]).send("no")
    assert fb.value.code == 50007 and "Cannot send messages to this user" in fb.value.text
    fake.fail_next("send_message", 503)
    with pytest.raises(discord.DiscordServerError):
        await channel.send("down")
    fake.fail_next("send_message", 500)          # discord.py retries a 500 after 1 s by itself
    await channel.send("eventually")
    statuses = [c.status for c in fake.calls_to("send_message")]
    assert statuses[-2:] == [500, 200]
    fake.drop_next("send_message")
    with pytest.raises((aiohttp.ClientError, OSError)):
        await channel.send("dropped")


async def test_auth_and_exact_content_type(fake: FakeDiscord, world: dict):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{fake.api_base}/users/@me") as r:
            assert r.status == 401 and r.headers["Content-Type"] == "application/json"
            assert await r.json() == {"message": "401: Unauthorized", "code": 0}
        async with s.get(f"{fake.api_base}/users/@me", headers={"Authorization": f"Bot {fake.token}"}) as r:
            assert r.status == 200 and r.headers["Content-Type"] == "application/json"
            assert r.headers["Via"] == "1.1 google"
        async with s.get(f"{fake.api_base}/gateway") as r:         # no auth needed
            assert (await r.json())["url"] == fake.gateway_url
    with fake.redirect():
        client = discord.Client(intents=discord.Intents.default())
        with pytest.raises(discord.LoginFailure):
            await client.login("not-the-token")
        await client.close()


# ---------------------------------------------------------------------- rate limits
async def test_rate_limit_with_via_is_retried(fake: FakeDiscord, world: dict, bot: Bot):
    channel = bot.get_channel(world["general"])
    fake.rate_limit_next("send_message", 0.3)
    t0 = time.monotonic()
    await channel.send("after a 429")
    assert time.monotonic() - t0 >= 0.3
    calls = fake.calls_to("send_message")
    assert [c.status for c in calls] == [429, 200] and calls[0].rate_limited
    assert [s.content for s in fake.messages(world["general"])] == ["after a 429"]


async def test_global_rate_limit_is_retried(fake: FakeDiscord, world: dict, bot: Bot):
    fake.rate_limit_next("*", 0.2, global_=True)
    t0 = time.monotonic()
    await bot.get_channel(world["general"]).send("after a global 429")
    assert time.monotonic() - t0 >= 0.2
    assert [c.status for c in fake.calls_to("send_message")] == [429, 200]


async def test_429_without_via_raises_at_once(fake: FakeDiscord, world: dict, bot: Bot):
    fake.rate_limit_next("send_message", 5.0, via=False)
    t0 = time.monotonic()
    with pytest.raises(discord.HTTPException) as err:
        await bot.get_channel(world["general"]).send("banned")
    assert err.value.status == 429 and time.monotonic() - t0 < 2


async def test_bucket_headers_make_discord_py_wait(fake: FakeDiscord, world: dict, bot: Bot):
    fake.set_bucket("send_message", limit=2, per=0.4)
    channel = bot.get_channel(world["general"])
    t0 = time.monotonic()
    for i in range(4):
        await channel.send(f"m{i}")
    assert time.monotonic() - t0 >= 0.35
    assert len(fake.messages(world["general"])) == 4


async def test_nonce_is_enforced(fake: FakeDiscord, world: dict, bot: Bot):
    channel = bot.get_channel(world["general"])
    a = await channel.send("once", nonce="run-1")
    b = await channel.send("once", nonce="run-1")
    assert a.id == b.id and len(fake.messages(world["general"])) == 1


# ---------------------------------------------------------------------- gateway: resume & friends
async def test_close_4000_resumes_and_replays_missed_events(fake: FakeDiscord, world: dict, bot: Bot):
    assert fake.disconnect(4000) == 1
    missed = [fake.inject_message(world["general"], f"while away {i}") for i in range(2)]
    [resume] = await fake.wait_for_resumes()
    got = await until(lambda: len(m := bot.from_users()) >= 2 and m, what="missed messages")
    assert [m.id for m in got] == [int(x["id"]) for x in missed]
    assert len(resume.replayed) == 2
    assert len([i for i in fake.identifies if i.accepted]) == 1      # RESUME, not a new IDENTIFY
    assert fake.connections[-1].path == "/gw-resume/"               # READY's resume_gateway_url
    assert fake.connections[0].close_code == 4000 and fake.connections[0].closed_by == "server"
    await until(lambda: "resumed" in bot.events)
    fake.inject_message(world["general"], "live again")
    await until(lambda: len(bot.from_users()) == 3)


async def test_resume_can_resend_already_delivered_events(fake: FakeDiscord, world: dict, bot: Bot):
    fake.resend_on_resume = 1
    first = fake.inject_message(world["general"], "delivered once")
    await until(lambda: bot.from_users())
    fake.disconnect(4000)
    second = fake.inject_message(world["general"], "missed")
    await fake.wait_for_resumes()
    got = await until(lambda: len(m := bot.from_users()) >= 3 and m)
    assert [m.id for m in got] == [int(first["id"]), int(first["id"]), int(second["id"])]


async def test_dropped_tcp_connection_resumes(fake: FakeDiscord, world: dict, bot: Bot):
    fake.disconnect(None)
    fake.inject_message(world["general"], "after the drop")
    await fake.wait_for_resumes()
    await until(lambda: bot.from_users())
    assert fake.connections[0].closed_by == "abort"


async def test_reconnect_op7_resumes(fake: FakeDiscord, world: dict, bot: Bot):
    assert fake.send_reconnect() == 1
    fake.inject_message(world["general"], "after op 7")
    await fake.wait_for_resumes()
    await until(lambda: bot.from_users())
    assert len([i for i in fake.identifies if i.accepted]) == 1


async def test_invalid_session_resumable_resumes(fake: FakeDiscord, world: dict, bot: Bot):
    fake.invalidate_session(resumable=True)
    await fake.wait_for_resumes()
    assert len([i for i in fake.identifies if i.accepted]) == 1


async def test_invalid_session_not_resumable_reidentifies(fake: FakeDiscord, world: dict, bot: Bot):
    old = fake.sessions[0].id
    fake.invalidate_session(resumable=False)
    fake.inject_message(world["general"], "lost with the old session")
    idents = await fake.wait_for_identifies(2)
    assert idents[1].session_id != old
    assert fake.connections[-1].path == "/gw/"                      # back to DEFAULT_GATEWAY
    await until(lambda: bot.events.count("ready") == 2, what="second READY")
    assert bot.get_guild(world["guild"]) is not None
    assert bot.from_users() == []                                    # a new session replays nothing
    fake.inject_message(world["general"], "new session")
    [msg] = await until(lambda: bot.from_users())
    assert msg.content == "new session"


async def test_close_4009_resume_fails_then_identify(fake: FakeDiscord, world: dict, bot: Bot):
    fake.disconnect(4009)                   # session timed out: discord.py tries RESUME, gets op 9
    await fake.wait_for_identifies(2)
    assert fake.resumes and not fake.resumes[0].accepted


async def test_close_4004_is_fatal(fake: FakeDiscord, world: dict):
    with fake.redirect():
        client = Bot()
        task = await start_bot(fake, client)
        fake.disconnect(4004)
        with pytest.raises(discord.ConnectionClosed) as err:
            await asyncio.wait_for(task, 5)
        assert err.value.code == 4004
        await client.close()


async def test_disallowed_privileged_intent(world: dict):
    async with FakeDiscord(privileged_intents=PRIVILEGED_INTENTS & ~INTENT_MESSAGE_CONTENT) as server:
        with server.redirect():
            client = Bot(message_content=True)
            with pytest.raises(discord.PrivilegedIntentsRequired):
                await asyncio.wait_for(client.start(server.token), 5)
            await client.close()
        assert server.identifies[0].close_code == 4014


async def test_members_intent_gets_all_members(fake: FakeDiscord, world: dict):
    with fake.redirect():
        client = Bot(members=True)
        task = await start_bot(fake, client)
        try:
            guild = client.get_guild(world["guild"])
            assert guild.chunked and {m.name for m in guild.members} == {"alice", "bob", "pluto_test_bot"}
        finally:
            await stop_bot(client, task)


async def test_fetch_channel_thread_dm_and_history(fake: FakeDiscord, world: dict, bot: Bot):
    thread = await bot.fetch_channel(world["thread"])
    assert isinstance(thread, discord.Thread) and thread.parent_id == world["general"]
    assert thread.type == discord.ChannelType.public_thread
    dm = await bot.fetch_channel(world["dm"])
    assert isinstance(dm, discord.DMChannel)
    for i in range(3):
        fake.inject_message(world["general"], f"h{i}")
    history = [m.content async for m in bot.get_channel(world["general"]).history(limit=2)]
    assert history == ["h2", "h1"]
    user = await bot.fetch_user(world["bob"])
    dm_with_bob = await user.create_dm()
    await dm_with_bob.send("hello bob")
    assert fake.messages(dm_with_bob.id)[0].content == "hello bob"


async def test_auto_sharded_client_uses_gateway_bot(fake: FakeDiscord, world: dict):
    class ShardedBot(discord.AutoShardedClient):
        def __init__(self) -> None:
            intents = discord.Intents.default()
            intents.message_content = True
            super().__init__(intents=intents, guild_ready_timeout=0.1)
            self.got: list[discord.Message] = []
            self.ready_event = asyncio.Event()

        async def on_ready(self):
            self.ready_event.set()

        async def on_message(self, message):
            self.got.append(message)

    with fake.redirect():
        client = ShardedBot()
        task = asyncio.create_task(client.start(fake.token))
        try:
            await asyncio.wait_for(client.ready_event.wait(), 5)
            assert fake.calls_to("gateway_bot") and fake.identifies[0].shard == [0, 1]
            fake.inject_message(world["general"], "to shard 0")
            [msg] = await until(lambda: client.got)
            assert msg.guild is not None and msg.guild.shard_id == 0
        finally:
            await client.close()
            await asyncio.gather(task, return_exceptions=True)


async def test_unknown_routes_and_versions(fake: FakeDiscord):
    auth = {"Authorization": f"Bot {fake.token}"}
    async with aiohttp.ClientSession(headers=auth) as s:
        async with s.get(f"{fake.api_base}/nope") as r:
            assert r.status == 404 and await r.json() == {"message": "404: Not Found", "code": 0}
        async with s.put(f"{fake.api_base}/channels/1/typing") as r:
            assert r.status == 405
        async with s.get(f"{fake.url}/api/v6/users/@me") as r:
            assert r.status == 400
        async with s.get(f"{fake.api_base}/channels/1") as r:
            assert r.status == 404 and (await r.json())["code"] == 10003
        async with s.post(f"{fake.api_base}/channels/1/messages", data=b"{not json",
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["code"] == 50109


async def test_redeliver_user_edit_and_delete(fake: FakeDiscord, world: dict, bot: Bot):
    edits, deletes = [], []
    bot.on_raw_message_edit = lambda payload: _append(edits, payload)       # type: ignore[method-assign]
    bot.on_raw_message_delete = lambda payload: _append(deletes, payload)   # type: ignore[method-assign]
    msg = fake.inject_message(world["general"], "once")
    fake.redeliver(world["general"], int(msg["id"]))
    got = await until(lambda: len(m := bot.from_users()) >= 2 and m)
    assert got[0].id == got[1].id == int(msg["id"])                      # a duplicate delivery
    fake.inject_edit(world["general"], int(msg["id"]), "edited")
    fake.inject_delete(world["general"], int(msg["id"]))
    await until(lambda: edits and deletes)
    assert edits[0].data["content"] == "edited" and deletes[0].message_id == int(msg["id"])


async def _append(bucket: list, item) -> None:
    bucket.append(item)


async def test_resume_that_loses_missed_events(fake: FakeDiscord, world: dict, bot: Bot):
    fake.replay_missed = False
    fake.disconnect(4000)
    fake.inject_message(world["general"], "lost")
    [resume] = await fake.wait_for_resumes()
    assert resume.replayed == []
    fake.inject_message(world["general"], "live")
    [msg] = await until(lambda: bot.from_users())
    assert msg.content == "live"
