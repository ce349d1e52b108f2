"""Data in every chat, no model needed: ``/sql``, ``/datasets``, ``/describe``, and files sent
in a chat becoming datasets of that conversation.

What a chat sees is its scope: the files sent in that conversation (owned by its session key)
and the global datasets its agent lists in ``datasets:`` (``"*"``: all).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pluto.agents.registry import AgentRegistry
from pluto.errors import PlutoError, StorageError
from pluto.gateway.pipeline.commands import Commands, Failed
from pluto.settings import PlutoConfig, TranscriptionConfig, VoiceConfig
from pluto.types import Attachment, IncomingMessage, Route
from pluto.runtime.data.ingest_limits import IngestLimits
from pluto.runtime.data.service import (DataService, DatasetSource, QueryLimits, Retention,
                                        is_data_file)
from pluto.runtime.files import SharedFiles
from pluto.runtime.images import CANNOT_SEE, Limits, is_image, keep_images, neutralized
from pluto.runtime.model import ModelSettings
from pluto.runtime.voice import (Endpoint, Speech, SpokenAnswer, VoiceLimits, heard, is_audio,
                                 transcribe_notes)
from pluto.storage.ports import BlobStore, ConversationStore

if TYPE_CHECKING:
    from pluto.runtime.data import DatasetInfo, Scope

log = logging.getLogger(__name__)

# (text, kind): a notice or an error for the chat, awaited until it is handed over
Notify = Callable[[str, Literal["notice", "error"]], Awaitable[object]]
SQL_ROWS = 25  # rows a /sql reply shows
EXAMPLE = "SELECT region, sum(amount) FROM sales GROUP BY 1"


def shared_files(config: PlutoConfig, data_dir: Path, blobs: BlobStore | None) -> SharedFiles:
    """The data dir's files as every instance reads them (``storage.files_max_*``)."""
    return SharedFiles(data_dir, blobs, max_bytes=int(config.storage.files_max_mb * 2**20),
                       max_total=int(config.storage.files_max_total_mb * 2**20))


def data_service(config: PlutoConfig, config_dir: Path, data_dir: Path, *,
                 files: SharedFiles | None = None) -> DataService:
    """The gateway's data, from ``data:`` in pluto.yaml (paths relative to the config dir)."""
    data = config.data
    sources = [DatasetSource(f.name, f.path if f.path.is_absolute() else config_dir / f.path)
               for f in data.datasets]
    return DataService(data_dir, sources, demo=data.demo, files=files,
                       max_upload_bytes=int(data.max_upload_mb * 2**20),
                       limits=QueryLimits(timeout=data.query_timeout_seconds,
                                          memory_limit=f"{data.query_memory_mb}MB"),
                       retention=Retention(max_age_days=data.keep_files_days,
                                           max_total_bytes=int(data.keep_files_max_mb * 2**20)),
                       ingest=IngestLimits(memory_limit=f"{data.ingest_memory_mb}MB",
                                           timeout=data.ingest_timeout_seconds,
                                           max_rows=data.ingest_max_rows,
                                           max_columns=data.ingest_max_columns))


def voice_limits(config: VoiceConfig) -> VoiceLimits:
    """The caps and the transcription endpoint of ``voice:`` in pluto.yaml (resolved: a model
    name is spelled out by ``PlutoConfig.voice_resolved``)."""
    t = config.transcription if isinstance(config.transcription, TranscriptionConfig) else None
    return VoiceLimits(max_seconds=config.max_seconds, max_bytes=int(config.max_mb * 2**20),
                       timeout=config.timeout_seconds, model=t.model if t else None,
                       api_base=t.api_base if t else None, api_key=t.api_key() if t else None)


def one_line(message: str) -> str:
    """DuckDB's message without the echo of the query that it appends (``LINE 1: ...``)."""
    text = message.split("\nLINE ")[0]
    return " ".join(text.split())


