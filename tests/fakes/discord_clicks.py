"""Message components and component interactions on the fake Discord.

- Components on a message (``components`` of POST/PATCH /channels/{id}/messages) are checked as
  Discord checks them: at most 5 action rows (type 1) of at most 5 buttons (type 2); a button has
  a style 1-5, a label of at most 80 characters, a ``custom_id`` of 1-100 characters (unique in
  the message) unless it is a link (style 5, ``url``); else 400 code 50035 "Invalid Form Body".
- A click: :meth:`Clicks.click` dispatches INTERACTION_CREATE (type 3, MESSAGE_COMPONENT) over
  the gateway to every session, as Discord does (no intent needed).
- The bot answers with POST /interactions/{id}/{token}/callback within 3 s: a response after
  that is 404 code 10062 "Unknown interaction" and a recorded failure, as is no response at all;
  a second response is 400 code 40060 "Interaction has already been acknowledged.". Type 4
  with flags 64 is an ephemeral message, recorded for the clicker alone (``notes_for``); type 4
  without it posts in the channel; types 6 (deferred update) and 7 (update the message) are
  accepted, 7 replacing the message's content/components.
"""

from __future__ import annotations

import copy
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from .discord_state import ApiError, form_error

DEADLINE = 3.0  # seconds Discord waits for an interaction's first response
EPHEMERAL = 1 << 6
MESSAGE_COMPONENT = 3
RESPONSE_TYPES = {4, 5, 6, 7}


@dataclass
class Interaction:
    """One component interaction and how the bot responded to it."""
    id: int
    token: str
    channel_id: int
    message_id: int
    user_id: int
    custom_id: str
    time: float = field(default_factory=time.monotonic)
    responded: float | None = None      # monotonic time of the accepted response
    response: dict | None = None        # the callback body
    late: bool = False


def check_components(components: Any) -> list[dict]:
    """A message's components as Discord validates them (returns them, or raises 50035)."""
    if components is None:
        return []
    if not isinstance(components, list):
        raise form_error("components", "MODEL_TYPE_CONVERT",
                         "Only iterables may be used in a ListType")
    if len(components) > 5:
        raise form_error("components", "BASE_TYPE_MAX_LENGTH", "Must be 5 or fewer in length.")
    seen: set[str] = set()
    for r, row in enumerate(components):
        if not isinstance(row, dict) or row.get("type") != 1:
            raise form_error(f"components.{r}", "UNION_TYPE_CHOICES",
                             "Value of field \"type\" must be one of (1,).")
        buttons = row.get("components") or []
        if not 1 <= len(buttons) <= 5:
            raise form_error(f"components.{r}.components", "BASE_TYPE_BAD_LENGTH",
                             "Must be between 1 and 5 in length.")
        for b, button in enumerate(buttons):
            where = f"components.{r}.components.{b}"
            if not isinstance(button, dict) or button.get("type") != 2:
                raise form_error(where, "UNION_TYPE_CHOICES", "Value of field \"type\" must be 2.")
            style = button.get("style")
            if style not in (1, 2, 3, 4, 5):
                raise form_error(f"{where}.style", "BASE_TYPE_CHOICES",
                                 "Value must be one of {1, 2, 3, 4, 5}.")
            if len(str(button.get("label") or "")) > 80:
                raise form_error(f"{where}.label", "BASE_TYPE_MAX_LENGTH",
                                 "Must be 80 or fewer in length.")
            custom_id = button.get("custom_id")
            if style == 5:
                if not button.get("url") or custom_id is not None:
                    raise form_error(where, "COMPONENT_LAYOUT_WIDTH_EXCEEDED",
                                     "Invalid link button")
                continue
            if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 100:
                raise form_error(f"{where}.custom_id", "BASE_TYPE_BAD_LENGTH",
                                 "Must be between 1 and 100 in length.")
            if custom_id in seen:
                raise form_error(f"{where}.custom_id", "COMPONENT_CUSTOM_ID_DUPLICATED",
                                 "Component custom id cannot be duplicated")
            seen.add(custom_id)
    return copy.deepcopy(components)


def buttons_of(components: list[dict] | None) -> list[tuple[str, str, int]]:
    """(label, custom_id, style) of the buttons in ``components``."""
    return [(b.get("label") or "", b.get("custom_id") or "", b.get("style") or 0)
            for row in components or [] for b in row.get("components") or []]


