"""When a schedule fires: one-off times, intervals and cron expressions, in a time zone.

A :class:`When` is ``kind`` (``at``, ``every``, ``cron``), its expression as stored, and an IANA
time zone. :meth:`When.next_after` gives the first firing strictly after a moment (UTC seconds),
or None once a one-off is past. Cron is read by ``cronsim`` (maintained; Debian cron's rules),
in the schedule's zone, so DST is handled as cron does: on a spring-forward day a job in the
skipped hour runs at the first minute that exists (02:30 → 03:00), on a fall-back day a job in
the repeated hour runs once (the first 02:30), and ``0 9 * * *`` stays at 09:00 local across
the change. Intervals (``every 30m``) are exact durations, anchored at the schedule's first due
time, so they never drift and never fire twice to catch up.

Parsing what people write (``in 2h``, ``every weekday 9:00``, ``at 2026-12-01 09:00``) is
:func:`parse_spec`; every error is a :class:`BadTime` whose text is one sentence for the user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from pluto.errors import PlutoError

UTC = timezone.utc
KINDS = ("at", "every", "cron")
_UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
          "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
          "d": 86400, "day": 86400, "days": 86400, "w": 604800, "week": 604800,
          "weeks": 604800}
_DURATION = re.compile(r"(\d+)\s*([a-z]+)")
_DAYS = {"monday": "1", "tuesday": "2", "wednesday": "3", "thursday": "4", "friday": "5",
         "saturday": "6", "sunday": "0", "mon": "1", "tue": "2", "wed": "3", "thu": "4",
         "fri": "5", "sat": "6", "sun": "0"}
_CLOCK = re.compile(r"^(?:at\s+)?(\d{1,2})(?::(\d{2}))?\s*(am|pm)?$")
_TIMEISH = re.compile(r"^\d{1,2}(:\d{2})+$|^\d{1,2}(:\d{2})?(am|pm)$")


class BadTime(PlutoError, ValueError):
    """A time, interval, cron expression or time zone that cannot be used (``str``: one
    sentence saying what is wrong and what would work)."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadTime(f"'{name}' is not a time zone I know; use an IANA name such as "
                      "Europe/Berlin or UTC.") from None


def parse_duration(text: str) -> float:
    """``30m``, ``2h``, ``1h30m``, ``90 seconds`` → seconds."""
    s = text.strip().lower().replace(" and ", " ")
    total, pos = 0, 0
    for m in _DURATION.finditer(s):
        if s[pos:m.start()].strip(" ,"):
            break
        unit = _UNITS.get(m.group(2))
        if unit is None:
            raise BadTime(f"'{m.group(2)}' is not a unit of time I know; use s, m, h, d or w "
                          "(as in 30m or 2h).")
        total += int(m.group(1)) * unit
        pos = m.end()
    if pos == 0 or s[pos:].strip(" ,"):
        raise BadTime(f"'{text.strip()}' is not a duration; write it like 30m, 2h or 1h30m.")
    if total <= 0:
        raise BadTime("A duration must be longer than zero.")
    return float(total)


def check_cron(expr: str) -> str:
    """The expression, checked (5 fields: minute hour day month weekday)."""
    expr = " ".join(expr.split())
    if len(expr.split()) != 5:
        raise BadTime(f"'{expr}' is not a cron expression: it needs 5 fields (minute hour "
                      "day month weekday), e.g. '0 9 * * 1-5'.")
    try:
        CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError, IndexError) as e:
        reason = str(e).rstrip(".") or "it cannot be read"
        raise BadTime(f"'{expr}' is not a cron expression I can use ({reason.lower()}); "
                      "e.g. '0 9 * * 1-5' is 09:00 on weekdays.") from None
    return expr


def parse_at(text: str, tz: str, now: float) -> float:
    """An ISO date and time (``2026-12-01 09:00``, in ``tz`` unless it names an offset) or a
    relative one (``+5s``, ``+2h``) → UTC seconds."""
    s = text.strip()
    if s.startswith("+"):
        return now + parse_duration(s[1:])
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise BadTime(f"'{s}' is not a time I can read; write it like 2026-12-01 09:00 or "
                      "+2h.") from None
    if dt.tzinfo is None:
        dt = _local(dt, zone(tz))
    return dt.timestamp()


