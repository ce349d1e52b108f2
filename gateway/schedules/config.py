"""``schedules.yaml``, next to ``routes.yaml``: the admins' schedules and the limits for users.

::

    settings:
      max_per_user: 20        # active /remind schedules a person may have
      min_interval: 5m        # the shortest gap a user's recurring schedule may have
      misfire_grace: 5m       # a firing later than this is recorded missed, not run
      default_tz: UTC         # the zone of times people write without one
      zones:                  # ... by where they write (PROVIDER:CHAT, or PROVIDER)
        telegram: Europe/Berlin
      user_zones:             # ... by who writes (PROVIDER:USER): before the chat's
        telegram:42: America/New_York
    schedules:
      - name: sales-summary   # its id is file:sales-summary
        agent: analyst
        to: telegram:-100123  # PROVIDER:CHAT (thread: ID for a thread of it)
        cron: "0 9 * * 1-5"   # or at: 2026-12-01 09:00 / every: 30m
        tz: Europe/Berlin
        prompt: Summarise yesterday's sales in three lines.

Like ``routes.yaml`` it is read in a worker thread, checked whole (YAML, fields, agents,
expressions, zones) and applied only when valid; a bad edit is refused with
``file:line: field: problem`` and the last good version keeps running
(:class:`ScheduleFileWatcher`). Applying it puts each schedule in storage under its name and
stops the file's schedules that are gone; a schedule whose *when* is unchanged keeps its next
due time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from pluto.errors import ConfigError
from pluto.gateway.schedules.recurrence import BadTime, When, check_cron, parse_at, \
    parse_duration, zone
from pluto.yamldoc import YamlDoc

log = logging.getLogger(__name__)

FILE = "schedules.yaml"


def _seconds(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return parse_duration(v)
        except BadTime as e:
            raise ValueError(str(e)) from None
    return v


def _known_zone(v: str) -> str:
    try:
        zone(v)
    except BadTime as e:
        raise ValueError(str(e)) from None
    return v


Zone = Annotated[str, AfterValidator(_known_zone)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScheduleSettings(Strict):
    max_per_user: int = Field(default=20, ge=0, le=10_000)
    min_interval: float = Field(default=300.0, ge=1)  # seconds (the file may say 5m)
    misfire_grace: float = Field(default=300.0, ge=0)
    default_tz: str = "UTC"
    # the zone of times people write, by where they write: "PROVIDER:CHAT" or "PROVIDER"
    # (the most specific wins; else default_tz)
    zones: dict[str, Zone] = Field(default_factory=dict)
    # a person's own zone, "PROVIDER:USER": it wins over the chat's and the platform's
    user_zones: dict[str, Zone] = Field(default_factory=dict)

    _durations = field_validator("min_interval", "misfire_grace", mode="before")(_seconds)

    @field_validator("default_tz")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            zone(v)
        except BadTime as e:
            raise ValueError(str(e)) from None
        return v

    def zone_for(self, provider: str, chat_id: str, user_id: str | None = None) -> str:
        """The zone of times written in this chat (by this person: their own zone first)."""
        return (user_id is not None and self.user_zones.get(f"{provider}:{user_id}")) or \
            self.zones.get(f"{provider}:{chat_id}") or self.zones.get(provider) or \
            self.default_tz


class FileSchedule(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    agent: str
    to: str = Field(pattern=r"^[a-z][a-z0-9_-]*:.+$")
    at: str | None = None
    cron: str | None = None
    every: str | None = None
    tz: str | None = None
    prompt: str = Field(min_length=1, max_length=20_000)
    thread: str | None = None  # a thread of the chat, where the platform has them
    direct: bool = True  # the chat is a direct one (else a group or channel)
    active: bool = True

    @field_validator("at", "every", "cron", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return str(v) if v is not None and not isinstance(v, str) else v


class SchedulesFile(Strict):
    settings: ScheduleSettings = ScheduleSettings()
    schedules: list[FileSchedule] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Planned:
    """A schedule of the file, checked: where it goes and when."""

    spec: FileSchedule
    provider: str
    chat_id: str
    thread_id: str | None
    when: When

    @property
    def id(self) -> str:
        return f"file:{self.spec.name}"


@dataclass(frozen=True, slots=True)
class ScheduleConfig:
    settings: ScheduleSettings = ScheduleSettings()
    schedules: tuple[Planned, ...] = ()
    source: str = "(none)"


def load_schedules(config_dir: Path, agents: set[str] | None = None,
                   now: float = 0.0) -> ScheduleConfig:
    """``schedules.yaml`` parsed and checked (blocking: async code runs it in a thread); no
    file: the defaults and no schedules. Raises :class:`ConfigError` naming file and line."""
    path = config_dir / FILE
    if not path.exists():
        return ScheduleConfig()
    doc = YamlDoc(path)
    if doc.data is not None and not isinstance(doc.data, dict):
        raise ConfigError([(doc.name, 1, "", "expected 'schedules:' (a list) and 'settings:'")])
    spec = doc.validate(SchedulesFile)
    tz_default = spec.settings.default_tz
    planned, seen = [], set()
    for i, s in enumerate(spec.schedules):
        def problem(key: str, message: str) -> ConfigError:
            return ConfigError([(doc.name, doc.line_of(("schedules", i, key)),
                                 f"schedules[{i}].{key}", message)])
        if s.name in seen:
            raise problem("name", f"another schedule is already named '{s.name}'")
        seen.add(s.name)
        if agents is not None and s.agent not in agents:
            known = ", ".join(sorted(agents)) or "none"
            raise problem("agent", f"unknown agent '{s.agent}' (known: {known})")
        given = [k for k in ("at", "cron", "every") if getattr(s, k) is not None]
        if len(given) != 1:
            raise problem(given[1] if len(given) > 1 else "name",
                          "give exactly one of at, cron or every")
        kind = given[0]
        tz = s.tz or tz_default
        try:
            zone(tz)
        except BadTime as e:
            raise problem("tz", str(e)) from None
        try:
            when = _when(kind, str(getattr(s, kind)), tz, now)
        except BadTime as e:
            raise problem(kind, str(e)) from None
        provider, _, chat = s.to.partition(":")
        planned.append(Planned(s, provider, chat, s.thread, when))
    return ScheduleConfig(spec.settings, tuple(planned), doc.name)


def _when(kind: str, text: str, tz: str, now: float) -> When:
    if kind == "cron":
        return When("cron", check_cron(text), tz)
    if kind == "every":
        return When("every", str(parse_duration(text)), tz)
    if text.strip().startswith("+"):
        raise BadTime("a relative time (+2h) has no meaning in a file that is read again and "
                      "again; give a date and time such as 2026-12-01 09:00.")
    return When("at", str(parse_at(text, tz, now)), tz)


@dataclass(slots=True)
class ReloadState:
    problems: list[tuple[str, int | None, str, str]] = field(default_factory=list)
    applied: int = 0


class ScheduleFileWatcher:
    """Reads ``schedules.yaml`` again when it changes (every ``interval`` seconds a stat, in a
    thread); a valid edit is handed to ``apply``, a bad one logged and kept in :attr:`state`
    while the last good one stays."""

    def __init__(self, config_dir: Path, agents: Callable[[], set[str]],
                 apply: Callable[[ScheduleConfig], Awaitable[None]],
                 interval: Callable[[], float]):
        self.path = config_dir / FILE
        self.config_dir = config_dir
        self.agents = agents
        self.apply = apply
        self.interval = interval
        self.state = ReloadState()
        self._seen: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    async def remember(self) -> None:
        """The file as it is now counts as read (it was applied by the caller)."""
        self._seen = await asyncio.to_thread(self._stamp)

    async def check(self, *, force: bool = False) -> bool:
        """Read the file if it changed (or ``force``); whether a new version was applied."""
        stamp = await asyncio.to_thread(self._stamp)
        if stamp == self._seen and not force:
            return False
        self._seen = stamp
        try:
            config = await asyncio.to_thread(load_schedules, self.config_dir, self.agents())
        except ConfigError as e:
            if e.problems != self.state.problems:
                log.error("config: refused the edit of %s; the last good version keeps "
                          "running:\n%s", self.path, e)
            self.state.problems = e.problems
            return False
        if self.state.problems:
            log.info("config: %s is valid again", self.path)
        self.state.problems = []
        await self.apply(config)
        self.state.applied += 1
        return True

    def start(self) -> None:
        if self._task is None and self.interval() > 0:
            self._task = asyncio.create_task(self._run(), name="schedules-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval() or 1.0)
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - the last good schedules keep running
                log.exception("reading %s failed unexpectedly; keeping the schedules", self.path)
