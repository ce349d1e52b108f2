"""Several instances: the data files a message carries (those that become datasets, the only
files an answer reads) are kept in the shared file store before the message is recorded,
because another instance may be the one that answers it (it fetches them into its own data dir
when it needs them: :meth:`pluto.runtime.files.SharedFiles.local`).
"""

from __future__ import annotations

import logging
from typing import Any

from pluto.errors import StorageError
from pluto.gateway.ports import Intake, Ticket
from pluto.runtime.data.service import is_data_file
from pluto.runtime.images import is_image
from pluto.runtime.files import SharedFiles
from pluto.types import IncomingMessage

log = logging.getLogger(__name__)


class UploadsFirst:
    """A provider's intake that shares a message's downloaded files, then hands it over."""

    def __init__(self, intake: Intake, files: SharedFiles):
        self.intake = intake
        self.files = files

    async def submit(self, msg: IncomingMessage) -> Ticket:
        await self.keep(msg)
        return await self.intake.submit(msg)

    async def offer(self, msg: IncomingMessage) -> Ticket | None:
        await self.keep(msg)
        return await self.intake.offer(msg)

    async def keep(self, msg: IncomingMessage) -> None:
        """Publish each data file and picture the provider saved in the data dir. One that
        cannot be kept (over a cap, storage down) is logged: the message still goes, and an
        instance without the file tells the user to send it again."""
        for attachment in msg.attachments:
            if attachment.path is None or self.files.key(attachment.path) is None or not (
                    is_data_file(attachment.filename, attachment.mime_type)
                    or is_image(attachment)):
                continue
            try:
                await self.files.publish(attachment.path)
            except (StorageError, OSError) as e:
                log.warning("%s: %s is only on this instance: %s", msg.provider,
                            attachment.filename, e)

    def __getattr__(self, name: str) -> Any:  # the rest of the intake, as it is
        return getattr(self.intake, name)