class DataCommands:
    def __init__(self, service: DataService, registry: AgentRegistry,
                 conversations: ConversationStore,
                 voice: Callable[[], VoiceConfig] = VoiceConfig):
        self.service = service
        self.voice = voice  # (read for each note: a reloaded pluto.yaml applies)
        self.registry = registry
        self.conversations = conversations
        self._preparing: asyncio.Task[None] | None = None
        self._told_blind: dict[str, None] = {}  # sessions told their model cannot see images

    def prepare_soon(self) -> None:
        """Prepare the warehouse in the background (a serving gateway), logging failures."""
        async def prepare() -> None:
            try:
                await self.service.ready()
            except Exception:
                log.exception("preparing the datasets failed")

        self._preparing = asyncio.create_task(prepare(), name="data:prepare")

    async def close(self) -> None:
        """Stop preparing (a DuckDB load in a worker thread finishes on its own)."""
        if self._preparing is not None and not self._preparing.done():
            self._preparing.cancel()
            await asyncio.gather(self._preparing, return_exceptions=True)
        self._preparing = None

    def register(self, commands: Commands) -> None:
        commands.add("datasets", "list the datasets you can ask about", self._datasets)
        commands.add("describe", "columns, statistics and sample rows of a dataset: "
                     "/describe NAME", self._describe)
        commands.add("sql", "run a read-only SQL query: /sql SELECT …", self._sql)
        from pluto.gateway.pipeline.python_command import PythonCommand

        PythonCommand(self).register(commands)  # /py: Python in the sandbox (issue 34)

    async def scope(self, route: Route) -> Scope:
        """What the chat may query (DuckDB and the agent's files are loaded off the loop)."""
        from pluto.runtime.data import preload

        await preload("child", "sandbox", "format", "warehouse", "describe")
        try:
            allowed = (await self.registry.load(route.agent)).datasets
        except (LookupError, PlutoError):
            allowed = ()  # an agent that cannot be loaded sees no global dataset
        return self.service.scope(route.session_key, allowed)

    # commands ---------------------------------------------------------------------------

    async def _datasets(self, msg: IncomingMessage, route: Route, args: str) -> str:
        found = await self.service.visible(await self.scope(route))
        if not found:
            return ("No datasets here yet. Send a CSV, TSV, Parquet or JSON file in this chat "
                    "and it becomes one.")
        lines = ["Datasets you can query (each is a table of the same name):"]
        lines += [f"- `{d.name}` — {shape(d)}"
                  + (" (sent in this chat)" if d.owner is not None else "") for d in found]
        from pluto.runtime.data import sql_name

        first = found[0].name
        lines += ["", f"Try `/describe {first}` or "
                  f"`/sql SELECT * FROM {sql_name(first)} LIMIT 5`."]
        return "\n".join(lines)

    async def _describe(self, msg: IncomingMessage, route: Route, args: str) -> str:
        from pluto.runtime.data import DataError
        from pluto.runtime.data.describe import describe, description_markdown

        name = args.strip().strip("`").strip()
        if not name:
            return "Which dataset? Send `/describe NAME`; `/datasets` lists them."
        try:
            info = await self.service.get(name, await self.scope(route))
            return description_markdown(await describe(info, self.service.limits))
        except DataError as e:
            return Failed(one_line(str(e)))

    async def _sql(self, msg: IncomingMessage, route: Route, args: str) -> str:
        from pluto.runtime.data import DataError, QueryRefused, result_markdown

        sql = _unfence(args)
        if not sql:
            return f"Send a query after /sql, e.g. `/sql {EXAMPLE}`. `/datasets` lists the tables."
        try:
            csv_path = self.service.artifact(f"sql-{uuid.uuid4().hex[:12]}", "result", ".csv")
            try:
                result = await self.service.query(sql, await self.scope(route),
                                                  max_rows=SQL_ROWS, csv_path=csv_path)
            except DataError:
                with contextlib.suppress(OSError):
                    csv_path.parent.rmdir()  # no empty folders for failed queries
                raise
        except QueryRefused as e:
            return Failed(f"The query was refused: {one_line(str(e))}")
        except DataError as e:
            return Failed(f"The query failed: {one_line(str(e))}")
        saved = csv_path.relative_to(self.service.data_dir) if result.truncated else None
        if saved is not None:
            await self.service.publish(csv_path)  # every instance's data dir can have it
        return result_markdown(result, max_rows=SQL_ROWS,
                               saved=f"{saved} in the data dir" if saved else None)

    # files sent in a chat ---------------------------------------------------------------

    async def take_uploads(self, msg: IncomingMessage, route: Route, session_id: str,
                           notify: Notify) -> str | None:
        """Make the data files of ``msg`` datasets of this conversation and say so.

        Returns the text the agent should get (the message, with a note about each new
        dataset), or None when there is nothing to run: only files were sent, or one of them
        could not be read (the user was told why)."""
        files = [a for a in msg.attachments if is_data_file(a.filename, a.mime_type)]
        if not files:
            return msg.text
        notes: list[str] = []
        failed = False
        asked = bool(msg.text.strip())
        added: list[str] = []
        for attachment in files:
            info = await self._add(attachment, route.session_key, notify)
            if info is None:
                failed = True
                continue
            hint = "" if asked else f" Ask me about it, or try `/describe {info.name}`."
            added.append(f"Added dataset `{info.name}`: {shape(info)}.{hint}")
            notes.append(_note(attachment.filename, info))
        if (failed or not asked) and notes:  # the agent learns of them with the next message
            await self.conversations.add_message(session_id, "user", "\n".join(notes))
        for line in added:  # (told once it is in the history: a tab reloaded then shows it)
            await notify(line, "notice")
        if failed or not asked:
            return None
        return msg.text + "\n\n" + "\n".join(notes)

    async def take_images(self, msg: IncomingMessage, text: str, run_id: str, session_id: str,
                          model: ModelSettings, notify: Notify) -> str | None:
        """``text`` with a note for each image ``msg`` came with, kept as an artifact of the
        run (runtime/images.py); each image refused is one sentence to the user. None when
        nothing is left to answer (no text, and no image could be read)."""
        images = [a for a in msg.attachments
                  if is_image(a) and not is_data_file(a.filename, a.mime_type)]
        text = neutralized(text)
        if not images:
            return text
        kept, problems = await keep_images(images, run_id, self.service.data_dir,
                                           Limits.of(model), self._located)
        for problem in problems:
            await notify(problem, "error")
        for image in kept:
            await self.service.publish(self.service.data_dir / image.key)
        if kept and not model.vision and session_id not in self._told_blind:
            self._told_blind[session_id] = None
            while len(self._told_blind) > 10_000:
                del self._told_blind[next(iter(self._told_blind))]
            await notify(CANNOT_SEE, "notice")
        notes = "\n".join(image.note() for image in kept)
        if not notes:
            return text if text.strip() else None
        return f"{text}\n\n{notes}" if text.strip() else notes

    async def take_voice(self, msg: IncomingMessage, text: str, notify: Notify) -> str | None:
        """``text`` joined by the words of each voice note ``msg`` came with (runtime/voice.py),
        each shown to the user as "heard: …"; a note not heard is one sentence. None when
        nothing is left to answer (no text, and no note could be heard)."""
        notes = [a for a in msg.attachments
                 if is_audio(a) and not is_data_file(a.filename, a.mime_type)]
        if not notes:
            return text
        sources = [await self._received(a) for a in notes]
        words, problems = await transcribe_notes(notes, voice_limits(self.voice()), sources)
        for problem in problems:
            await notify(problem, "error")
        for said in words:
            await notify(heard(said), "notice")
        joined = "\n\n".join([text, *words] if text.strip() else words)
        return joined if joined.strip() else None

    def spoken(self, agent: str, run_id: str) -> SpokenAnswer | None:
        """For an agent in ``voice.speak_agents``: what speaks its answer in this run."""
        config = self.voice()
        if agent not in config.speak_agents:
            return None
        t = config.speech
        speech = Speech(t.model, t.voice, Endpoint(t.api_base, t.api_key(),
                                                   config.timeout_seconds)) if t else None
        return SpokenAnswer(self.service.data_dir, run_id, config.timeout_seconds, speech)

    async def _received(self, attachment: Attachment) -> Path | None:
        """:meth:`_located`, or None (logged) when the shared store cannot be read now."""
        try:
            return await self._located(attachment)
        except StorageError as e:
            log.warning("%s could not be fetched: %s", attachment.filename, e)
            return None

    async def _located(self, attachment: Attachment) -> Path | None:
        """A file sent, in this data dir (fetched when another instance received it)."""
        path = attachment.path
        if path is not None and not Path(path).is_file():
            return await self.service.files.local(path)
        return Path(path) if path is not None else None

    async def _add(self, attachment: Attachment, owner: str,
                   notify: Notify) -> DatasetInfo | None:
        from pluto.runtime.data import DataError

        try:
            path = attachment.path
            if path is not None and not Path(path).is_file():  # sent to another instance
                path = await self.service.files.local(path)
            if path is None:
                raise FileNotFoundError(attachment.filename)
            return await self.service.add_upload(path, attachment.filename,
                                                 attachment.mime_type, owner)
        except DataError as e:
            await notify(one_line(str(e)), "error")
        except FileNotFoundError:
            await notify(f"I did not receive {attachment.filename}; please send it again.",
                         "error")
        except StorageError as e:  # kept on another instance, which cannot be read now
            log.warning("%s could not be fetched: %s", attachment.filename, e)
            await notify(f"Could not read {attachment.filename} right now; please send it "
                         "again in a minute.", "error")
        except Exception:
            log.exception("adding %s as a dataset failed", attachment.filename)
            await notify(f"Could not add {attachment.filename}: something went wrong on our "
                         "side; the error has been logged.", "error")
        return None


def _note(filename: str, info: DatasetInfo) -> str:
    from pluto.runtime.data import sql_name

    columns = ", ".join(f"{c.name} {c.type}" for c in info.columns[:30])
    more = f", … {len(info.columns) - 30} more" if len(info.columns) > 30 else ""
    return (f"[The user sent the file {filename}; it is now the dataset {info.name} "
            f"({shape(info)}: {columns}{more}). Query it as the table "
            f"{sql_name(info.name)}.]")


def shape(info: DatasetInfo) -> str:
    """'1,234 rows × 5 columns'."""
    from pluto.runtime.data import counted

    return f"{counted(info.rows, 'row')} × {counted(len(info.columns), 'column')}"


def _unfence(text: str) -> str:
    """The query without Markdown code fences or backticks a chat app may keep around it."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        text = text[3:-3]
        first, _, rest = text.partition("\n")
        text = rest if first.strip().lower() in ("sql", "duckdb") else text
    elif len(text) >= 2 and text[0] == text[-1] == "`":
        text = text[1:-1]
    return text.strip()
