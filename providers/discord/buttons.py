"""Approval buttons on Discord (docs/approvals.md, ``providers/kit/buttons.py``).

Shown: ``OutgoingMessage.buttons`` become one action row of buttons (primary / danger /
secondary), each ``custom_id`` the command it stands for (``payload_of``: at most 64 bytes,
within Discord's 100). The view is never stored in discord.py's view store: clicks come through
``on_interaction`` (INTERACTION_CREATE, type 3), whatever process sent the message.
Clicked: the ``custom_id`` is read back with ``command_of`` (anything else: an ephemeral "This
button is no longer valid", nothing handed over); the clicker is checked with
``ProviderContext.approvals``; Discord is answered within its 3 s — a refusal as an ephemeral
message only the clicker sees (type 4, flags 64), else a deferred update (type 6) — and the click
is handed over as the command from the clicker under ``click:<interaction id>``. Then the
buttons are taken off the request message (best effort).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import discord

from pluto.providers.kit.bounded import remember
from pluto.providers.kit.buttons import click_message, command_of, payload_of
from pluto.types import Button, IncomingMessage

log = logging.getLogger(__name__)

PROVIDER = "discord"
NOT_VALID = "This button is no longer valid."
ANSWERED = 4096  # interaction ids remembered as responded to
CHECK_WITHIN = 2.0  # seconds for the approvals check: Discord wants an answer within 3
STYLES = {"primary": discord.ButtonStyle.primary, "danger": discord.ButtonStyle.danger}
FAILURES = (discord.DiscordException, aiohttp.ClientError, OSError, asyncio.TimeoutError)
Check = Callable[[str, str, str, str], Awaitable[str | None]]


class _Row(discord.ui.View):
    """Buttons to show; never dispatched through discord.py's view store (see the module)."""

    def is_dispatchable(self) -> bool:
        return False


def view_of(buttons: tuple[Button, ...]) -> discord.ui.View | None:
    """The buttons as one action row (None when there are none to show)."""
    view = _Row(timeout=None)
    for button in buttons[:5]:
        try:
            custom_id = payload_of(button)
        except ValueError as e:
            log.warning("discord: a button left out: %s", e)
            continue
        view.add_item(discord.ui.Button(label=button.label[:80], custom_id=custom_id,
                                        style=STYLES.get(button.style,
                                                         discord.ButtonStyle.secondary)))
    return view if view.children else None


async def _check(approvals: Check | None, chat_id: str, user_id: str,
                 approval_id: str) -> str | None:
    """The approvals check, bounded by Discord's deadline: when it takes too long, the click is
    handed over and the gateway decides (it checks again when the message's turn comes)."""
    if approvals is None:
        return None
    try:
        async with asyncio.timeout(CHECK_WITHIN):
            return await approvals(PROVIDER, chat_id, user_id, approval_id)
    except TimeoutError:
        log.warning("discord: checking a click took over %gs; the gateway decides", CHECK_WITHIN)
        return None


async def receive(interaction: discord.Interaction, approvals: Check | None,
                  answered: OrderedDict[int, None]) -> IncomingMessage | None:
    """Respond to a component interaction; the message to hand over when the click is allowed.
    ``answered``: interactions responded to already (the same one dispatched again is not
    responded to twice: Discord would refuse, 40060)."""
    again = interaction.id in answered
    remember(answered, interaction.id, None, ANSWERED)
    data: dict[str, Any] = dict(interaction.data or {})
    found = command_of(data.get("custom_id"))
    user = interaction.user
    if found is None or interaction.channel_id is None or user.bot:
        if not again:
            await _respond(interaction, NOT_VALID)
        return None
    command, approval_id = found
    chat_id, user_id = str(interaction.channel_id), str(user.id)
    refusal = await _check(approvals, chat_id, user_id, approval_id)
    if refusal is not None:
        if not again:
            await _respond(interaction, refusal)
        return None
    if not again:
        try:
            await interaction.response.defer()  # type 6: DEFERRED_UPDATE_MESSAGE
        except discord.InteractionResponded:
            pass
        except FAILURES as e:
            log.info("discord: acknowledging interaction %s failed: %s", interaction.id,
                     type(e).__name__)
    thread = isinstance(interaction.channel, discord.Thread)
    return click_message(PROVIDER, chat_id=chat_id, user_id=user_id, command=command,
                         click_id=str(interaction.id), user_name=user.display_name,
                         thread_id=chat_id if thread else None,
                         guild_id=str(interaction.guild_id) if interaction.guild_id else None,
                         is_direct=interaction.guild_id is None)


async def _respond(interaction: discord.Interaction, text: str) -> None:
    """An ephemeral message only the clicker sees (type 4, flags 64)."""
    try:
        await interaction.response.send_message(text[:2000], ephemeral=True)
    except discord.InteractionResponded:
        pass
    except FAILURES as e:
        log.info("discord: answering interaction %s failed: %s", interaction.id,
                 type(e).__name__)


async def take_off(interaction: discord.Interaction) -> None:
    """Remove the buttons from the request message (best effort)."""
    message = interaction.message
    if message is None:
        return
    try:
        await message.edit(view=None)
    except FAILURES as e:
        log.debug("discord: taking the buttons off message %s failed: %s", message.id,
                  type(e).__name__)
