"""What the provider knows of the server, looked up once and kept (bounded): each channel's
type and team, which threads the bot takes part in, which posts it wrote, users' names."""

from __future__ import annotations

import logging
from collections import OrderedDict

from pluto.providers.kit.bounded import remember
from pluto.providers.mattermost.api import MattermostApi
from pluto.providers.mattermost.errors import FAILURES, provider_error
from pluto.providers.mattermost.inbound import CHANNEL_TYPES, Post

log = logging.getLogger(__name__)

REMEMBERED = 4096


class Known:
    def __init__(self, api: MattermostApi):
        self.api = api
        self.bot_id = ""
        self._channels: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id → (type, team)
        self._mine: OrderedDict[str, bool] = OrderedDict()  # post → written by the bot?
        self._threads: OrderedDict[str, None] = OrderedDict()  # threads the bot is part of
        self._names: OrderedDict[str, str] = OrderedDict()  # user id → username

    def note_channel(self, channel_id: str, kind: object, team: object) -> None:
        if kind in CHANNEL_TYPES:
            remember(self._channels, channel_id, (str(kind), str(team or "")), REMEMBERED)

    async def channel(self, channel_id: str) -> tuple[str, str]:
        """The channel's type (``D``, ``G``, ``O``, ``P``) and team; an open channel when it
        cannot be read (mentions only)."""
        known = self._channels.get(channel_id)
        if known is None:
            try:
                channel = await self.api.channel(channel_id)
            except FAILURES as e:
                log.warning("mattermost: channel %s unknown: %s", channel_id, provider_error(e))
                return "O", ""
            self.note_channel(channel_id, channel.get("type"), channel.get("team_id"))
            known = self._channels.get(channel_id, ("O", ""))
        return known

    async def user_name(self, user_id: str) -> str | None:
        """A username for a post fetched by ``since`` (an event names its sender itself)."""
        known = self._names.get(user_id)
        if known is None:
            try:
                known = str((await self.api.user(user_id)).get("username") or "")
            except FAILURES as e:  # the id stands in for it
                log.debug("mattermost: user %s not read: %s", user_id, provider_error(e))
                return None
            remember(self._names, user_id, known, REMEMBERED)
        return known or None

    async def in_thread(self, post: Post) -> bool:
        """Whether the post continues a thread the bot takes part in."""
        root = post.root_id
        if not root:
            return False
        if root in self._threads:
            return True
        known = self._mine.get(root)
        if known is None:
            try:
                known = str((await self.api.post(root)).get("user_id")) == self.bot_id
            except FAILURES as e:  # not provably the bot's
                log.debug("mattermost: post %s not read: %s", root, provider_error(e))
                return False
            remember(self._mine, root, known, REMEMBERED)
        return known

    def join_thread(self, root: str) -> None:
        remember(self._threads, root, None, REMEMBERED)

    def sent(self, post_id: str, thread: str | None) -> None:
        """The bot wrote ``post_id`` (in ``thread``)."""
        remember(self._mine, post_id, True, REMEMBERED)
        if thread:
            self.join_thread(thread)
