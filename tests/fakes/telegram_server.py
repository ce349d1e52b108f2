"""A fake Telegram Bot API server for tests: python-telegram-bot talks to it over HTTP.

    async with FakeTelegram() as fake:
        app = (ApplicationBuilder().token(fake.token)
               .base_url(fake.base_url).base_file_url(fake.base_file_url).build())
        fake.inject_message(42, "hello")              # a user writes to the bot
        sent = await fake.wait_for_messages(42, 1)    # what the bot answered
        assert sent[0].text == "hi"

It behaves like api.telegram.org where a bot can tell: ``POST /bot<token>/<method>`` with
form, JSON or multipart bodies, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code",
"description"[, "parameters"]}`` with that HTTP status; getUpdates offsets and long polling,
409 while a webhook is set or when a second poller arrives; webhook pushes with the secret header
and retries; strict HTML/MarkdownV2 parsing (telegram_markup.py); length limits; per-chat message
ids; "message is not modified"; uploads and ``GET /file/bot<token>/<path>`` downloads.
The test controls (``inject_*``, ``fail_next``, ``wait_for_*``...), the records and the errors
are in telegram_state.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import aiohttp
from aiohttp import web

from .telegram_markup import parse_text
from .telegram_state import (QUERY_TOO_OLD, check_markup, CHAT_ACTIONS, MAX_CAPTION, MAX_TEXT, ApiError, Call, Controls, Described,
                             StoredFile, Upload, bad, coerce_param, image_size)

__all__ = ["FakeTelegram", "DEFAULT_TOKEN"]


def ogg_seconds(data: bytes) -> int:
    """An OGG/Opus stream's length: the last page's granule position (48 kHz samples)."""
    last = data.rfind(b"OggS")
    if last < 0 or last + 14 > len(data):
        return 0
    return round(int.from_bytes(data[last + 6:last + 14], "little") / 48_000)

DEFAULT_TOKEN = "123456789:AAFakeTokenForPlutoTests_0123456789ab"
METHODS = ["getMe", "getUpdates", "setWebhook", "deleteWebhook", "getWebhookInfo", "sendMessage",
           "editMessageText", "sendChatAction", "sendPhoto", "sendDocument", "sendVoice", "getFile", "setMyCommands",
           "getMyCommands", "deleteMyCommands", "deleteMessage", "answerCallbackQuery", "getChat",
           "editMessageReplyMarkup"]
NOT_MODIFIED = ("message is not modified: specified new message content and reply markup are exactly the "
                "same as a current content and reply markup of the message")


class FakeTelegram(Controls):
    """One fake bot on a local Bot API server. Use ``async with`` or ``start()`` / ``stop()``."""

    def __init__(self, token: str = DEFAULT_TOKEN, *, bot_username: str = "pluto_test_bot",
                 bot_name: str = "Pluto Test Bot", privacy_mode: bool = False, strict_chats: bool = True,
                 flood_limit: int | None = None, flood_retry_after: int = 1,
                 webhook_retry_delay: float = 0.2) -> None:
        super().__init__(token, bot_username, bot_name)
        self.privacy_mode = privacy_mode            # groups: only commands, mentions, replies reach the bot
        self.strict_chats = strict_chats            # unknown chat ids -> 400 "chat not found"
        self.flood_limit, self.flood_retry_after = flood_limit, flood_retry_after
        self.webhook_retry_delay = webhook_retry_delay
        self._methods = {m.lower(): (m, getattr(self, "_m_" + re.sub(r"(?<!^)([A-Z])", r"_\1", m).lower()))
                         for m in METHODS}
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._webhook_task: asyncio.Task | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """For ``ApplicationBuilder().base_url(...)`` (PTB appends the token)."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """For ``ApplicationBuilder().base_file_url(...)``."""
        return f"{self.url}/file/bot"

    async def start(self) -> "FakeTelegram":
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle_api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._handle_file)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()
        self._webhook_task = asyncio.create_task(self._webhook_loop())
        return self

    async def stop(self) -> None:
        self._closing = True
        self._notify()
        if self._webhook_task:
            self._webhook_task.cancel()
            await asyncio.gather(self._webhook_task, return_exceptions=True)
        if self._session:
            await self._session.close()
        if self._runner:
            await self._runner.cleanup()

    async def __aenter__(self) -> "FakeTelegram":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ HTTP
    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.json_response(ApiError(401).body(), status=401)
        entry = self._methods.get(request.match_info["method"].lower())
        if entry is None:
            return web.json_response(ApiError(404).body(), status=404)
        name, handler = entry
        try:
            params, files = await self._read_params(request)
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.code)
        call = Call(name, params, files)
        self.calls.append(call)
        self._notify()  # received (wait_for_calls(answered=False) sees a slow call in flight)
        try:
            delay = self._latency.get(name.lower(), self._latency.get("*", 0.0))
            if delay:
                await asyncio.sleep(delay)
            if self._take_failure(name, call):
                assert request.transport is not None
                request.transport.abort()           # the client sees a dropped connection
                return web.Response(status=500)
            result = await handler(params, files)
            body: dict[str, Any] = {"ok": True, "result": result}
            if isinstance(result, Described):
                body = {"ok": True, "result": result.result, "description": result.description}
            call.status, call.result = 200, body["result"]
        except ApiError as exc:
            body = exc.body()
            call.status, call.description = exc.code, exc.description
        except Exception as exc:  # a bug in the fake: answer like Telegram's 500, keep the cause visible
            body = ApiError(500, f"Internal Server Error: fake failed: {exc!r}").body()
            call.status, call.description = 500, body["description"]
        self._notify()
        return web.json_response(body, status=call.status)

    async def _read_params(self, request: web.Request) -> tuple[dict, dict[str, Upload]]:
        raw: dict[str, Any] = dict(request.query)
        files: dict[str, Upload] = {}
        ctype = request.content_type
        if ctype == "application/json":
            try:
                body = await request.json()
            except ValueError:
                body = None
            if not isinstance(body, dict):
                raise bad("can't parse JSON encoded request parameters")
            raw.update(body)
        elif ctype == "multipart/form-data":
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if part.filename is not None:            # type: ignore[union-attr]
                    data = await part.read()             # type: ignore[union-attr]
                    files[part.name or ""] = Upload(part.name or "", part.filename,
                                                    part.headers.get("Content-Type"), bytes(data))
                else:
                    raw[part.name or ""] = await part.text()  # type: ignore[union-attr]
        elif request.can_read_body:
            raw.update(await request.post())
        return {k: coerce_param(k, v) for k, v in raw.items()}, files

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return web.json_response(ApiError(401).body(), status=401)
        stored = self._files_by_path.get(request.match_info["path"])
        if stored is None:
            return web.json_response(ApiError(404).body(), status=404)
        return web.Response(body=stored.data, content_type=stored.mime_type or "application/octet-stream")

    # ------------------------------------------------------------------ shared checks
    def _chat(self, p: dict) -> dict:
        raw = p.get("chat_id")
        if raw in (None, ""):
            raise bad("chat_id is empty")
        if isinstance(raw, str) and raw.startswith("@"):
            chat = next((c for c in self._chats.values()
                         if (c.get("username") or "").lower() == raw[1:].lower()), None)
        else:
            try:
                cid = int(raw)
            except (TypeError, ValueError):
                raise bad("chat not found")
            chat = self._chats.get(cid)
            if chat is None and not self.strict_chats:
                chat = self.add_chat(cid)
        if chat is None:
            raise bad("chat not found")
        if chat["id"] in self._blocked:
            raise ApiError(403, "Forbidden: bot was blocked by the user" if chat["type"] == "private"
                           else "Forbidden: bot was kicked from the group chat")
        return chat

    def _check_flood(self, chat_id: int) -> None:
        if not self.flood_limit:
            return
        now = time.monotonic()
        window = self._flood.setdefault(chat_id, [])
        window[:] = [t for t in window if now - t < 1.0]
        if len(window) >= self.flood_limit:
            raise ApiError.too_many(self.flood_retry_after)
        window.append(now)

    def _reply_to(self, chat: dict, p: dict) -> dict | None:
        rp = p.get("reply_parameters") or {}
        mid = rp.get("message_id", p.get("reply_to_message_id"))
        if mid is None:
            return None
        target = rp.get("chat_id", chat["id"])
        target_id = int(target) if str(target).lstrip("-").isdigit() else chat["id"]
        msg = self._msgs.get((target_id, int(mid)))
        if msg is None and not rp.get("allow_sending_without_reply", p.get("allow_sending_without_reply")):
            raise bad("message to be replied not found")
        return msg

    def _bot_message(self, chat: dict, p: dict, reply: dict | None, **content: Any) -> dict:
        msg: dict[str, Any] = {"message_id": self._next_message_id(chat["id"]), "from": self.bot_user,
                               "chat": chat, "date": int(time.time())}
        thread = p.get("message_thread_id")
        if thread:
            msg["message_thread_id"] = thread
            msg["is_topic_message"] = bool(chat.get("is_forum"))
        if reply is not None:
            msg["reply_to_message"] = {k: v for k, v in reply.items() if k != "reply_to_message"}
        msg.update({k: v for k, v in content.items() if v not in (None, [])})
        markup = p.get("reply_markup")
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            msg["reply_markup"] = markup
        self._msgs[(chat["id"], msg["message_id"])] = msg
        return msg

    def _caption(self, p: dict) -> tuple[str, list[dict]]:
        caption, ents = parse_text(p.get("caption"), p.get("parse_mode"), p.get("caption_entities"))
        if len(caption) > MAX_CAPTION:
            raise bad("message caption is too long")
        return caption, ents

    def _input_file(self, p: dict, files: dict[str, Upload], field: str) -> tuple[bytes, str | None, str | None]:
        value = p.get(field)
        upload = files.get(field)
        if upload is None and isinstance(value, str) and value.startswith("attach://"):
            upload = files.get(value[len("attach://"):])
        if upload is not None:
            return upload.data, upload.filename, upload.content_type
        stored = self._files.get(value) if isinstance(value, str) else None
        if stored is not None:
            return stored.data, stored.file_name, stored.mime_type
        if not value:
            raise bad(f"there is no {field} in the request")
        raise bad("wrong file identifier/HTTP URL specified")

    # ------------------------------------------------------------------ Bot API methods
    async def _m_get_me(self, p: dict, files: dict) -> dict:
        return {**self.bot_user, "can_join_groups": True, "can_read_all_group_messages": not self.privacy_mode,
                "supports_inline_queries": False, "can_connect_to_business": False, "has_main_web_app": False}

    async def _m_get_updates(self, p: dict, files: dict) -> list[dict]:
        if self._webhook:
            raise ApiError(409, "Conflict: can't use getUpdates method while webhook is active; "
                                "use deleteWebhook to delete the webhook first")
        self._poll_gen += 1
        gen = self._poll_gen
        self._notify()                      # an older long poll still waiting now ends with 409
        if "allowed_updates" in p:
            self._allowed_updates = list(p["allowed_updates"] or [])
        limit = min(max(int(p.get("limit") or 100), 1), 100)
        deadline = asyncio.get_running_loop().time() + max(int(p.get("timeout") or 0), 0)
        self._confirm(p.get("offset"))
        while True:
            if gen != self._poll_gen:
                raise ApiError(409, "Conflict: terminated by other getUpdates request; "
                                    "make sure that only one bot instance is running")
            if self._webhook:
                raise ApiError(409, "Conflict: terminated by setWebhook request")
            batch = self._queue[:limit]
            remaining = deadline - asyncio.get_running_loop().time()
            if batch or self._closing or remaining <= 0:
                for item in batch:
                    item.delivered = True
                return [item.update for item in batch]
            await self._wait_change(remaining)

    def _confirm(self, offset: int | None) -> None:
        if offset is None:
            return
        if offset < 0:
            del self._queue[:max(len(self._queue) + offset, 0)]
        else:
            self._queue[:] = [q for q in self._queue
                              if q.update["update_id"] >= offset or (q.forced and not q.delivered)]

    async def _m_set_webhook(self, p: dict, files: dict) -> Described:
        url = p.get("url") or ""
        if not url:
            return await self._m_delete_webhook(p, files)
        if not re.match(r"^https?://[^/\s]+", url):
            raise bad("bad webhook: Failed to resolve host: Name or service not known")
        secret = p.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret):
            raise bad("bad webhook: Secret token contains unallowed characters")
        if p.get("drop_pending_updates"):
            self._queue.clear()
        if "allowed_updates" in p:
            self._allowed_updates = list(p["allowed_updates"] or [])
        same = self._webhook is not None and self._webhook["url"] == url
        self._webhook = {"url": url, "secret_token": secret, "max_connections": p.get("max_connections") or 40}
        self._webhook_error = None
        return Described(True, "Webhook is already set" if same else "Webhook was set")

    async def _m_delete_webhook(self, p: dict, files: dict) -> Described:
        if p.get("drop_pending_updates"):
            self._queue.clear()
        was_set, self._webhook = self._webhook is not None, None
        return Described(True, "Webhook was deleted" if was_set else "Webhook is already deleted")

    async def _m_get_webhook_info(self, p: dict, files: dict) -> dict:
        info: dict[str, Any] = {"url": "", "has_custom_certificate": False,
                                "pending_update_count": len(self._queue)}
        if self._webhook:
            info.update(url=self._webhook["url"], max_connections=self._webhook["max_connections"],
                        ip_address="127.0.0.1")
            if self._allowed_updates:
                info["allowed_updates"] = self._allowed_updates
            if self._webhook_error:
                info.update(last_error_date=self._webhook_error[0], last_error_message=self._webhook_error[1])
        return info

    async def _m_send_message(self, p: dict, files: dict) -> dict:
        text, ents = parse_text(p.get("text"), p.get("parse_mode"), p.get("entities"))
        chat = self._chat(p)
        if not text:
            raise bad("message text is empty")
        if len(text) > MAX_TEXT:
            raise bad("message is too long")
        check_markup(p.get("reply_markup"))
        reply = self._reply_to(chat, p)
        self._check_flood(chat["id"])
        msg = self._bot_message(chat, p, reply, text=text, entities=ents)
        self._record("message", msg, p, text, ents, raw=p.get("text"))
        return msg

    async def _m_edit_message_text(self, p: dict, files: dict) -> dict:
        text, ents = parse_text(p.get("text"), p.get("parse_mode"), p.get("entities"))
        if "inline_message_id" in p:
            raise bad("message to edit not found")
        chat = self._chat(p)
        if p.get("message_id") is None:
            raise bad("message identifier is not specified")
        msg = self._msgs.get((chat["id"], int(p["message_id"])))
        if msg is None:
            raise bad("message to edit not found")
        if msg["from"]["id"] != self.bot_user["id"]:
            raise bad("message can't be edited")
        if "text" not in msg:
            raise bad("there is no text in the message to edit")
        if not text:
            raise bad("message text is empty")
        if len(text) > MAX_TEXT:
            raise bad("MESSAGE_TOO_LONG")
        markup = p.get("reply_markup") if isinstance(p.get("reply_markup"), dict) else None
        check_markup(markup)
        if text == msg["text"] and ents == msg.get("entities", []) and markup == msg.get("reply_markup"):
            raise bad(NOT_MODIFIED)
        self._check_flood(chat["id"])
        msg.update(text=text, edit_date=int(time.time()))
        for key, value in (("entities", ents), ("reply_markup", markup)):
            if value:
                msg[key] = value
            else:
                msg.pop(key, None)
        self._record("edit", msg, p, text, ents, raw=p.get("text"))
        return msg

    async def _m_send_chat_action(self, p: dict, files: dict) -> bool:
        chat = self._chat(p)
        if p.get("action") not in CHAT_ACTIONS:
            raise bad("wrong parameter action in request")
        self.chat_actions.append((chat["id"], p["action"]))
        return True

    async def _m_send_photo(self, p: dict, files: dict) -> dict:
        caption, ents = self._caption(p)
        chat = self._chat(p)
        data, name, _ = self._input_file(p, files, "photo")
        size = image_size(data)
        if size is None:
            raise bad("IMAGE_PROCESS_FAILED")
        reply = self._reply_to(chat, p)
        self._check_flood(chat["id"])
        stored = self.add_file(data, file_name=name, mime_type="image/jpeg", folder="photos")
        photo = [{"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                  "width": size[0], "height": size[1], "file_size": len(data)}]
        msg = self._bot_message(chat, p, reply, photo=photo, caption=caption or None, caption_entities=ents)
        self._record("photo", msg, p, caption, ents, raw=p.get("caption"), stored=stored)
        return msg

    async def _m_send_document(self, p: dict, files: dict) -> dict:
        caption, ents = self._caption(p)
        chat = self._chat(p)
        data, name, mime = self._input_file(p, files, "document")
        if not data:
            raise bad("file must be non-empty")
        reply = self._reply_to(chat, p)
        self._check_flood(chat["id"])
        stored = self.add_file(data, file_name=name, mime_type=mime)
        msg = self._bot_message(chat, p, reply, document=self._document_json(stored),
                                caption=caption or None, caption_entities=ents)
        self._record("document", msg, p, caption, ents, raw=p.get("caption"), stored=stored)
        return msg

    async def _m_send_voice(self, p: dict, files: dict) -> dict:
        """A voice note: OGG/Opus (as the Bot API asks; MP3 and M4A are sent as audio), at most
        1 MB; its duration from the ``duration`` parameter, else read from the file."""
        caption, ents = self._caption(p)
        chat = self._chat(p)
        data, _, _ = self._input_file(p, files, "voice")
        if not data.startswith(b"OggS") or b"OpusHead" not in data[:200]:
            raise bad("wrong file type: a voice message must be OGG/Opus")
        if len(data) > 1024 * 1024:
            raise bad("file is too big")
        reply = self._reply_to(chat, p)
        self._check_flood(chat["id"])
        stored = self.add_file(data, file_name="voice.oga", mime_type="audio/ogg", folder="voice")
        voice = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                 "duration": int(p.get("duration") or ogg_seconds(data)), "mime_type": "audio/ogg",
                 "file_size": len(data)}
        msg = self._bot_message(chat, p, reply, voice=voice, caption=caption or None, caption_entities=ents)
        self._record("voice", msg, p, caption, ents, raw=p.get("caption"), stored=stored)
        return msg

    async def _m_get_file(self, p: dict, files: dict) -> dict:
        stored = self._files.get(p.get("file_id") or "")
        if stored is None:
            raise bad("invalid file_id")
        if len(stored.data) > 20 * 1024 * 1024:
            raise bad("file is too big")
        return {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id,
                "file_size": len(stored.data), "file_path": stored.file_path}

    async def _m_set_my_commands(self, p: dict, files: dict) -> bool:
        commands = p.get("commands")
        if not isinstance(commands, list):
            raise bad("can't parse commands JSON object")
        if len(commands) > 100:
            raise bad("BOT_COMMANDS_TOO_MUCH")
        for cmd in commands:
            if not re.fullmatch(r"[a-z0-9_]{1,32}", str(cmd.get("command", ""))):
                raise bad("BOT_COMMAND_INVALID")
            if not 1 <= len(str(cmd.get("description", ""))) <= 256:
                raise bad("BOT_COMMAND_DESCRIPTION_INVALID")
        self.commands = [{"command": c["command"], "description": c["description"]} for c in commands]
        return True

    async def _m_get_my_commands(self, p: dict, files: dict) -> list[dict]:
        return self.commands

    async def _m_delete_my_commands(self, p: dict, files: dict) -> bool:
        self.commands = []
        return True

    async def _m_delete_message(self, p: dict, files: dict) -> bool:
        chat = self._chat(p)
        key = (chat["id"], int(p.get("message_id") or 0))
        if self._msgs.pop(key, None) is None:
            raise bad("message to delete not found")
        self.deleted.append(key)
        return True

    async def _m_answer_callback_query(self, p: dict, files: dict) -> bool:
        """Each callback query is answered once, within its window; a second answer, an unknown
        id or a late one: 400 "query is too old" (a late one is also a recorded failure)."""
        query = self._callbacks.get(str(p.get("callback_query_id") or ""))
        if query is None or query.answered is not None:
            raise bad(QUERY_TOO_OLD)
        text = p.get("text")
        if text is not None and len(str(text)) > 200:
            raise bad("MESSAGE_TOO_LONG")
        query.answered = time.monotonic()
        query.text, query.show_alert = text, bool(p.get("show_alert"))
        if query.answered - query.time > self.callback_window:
            raise bad(QUERY_TOO_OLD)
        self.callback_answers.append(dict(p))
        return True

    async def _m_edit_message_reply_markup(self, p: dict, files: dict) -> dict:
        if "inline_message_id" in p:
            raise bad("message to edit not found")
        chat = self._chat(p)
        msg = self._msgs.get((chat["id"], int(p.get("message_id") or 0)))
        if msg is None:
            raise bad("message to edit not found")
        if msg["from"]["id"] != self.bot_user["id"]:
            raise bad("message can't be edited")
        markup = p.get("reply_markup") if isinstance(p.get("reply_markup"), dict) else None
        check_markup(markup)
        if not (markup or {}).get("inline_keyboard"):
            markup = None
        if markup == msg.get("reply_markup"):
            raise bad(NOT_MODIFIED)
        if markup:
            msg["reply_markup"] = markup
        else:
            msg.pop("reply_markup", None)
        msg["edit_date"] = int(time.time())
        self.markup_edits.append((chat["id"], msg["message_id"], markup))
        return msg

    async def _m_get_chat(self, p: dict, files: dict) -> dict:
        return {**self._chat(p), "accent_color_id": 0, "max_reaction_count": 11}

    # ------------------------------------------------------------------ webhook delivery
    async def _webhook_loop(self) -> None:
        assert self._session is not None
        while not self._closing:
            hook = self._webhook
            if not hook or not self._queue:
                await self._wait_change(None)
                continue
            item = self._queue[0]
            headers = {"Content-Type": "application/json"}
            if hook["secret_token"]:
                headers["X-Telegram-Bot-Api-Secret-Token"] = hook["secret_token"]
            error, reply = None, None
            try:
                async with self._session.post(hook["url"], data=json.dumps(item.update), headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    status = resp.status
                    if not 200 <= status < 300:
                        error = f"Wrong response from the webhook: {status} {resp.reason}"
                    elif resp.content_type == "application/json":
                        reply = await resp.json()
            except (aiohttp.ClientConnectorError, ConnectionRefusedError):
                status, error = 0, "Connection refused"
            except asyncio.TimeoutError:
                status, error = 0, "Read timeout expired"
            except (aiohttp.ClientError, OSError) as exc:
                status, error = 0, f"Connection failed: {type(exc).__name__}"
            self.webhook_deliveries.append({"update_id": item.update["update_id"], "url": hook["url"],
                                            "status": status, "error": error, "time": time.monotonic()})
            if error is None:
                if item in self._queue:
                    self._queue.remove(item)
                if isinstance(reply, dict) and reply.get("method"):
                    await self._webhook_reply_call(reply)
                self._notify()
            else:
                self._webhook_error = (int(time.time()), error)
                self._notify()
                await self._wait_change(self.webhook_retry_delay)

    async def _webhook_reply_call(self, reply: dict) -> None:
        """Telegram executes a method given in the webhook's response body (no result reported)."""
        entry = self._methods.get(str(reply["method"]).lower())
        if entry is None:
            return
        params = {k: coerce_param(k, v) for k, v in reply.items() if k != "method"}
        call = Call(entry[0], params, {})
        self.calls.append(call)
        try:
            call.result, call.status = await entry[1](params, {}), 200
        except ApiError as exc:
            call.status, call.description = exc.code, exc.description

    @staticmethod
    def _document_json(stored: StoredFile) -> dict:
        doc = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_size": len(stored.data)}
        if stored.file_name:
            doc["file_name"] = stored.file_name
        if stored.mime_type:
            doc["mime_type"] = stored.mime_type
        return doc