class Clicks:
    """The interaction half of the fake Discord (mixed into FakeDiscord)."""

    deadline = DEADLINE

    def _clicks_init(self) -> None:
        self.interactions: dict[int, Interaction] = {}
        self.ephemeral: list[tuple[int, str]] = []   # (user id, content) shown to that user alone

    def click(self, channel_id: int, message_id: int, custom_id: str, *, user: Any = None,
              interaction_id: int | None = None, message: dict | None = None) -> Interaction:
        """Someone clicks the button ``custom_id`` under the bot's message: INTERACTION_CREATE
        (``interaction_id`` repeats an earlier one: the same interaction dispatched again;
        ``message``: the message as the clicker's client shows it)."""
        fake: Any = self
        channel = fake._channels[int(channel_id)]
        msg = message or fake.message(int(channel_id), int(message_id))
        if msg is None:
            raise KeyError(f"fake Discord: no message {message_id} in channel {channel_id}")
        guild = fake._guild_of(channel)
        if user is None:
            user = channel["recipients"][0] if guild is None else fake.default_user
        who = fake._user_ref(user)
        if interaction_id is not None and interaction_id in self.interactions:
            inter = self.interactions[interaction_id]
        else:
            inter = Interaction(fake.snowflake(), secrets.token_urlsafe(48), int(channel_id),
                                int(message_id), int(who["id"]), custom_id)
            self.interactions[inter.id] = inter
        data: dict[str, Any] = {
            "id": str(inter.id), "application_id": str(fake.bot_user["id"]),
            "type": MESSAGE_COMPONENT, "token": inter.token, "version": 1,
            "data": {"custom_id": custom_id, "component_type": 2},
            "channel_id": str(channel_id), "channel": copy.deepcopy(channel),
            "message": copy.deepcopy(msg), "locale": "en-US", "app_permissions": "0",
            "entitlements": [], "attachment_size_limit": 10 * 1024 * 1024,
            "authorizing_integration_owners": {"0": str(guild["id"]) if guild else "0"},
            "context": 0 if guild else 1,
        }
        if guild is not None:
            guild["members"].setdefault(int(who["id"]), time.time())
            data["guild_id"] = str(guild["id"])
            data["guild_locale"] = "en-US"
            data["member"] = {**fake._member_json(guild, int(who["id"])), "permissions": "0"}
        else:
            data["user"] = copy.deepcopy(who)
        for session in list(fake._sessions.values()):
            if session.valid:
                fake._dispatch_to(session, "INTERACTION_CREATE", data)
        fake._notify()
        return inter

    async def wait_responded(self, interaction: Interaction, timeout: float = 5.0) -> Interaction:
        fake: Any = self
        await fake.wait_until(lambda: interaction.responded is not None, timeout,
                              f"interaction {interaction.id} to be responded to")
        return interaction

    @property
    def interaction_failures(self) -> list[str]:
        """Interactions not responded to within the 3 s (the clicker saw "This interaction
        failed")."""
        now = time.monotonic()
        out = []
        for inter in self.interactions.values():
            if inter.late or (inter.responded is None and now - inter.time > self.deadline):
                out.append(f"interaction {inter.id} ({inter.custom_id!r}) "
                           f"{'answered late' if inter.late else 'never answered'}")
        return out

    def notes_for(self, user_id: int) -> list[str]:
        """What the bot showed this user alone (ephemeral responses), oldest first."""
        return [text for uid, text in self.ephemeral if uid == int(user_id)]

    async def _r_interaction_callback(self, params: dict, body: Any, files: dict,
                                      query: dict) -> tuple[int, Any]:
        fake: Any = self
        inter = self.interactions.get(int(params["interaction_id"]))
        if inter is None or inter.token != params["interaction_token"]:
            raise ApiError(404, 10062, "Unknown interaction")
        if inter.responded is not None:
            raise ApiError(400, 40060, "Interaction has already been acknowledged.")
        if time.monotonic() - inter.time > self.deadline:
            inter.late = True
            raise ApiError(404, 10062, "Unknown interaction")
        body = body if isinstance(body, dict) else {}
        kind = body.get("type")
        if kind not in RESPONSE_TYPES:
            raise form_error("type", "BASE_TYPE_CHOICES", "Value must be one of {4, 5, 6, 7}.")
        data = body.get("data") if isinstance(body.get("data"), dict) else {}
        out: dict[str, Any] = {"interaction": {"id": str(inter.id), "type": MESSAGE_COMPONENT}}
        if kind == 4:
            content = fake._content_of(data)
            components = check_components(data.get("components"))
            if not content and not data.get("embeds"):
                raise ApiError(400, 50006)
            if int(data.get("flags") or 0) & EPHEMERAL:
                self.ephemeral.append((inter.user_id, content))
                mid = fake.snowflake()
                message = {"id": str(mid), "channel_id": str(inter.channel_id), "content": content,
                           "flags": EPHEMERAL, "type": 19, "components": components,
                           "author": copy.deepcopy(fake.bot_user), "attachments": [], "embeds": [],
                           "mentions": [], "mention_roles": [], "pinned": False, "tts": False,
                           "mention_everyone": False, "timestamp": _iso(), "edited_timestamp": None}
                out["interaction"].update(response_message_id=str(mid),
                                          response_message_ephemeral=True)
            else:
                status, message = await fake._r_send({"channel_id": str(inter.channel_id)},
                                                      {"content": content,
                                                       "components": components}, {}, {})
                out["interaction"].update(response_message_id=message["id"])
            out["resource"] = {"type": 4, "message": message}
        elif kind == 7:
            msg = fake.message(inter.channel_id, inter.message_id)
            if msg is not None:
                await fake._r_edit({"channel_id": str(inter.channel_id),
                                    "message_id": str(inter.message_id)}, data, {}, {})
        inter.responded, inter.response = time.monotonic(), copy.deepcopy(body)
        fake._notify()
        return (200, out) if query.get("with_response") in ("1", "true", "True") else (204, None)


def _iso() -> str:
    from .discord_state import iso
    return iso()
