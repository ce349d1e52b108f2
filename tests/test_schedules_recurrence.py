"""When schedules fire: cron in a time zone across DST (Europe/Berlin springs forward on
2026-03-29 02:00 → 03:00 and falls back on 2026-10-25 03:00 → 02:00), intervals, one-offs and
what people write after /remind — each refusal one sentence. The clock is handed in."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from pluto.gateway.schedules.recurrence import BadTime, When, check_cron, parse_at, parse_spec

BERLIN = ZoneInfo("Europe/Berlin")


def berlin(*a: int) -> float:
    return datetime(*a, tzinfo=BERLIN).timestamp()  # type: ignore[misc]


def walk(when: When, start: float, n: int) -> list[str]:
    out, t = [], start
    for _ in range(n):
        nxt = when.next_after(t)
        assert nxt is not None and nxt > t
        out.append(datetime.fromtimestamp(nxt, BERLIN).isoformat())
        t = nxt
    return out


def test_daily_9am_stays_9am_local_across_both_changes():
    when = When("cron", "0 9 * * *", "Europe/Berlin")
    assert walk(when, berlin(2026, 3, 28, 12), 2) == [
        "2026-03-29T09:00:00+02:00", "2026-03-30T09:00:00+02:00"]
    assert walk(when, berlin(2026, 10, 24, 12), 2) == [
        "2026-10-25T09:00:00+01:00", "2026-10-26T09:00:00+01:00"]
    # 24 h apart on ordinary days, 23 h and 25 h across the changes
    assert when.next_after(berlin(2026, 3, 28, 9)) - berlin(2026, 3, 28, 9) == 23 * 3600
    assert when.next_after(berlin(2026, 10, 24, 9)) - berlin(2026, 10, 24, 9) == 25 * 3600


def test_a_job_in_the_skipped_hour_runs_at_its_first_minute_that_exists():
    when = When("cron", "30 2 * * *", "Europe/Berlin")
    assert walk(when, berlin(2026, 3, 28, 12), 3) == [
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that night
        "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]


def test_a_job_in_the_repeated_hour_runs_once():
    when = When("cron", "30 2 * * *", "Europe/Berlin")
    fired = walk(when, berlin(2026, 10, 24, 12), 3)
    assert fired == ["2026-10-25T02:30:00+02:00",  # the first 02:30 only, not the second
                     "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00"]


def test_every_hour_in_utc_terms_has_no_gap_or_double_across_the_changes():
    when = When("cron", "0 * * * *", "Europe/Berlin")
    start = berlin(2026, 10, 25, 0)
    times, t = [], start
    for _ in range(5):
        t = when.next_after(t)  # type: ignore[assignment]
        times.append(t)
    assert [b - a for a, b in zip(times, times[1:])] == [3600.0] * 4


def test_intervals_keep_their_phase_and_never_catch_up():
    when = When("every", "1800.0")
    assert when.next_after(1000.0, anchor=100.0) == 1900.0
    assert when.next_after(100.0 + 1800 * 50 + 1, anchor=100.0) == 100.0 + 1800 * 51
    assert when.next_after(10.0, anchor=100.0) == 100.0
    assert When("at", "5.0").next_after(1.0) is None  # a one-off has no next


def test_one_offs_in_a_zone_and_relative():
    assert parse_at("2026-12-01 09:00", "Europe/Berlin", 0) == berlin(2026, 12, 1, 9)
    assert parse_at("2026-12-01T09:00:00+00:00", "Europe/Berlin", 0) == \
        datetime(2026, 12, 1, 9, tzinfo=ZoneInfo("UTC")).timestamp()
    assert parse_at("+5s", "UTC", 100.0) == 105.0
    assert parse_at("+2h", "UTC", 100.0) == 7300.0
    # a wall-clock time skipped by the change: its first minute that exists
    assert parse_at("2026-03-29 02:30", "Europe/Berlin", 0) == berlin(2026, 3, 29, 3)


def test_remind_words():
    now = berlin(2026, 11, 26, 10)  # a Thursday
    spec = parse_spec("in 2h check the deploy", "Europe/Berlin", now)
    assert (spec.when.kind, spec.when.first(now) - now, spec.prompt) == \
        ("at", 7200.0, "check the deploy")
    spec = parse_spec("every weekday 9:00 sales summary", "Europe/Berlin", now)
    assert (spec.when.kind, spec.when.expr, spec.prompt) == ("cron", "0 9 * * 1-5",
                                                             "sales summary")
    assert spec.when.first(now) == berlin(2026, 11, 27, 9)
    spec = parse_spec("at 2026-12-01 09:00 quarterly numbers", "Europe/Berlin", now)
    assert (spec.when.first(now), spec.prompt) == (berlin(2026, 12, 1, 9), "quarterly numbers")
    spec = parse_spec("at 8:30 standup", "Europe/Berlin", now)  # passed today: tomorrow
    assert spec.when.first(now) == berlin(2026, 11, 27, 8, 30)
    spec = parse_spec("every 30m stretch", "UTC", now)
    assert (spec.when.kind, spec.when.first(now) - now) == ("every", 1800.0)
    spec = parse_spec("every monday 5pm week plan", "UTC", now)
    assert spec.when.expr == "0 17 * * 1"
    spec = parse_spec("every 0 9 * * 1-5 report", "UTC", now)
    assert spec.when.expr == "0 9 * * 1-5"


@pytest.mark.parametrize(("words", "says"), [
    ("tomorrow check", "Say when first"),
    ("in 2h", "Say what to remind you of"),
    ("in 2 parsecs check", "is not a duration"),
    ("every blue moon check", "I don't understand 'every blue moon'"),
    ("every day 25:00 check", "'25:00' is not a time of day"),
    ("at 2026-13-45 09:00 check", "is not a time I can read"),
    ("at never check", "is not a time I can read"),
])
def test_bad_times_are_one_sentence(words: str, says: str):
    with pytest.raises(BadTime) as e:
        parse_spec(words, "UTC", 0.0)
    text = str(e.value)
    assert says in text and "\n" not in text and "Traceback" not in text


@pytest.mark.parametrize("expr", ["61 * * * *", "* * *", "0 9 * * funday", "0 9 31 2 *"])
def test_bad_cron_is_one_sentence(expr: str):
    with pytest.raises(BadTime) as e:
        check_cron(expr)
    assert "cron expression" in str(e.value) and "\n" not in str(e.value)


def test_unknown_zone_is_one_sentence():
    with pytest.raises(BadTime, match="is not a time zone I know"):
        When("cron", "0 9 * * *", "Mars/Olympus").check()


def test_the_shortest_gap_of_a_cron():
    assert When("cron", "*/5 * * * *").interval() == 300.0
    assert When("cron", "0 9 * * 1-5").interval() == 86400.0
    assert When("every", "60.0").interval() == 60.0
    assert When("at", "1.0").interval() is None


def test_a_zone_among_the_words_is_the_schedules():
    now = berlin(2026, 11, 26, 10)
    spec = parse_spec("every day 9:00 Europe/Berlin standup", "UTC", now)
    assert (spec.when.tz, spec.when.expr, spec.prompt) == ("Europe/Berlin", "0 9 * * *",
                                                           "standup")
    spec = parse_spec("at 2026-12-01 09:00 America/New_York call", "UTC", now)
    assert spec.when.first(now) == datetime(2026, 12, 1, 14, tzinfo=ZoneInfo("UTC")).timestamp()
    spec = parse_spec("in 1h read a/b and Foo/Bar", "UTC", now)  # not zones: the prompt's
    assert (spec.when.tz, spec.prompt) == ("UTC", "read a/b and Foo/Bar")