def _local(naive: datetime, tz: ZoneInfo) -> datetime:
    """A wall-clock time in ``tz``: one skipped by a spring-forward is moved to the first
    minute after it; one repeated by a fall-back is its first occurrence."""
    dt = naive.replace(tzinfo=tz, fold=0)
    while dt.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != dt.replace(tzinfo=None):
        naive += timedelta(minutes=1)
        dt = naive.replace(tzinfo=tz, fold=0)
    return dt


@dataclass(frozen=True, slots=True)
class When:
    kind: str  # at | every | cron
    expr: str  # at: UTC seconds as text; every: seconds as text; cron: the expression
    tz: str = "UTC"

    def check(self) -> When:
        zone(self.tz)
        if self.kind == "cron":
            check_cron(self.expr)
        elif self.kind in ("at", "every"):
            float(self.expr)
        else:
            raise BadTime(f"'{self.kind}' is not a kind of schedule; use at, every or cron.")
        return self

    def first(self, now: float) -> float | None:
        """The first due time of a schedule made at ``now``."""
        if self.kind == "at":
            return float(self.expr)
        if self.kind == "every":
            return now + float(self.expr)
        return self.next_after(now)

    def next_after(self, t: float, *, anchor: float | None = None) -> float | None:
        """The first firing strictly after ``t`` (None: a one-off, done). ``anchor``: a due
        time of an interval schedule (its firings are anchor + k × interval)."""
        if self.kind == "at":
            return None
        if self.kind == "every":
            step = float(self.expr)
            base = anchor if anchor is not None else t
            if base > t:
                return base
            return base + (int((t - base) // step) + 1) * step
        local = datetime.fromtimestamp(t, zone(self.tz))
        return next(iter(CronSim(self.expr, local))).timestamp()

    def interval(self) -> float | None:
        """The shortest gap between firings (for the minimum-interval rule), None for a
        one-off."""
        if self.kind == "at":
            return None
        if self.kind == "every":
            return float(self.expr)
        # the smallest gap among the next firings from a few starting points (cron's gaps vary)
        gaps = []
        for start in (0.0, 86400 * 200.0, 86400 * 10_000.0):
            it = iter(CronSim(self.expr, datetime.fromtimestamp(start, UTC)))
            times = [next(it).timestamp() for _ in range(6)]
            gaps += [b - a for a, b in zip(times, times[1:])]
        return min(gaps)

    def describe(self) -> str:
        if self.kind == "at":
            when = datetime.fromtimestamp(float(self.expr), zone(self.tz))
            return f"once at {when:%Y-%m-%d %H:%M} {self.tz}"
        if self.kind == "every":
            return f"every {format_duration(float(self.expr))}"
        return f"cron '{self.expr}' ({self.tz})"


def format_duration(seconds: float) -> str:
    out, left = [], int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            out.append(f"{left // size}{unit}")
            left %= size
    return "".join(out) or "0s"


def _clock(text: str) -> tuple[int, int] | None:
    m = _CLOCK.match(text.strip().lower())
    if m is None:
        return None
    hour, minute = int(m.group(1)), int(m.group(2) or 0)
    if m.group(3):
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if m.group(3) == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    return hour, minute


def parse_every(text: str, tz: str) -> When:
    """After ``every``: ``30m``, ``2h``, ``day 9:00``, ``weekday 9:00``, ``monday 8:30``,
    ``hour``; or a cron expression."""
    s = " ".join(text.lower().split())
    if len(s.split()) == 5 and not re.search(r"[a-z]{4,}", s):
        return When("cron", check_cron(s), tz).check()
    word, _, rest = s.partition(" ")
    if word in ("hour", "minute"):
        if rest:
            raise BadTime(f"'every {s}' takes no time of day; write e.g. 'every {word}'.")
        return When("every", str(float(_UNITS[word])), tz)
    days = {"day": "*", "weekday": "1-5", "weekdays": "1-5", "weekend": "0,6",
            **_DAYS, **{f"{d}s": n for d, n in _DAYS.items() if len(d) > 3}}
    if word in days:
        at = _clock(rest or "9:00") if rest else (9, 0)
        if at is None:
            raise BadTime(f"'{rest}' is not a time of day; write it like 9:00 or 5pm.")
        return When("cron", f"{at[1]} {at[0]} * * {days[word]}", tz).check()
    try:
        return When("every", str(parse_duration(s)), tz)
    except BadTime:
        raise BadTime(f"I don't understand 'every {text.strip()}'; try 'every 30m', 'every day "
                      "9:00', 'every weekday 9:00' or 'every monday 8:30'.") from None


@dataclass(frozen=True, slots=True)
class Spec:
    when: When
    prompt: str


_ZONE_WORD = re.compile(r"^(UTC|[A-Z][A-Za-z_]+(/[A-Za-z0-9_+-]+)+)$")


def parse_spec(text: str, tz: str, now: float) -> Spec:
    """``/remind``'s words: ``in 2h PROMPT``, ``every weekday 9:00 PROMPT``, ``at 2026-12-01
    09:00 PROMPT`` (``at`` also takes ``+2h`` or a time of day today/tomorrow). A time zone
    written among the words before the prompt (``every day 9:00 Europe/Berlin standup``) is
    the schedule's; else ``tz``."""
    words = text.split()
    for i, word in enumerate(words[:8]):
        if _ZONE_WORD.match(word):
            try:
                zone(word)
            except BadTime:
                continue
            return _parse_spec(" ".join(words[:i] + words[i + 1:]), word, now)
    return _parse_spec(text, tz, now)


def _parse_spec(text: str, tz: str, now: float) -> Spec:
    s = text.strip()
    low = s.lower()
    if low.startswith("in "):
        words = s[3:].split()
        # the longest leading run of words that reads as a duration
        for n in range(min(len(words), 6), 0, -1):
            try:
                seconds = parse_duration(" ".join(words[:n]))
            except BadTime:
                continue
            return Spec(When("at", str(now + seconds), tz), _prompt(words[n:]))
        raise BadTime(f"'{' '.join(words[:2])}' is not a duration; write e.g. '/remind in 2h "
                      "check the deploy'.")
    if low.startswith("every "):
        words = s[6:].split()
        for n in range(min(len(words), 5), 0, -1):
            try:
                when = parse_every(" ".join(words[:n]), tz)
            except BadTime:
                continue
            if words[n:] and _TIMEISH.match(words[n].lower()):  # "every day 25:00"
                raise BadTime(f"'{words[n]}' is not a time of day; write it like 9:00 or 5pm.")
            return Spec(when, _prompt(words[n:]))
        raise BadTime(f"I don't understand 'every {' '.join(words[:2])}'; try 'every 30m', "
                      "'every day 9:00' or 'every weekday 9:00'.")
    if low.startswith("at "):
        words = s[3:].split()
        for n in (2, 1):
            head = " ".join(words[:n])
            try:
                if n == 1 and (at := _clock(head)) is not None:
                    return Spec(When("at", str(_next_clock(at, tz, now)), tz),
                                _prompt(words[1:]))
                moment = parse_at("T".join(words[:n]) if n == 2 else head, tz, now)
            except BadTime:
                continue
            return Spec(When("at", str(moment), tz), _prompt(words[n:]))
        raise BadTime(f"'{' '.join(words[:2])}' is not a time I can read; write it like "
                      "'at 2026-12-01 09:00', 'at 17:30' or 'at +2h'.")
    raise BadTime("Say when first: '/remind in 2h …', '/remind every weekday 9:00 …' or "
                  "'/remind at 2026-12-01 09:00 …'.")


def _prompt(words: list[str]) -> str:
    prompt = " ".join(words).strip()
    if not prompt:
        raise BadTime("Say what to remind you of after the time, e.g. '/remind in 2h check "
                      "the deploy'.")
    return prompt


def _next_clock(at: tuple[int, int], tz: str, now: float) -> float:
    """The next time the clock in ``tz`` shows ``at`` (today, else tomorrow)."""
    z = zone(tz)
    today = datetime.fromtimestamp(now, z).replace(tzinfo=None)
    for days in (0, 1):
        day = today + timedelta(days=days)
        t = _local(day.replace(hour=at[0], minute=at[1], second=0, microsecond=0), z)
        if t.timestamp() > now:
            return t.timestamp()
    return now  # (unreachable)
